"""Finding a run or a sweep from what a user types: the whole id, or any unique part of it.

Every command that takes a run id (``compare``, ``resume``) or a sweep id (``compare --sweep``,
``sweep --resume``) resolves it here, so ``gputui compare 060104`` and ``gputui compare
quickstart`` (when one run's id holds it) work everywhere alike. A part that several ids hold
is refused with one line naming them. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from gputui.core import runstore

SHOWN = 6  # candidates named in an "ambiguous" line; the rest are counted


def match_id(ref: str, ids: list[str], what: str, where: str) -> str:
    """The one id of ``ids`` that is ``ref`` or holds it; LookupError (one line) when none does
    or several do. ``what`` ("run", "sweep") and ``where`` (the folder) word the error."""
    if not ref.strip():  # "" is part of every id: it names none
        raise LookupError(f"an empty {what} id names no {what}; "
                          + ("see `gputui runs` for the ids" if what == "run"
                             else f"known: {', '.join(ids) or 'none'}"))
    if ref in ids:
        return ref
    hits = [i for i in ids if ref and ref in i]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        hint = ("see `gputui runs` for the ids" if what == "run"
                else f"known: {', '.join(ids) or 'none'}")
        raise LookupError(f"no {what} '{ref}' under {where}; {hint}")
    names = ", ".join(hits[:SHOWN]) + (f" and {len(hits) - SHOWN} more" if len(hits) > SHOWN
                                       else "")
    raise LookupError(f"{what} '{ref}' is ambiguous: {len(hits)} {what}s match ({names}); "
                      f"give more of the id")


def find_run(ref: str, runs_dir: str | Path | None = None) -> Path:
    """A run folder from a path to one, its id, or a unique part of its id; LookupError
    otherwise."""
    path = Path(ref)
    if runstore.is_run_folder(path):
        return path
    base = Path(runs_dir) if runs_dir else runstore.default_runs_dir()
    try:
        ids = [p.name for p in runstore.run_folders(base)]
    except OSError as exc:
        raise LookupError(f"cannot list the runs folder {base} ({exc})") from None
    try:
        return base / match_id(ref, ids, "run", str(base))
    except LookupError:
        # no run holds it (an ambiguous part stays that): it may name a sweep
        sweep = None if any(ref in i for i in ids) else _sweep_named(ref, base)
        if sweep is None:
            raise
        raise LookupError(f"'{ref}' is a sweep, not a run: `gputui sweep --resume {sweep}` "
                          f"continues it, `gputui compare --sweep {sweep}` compares its "
                          f"runs") from None


def _sweep_named(ref: str, runs_dir: Path) -> str | None:
    """The one sweep whose id is or holds ``ref`` (None: none or several), for a run id
    that names a sweep instead."""
    try:
        return find_sweep(ref, runs_dir) if ref.strip() else None
    except LookupError:
        return None


def sweep_ids(runs_dir: Path) -> list[str]:
    """The ids of the sweeps whose manifests lie under ``runs_dir``/sweeps, newest first."""
    folder = Path(runs_dir) / "sweeps"
    try:
        names = sorted(folder.iterdir(), reverse=True) if folder.is_dir() else []
    except OSError:
        return []
    return [p.stem for p in names if p.suffix == ".json" and not p.name.startswith(".")]


def find_sweep(ref: str, runs_dir: Path) -> str:
    """The full id of the sweep ``ref`` names (its id or a unique part); LookupError
    otherwise."""
    return match_id(ref, sweep_ids(runs_dir), "sweep", f"{runs_dir}/sweeps")
