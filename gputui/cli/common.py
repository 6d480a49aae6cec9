"""What every ``gputui`` subcommand shares: exit statuses, the parser with one-line errors, the
one-line failure, and the check of the runs folder. A leaf: the command modules import it, and
it imports none of them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with each flag's default shown where there is one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        # a help that already speaks of its default ("(default)", "(default ./runs or ...)")
        # is not given a second one
        if (action.option_strings and "(default" not in text and default is not None
                and default is not False and default != [] and default is not argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) instead of a usage dump, and defaults in --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def finite(text: str) -> float:
    """An argparse type: a number, refusing inf and nan (float() reads both, and a target or a
    time limit of either is never met)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give one like 2.5")
    return value


def fail(message: str) -> int:
    """Print a one-line usage error and return exit status 2."""
    from gputui.core.errors import printable

    print(f"gputui: error: {printable(message)}", file=sys.stderr)
    return EXIT_USAGE


def runs_dir_problem(runs_dir: str | None) -> str | None:
    """Why run records cannot be written under ``runs_dir`` (the default when None), as one
    line naming the flag, or None."""
    from gputui.core.filewrite import folder_problem
    from gputui.core.runstore import default_runs_dir

    if runs_dir:
        return folder_problem(runs_dir, "--runs-dir")
    return folder_problem(default_runs_dir(), "the runs folder")


def set_overrides(sets: list[str], epochs: int | None = None) -> list:
    """--set TABLE.KEY=VALUE flags (and --epochs) as (source, key, value) overrides."""
    from gputui.core.config import parse_assignment

    out = []
    for text in sets:
        key, value = parse_assignment(text)
        out.append((f"--set {text}", key, value))
    if epochs is not None:
        out.append(("--epochs", "run.epochs", epochs))
    return out


def interrupted(signum: int, what: str) -> int:
    """The stop contract's last line, for a command that ended on a stop signal: which
    signal, and what was kept; returns 128 + the signal."""
    import sys

    from gputui.core.signals import describe as signal_words

    try:
        what = what.lstrip()
        sep = "" if what.startswith((":", ",")) else " "
        print(f"gputui: stopped by {signal_words(signum)}{sep}{what}", file=sys.stderr,
              flush=True)
    except (OSError, ValueError):
        pass
    return 128 + signum
