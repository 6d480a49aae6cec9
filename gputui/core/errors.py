"""Errors meant for the user, and the one way an exception becomes one line.

A :class:`UserError` carries a message written for the user (the key or flag, what is wrong,
the fix): it is shown as it is. Anything else is a fault of gputui, torch or the user's code,
shown as ``Type: first line`` so the type says where it came from. :func:`describe` is that
rule; the CLI prints it after ``gputui: error:`` and exits 2 for a UserError, the run records
it as the reason a run failed, and the app shows it in its status line.
"""

from __future__ import annotations

import re
import unicodedata


class UserError(Exception):
    """Bad input or a state the user can fix; ``str()`` is the whole story, one line.

    Subclasses keep their other base (``ValueError``, ``RuntimeError``, ``OSError``) so the
    callers that catch those keep catching them."""


def first_line(exc: BaseException | str) -> str:
    """The first non-blank line of an exception's message (or of a text), stripped; "" when
    there is none."""
    for line in re.split(r"\r\n|\r|\n", str(exc)):  # not str.splitlines: \x1e is no line end
        if line.strip():
            return line.strip()
    return ""


def fault_line(exc: BaseException) -> str:
    """``Type: first line`` of any exception (just ``Type`` when its message is empty)."""
    first = first_line(exc)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def describe(exc: BaseException) -> str:
    """One line for the user: a :class:`UserError`'s first line as it is, anything else as
    :func:`fault_line` has it."""
    first = first_line(exc)
    return first if isinstance(exc, UserError) and first else fault_line(exc)


def brief(text: str, limit: int = 240) -> str:
    """``text`` when it is at most ``limit`` characters, else its whole sentences (or
    clauses, to "; ") that fit; a text with no sentence end in reach is cut at a word and
    marked " ..." (never silently mid-word)."""
    if len(text) <= limit:
        return text
    cut = max(text.rfind(". ", 0, limit), text.rfind("; ", 0, limit))
    if cut > 0:
        return text[:cut + 1].rstrip(";").rstrip()
    space = text.rfind(" ", 0, limit - 4)
    return text[:space if space > 0 else limit - 4] + " ..."


def printable(text: str) -> str:
    """``text`` safe to print on a terminal as one line: control, format and unpaired
    surrogate characters (what a hostile value may carry: escapes, line separators, bytes that
    were not UTF-8) written as Python escapes, everything else as it is."""
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") and ch != "\t":
            out.append(ascii(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out)
