"""What a run's quality is measured by, as every table, line and panel names it.

A run's task is "classify" (images: test accuracy) or "lm" (language modelling on byte
text: validation loss in nats per token, its perplexity, and tokens/s beside samples/s). The
record says which (``task`` in init_done, epoch_end and the summary), so nothing guesses: a
table holding both kinds shows both columns, each row filling its own, and a table of one
kind shows only that kind's. Torch-free.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from gputui.core.events import acc_text

TASKS = ("classify", "lm")
LM_COLUMNS = ("val_loss", "val_ppl")
HEADERS = {"task": "task", "val_loss": "val loss", "val_ppl": "val ppl",
           "tokens_per_s": "tokens/s", "baseline_loss": "unigram"}


def perplexity(loss: float | None) -> float | None:
    """exp(loss), the perplexity of a mean loss per token in nats (inf past float range)."""
    if loss is None or loss != loss:
        return None
    return math.exp(loss) if loss < 700 else math.inf


def score_label(task: str) -> str:
    """What a run's score is called: "test acc" or "val loss / ppl"."""
    return "val loss / ppl" if task == "lm" else "test acc"


def score_text(task: str, test_acc: float | None, val_loss: float | None) -> str:
    """The score as a line shows it: "test acc 95.12%" or "val loss 2.314 / ppl 10.11"."""
    if task == "lm":
        if val_loss is None:
            return "val loss -"
        return f"val loss {val_loss:.4f} / ppl {perplexity(val_loss):,.2f}"
    return f"test acc {acc_text(test_acc) if test_acc is not None else '-'}"


def speed_text(samples_per_s: float, tokens_per_s: float | None) -> str:
    """"1,234 samples/s", with ", 157,952 tokens/s" for a language model."""
    tokens = f", {tokens_per_s:,.0f} tokens/s" if tokens_per_s else ""
    return f"{samples_per_s:,.0f} samples/s{tokens}"


def _task(row: Any) -> str:
    value = row.get("task") if isinstance(row, dict) else getattr(row, "task", None)
    return value or "classify"


def columns_for(columns: Iterable[str], rows: Iterable[Any]) -> tuple[str, ...]:
    """``columns`` for these rows (dicts or objects with ``task``): "test_acc" stays where a
    row classifies, val_loss and val_ppl join it where a row models language, and tokens/s
    follows samples/s then. No rows: the columns as given."""
    columns = tuple(columns)
    tasks = {_task(r) for r in rows}
    if not tasks or "lm" not in tasks:
        return columns
    out: list[str] = []
    for c in columns:
        if c == "test_acc":
            out += (["test_acc"] if "classify" in tasks else []) + list(LM_COLUMNS)
        elif c == "samples_per_s":
            out += [c, "tokens_per_s"]
        else:
            out.append(c)
    return tuple(out)


def score_cell(task: str, test_acc: float | None, val_loss: float | None) -> str:
    """One cell that says which score it holds: "95.12%" (test acc) or "loss 2.3145 (ppl
    10.12)" (a language model's validation loss)."""
    if task == "lm":
        return "-" if val_loss is None else f"loss {val_loss:.4f} (ppl {perplexity(val_loss):,.2f})"
    return "-" if test_acc is None or test_acc != test_acc else acc_text(test_acc)


def fmt(key: str, value: Any) -> str | None:
    """A score column's cell as text; None for a key that is not one of them."""
    if key not in HEADERS:
        return None
    if value is None or value == "":
        return "-"
    if key in ("val_loss", "baseline_loss"):
        return f"{value:.4f}"
    if key == "val_ppl":
        return f"{value:,.2f}"
    if key == "tokens_per_s":
        return f"{value:,.0f}"
    return str(value)
