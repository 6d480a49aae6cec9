"""Is a checkpoint file whole? Checked before a resume starts, without torch.

``torch.save`` writes a zip archive: a pickle (``<name>/data.pkl``) holding the structure and
one record per tensor, each with its CRC-32, and the archive's directory at the very end. A
checkpoint cut short (a copy that stopped, a full disk outside gputui's atomic writes) has no
directory; garbage is no archive; a flipped bit fails its record's CRC; a pickle cut short
has no STOP. :func:`problem` finds each of these by reading the file once, as data (nothing is
unpickled), so ``gputui resume`` refuses a damaged checkpoint in one line before a run folder
exists, rather than a training process failing on it after its launch. Torch-free.
"""

from __future__ import annotations

import os
import pickletools
import zipfile
import zlib
from pathlib import Path

from gputui.core import safeio

# keys every gputui checkpoint's top-level dict holds (train/checkpoint.py's ``save``)
KEYS = ("format", "position", "state", "rng")
_CHUNK = 1 << 20


def problem(path: str | Path) -> str | None:
    """None when ``path`` is a whole checkpoint as gputui writes them, else why not: one
    clause without the path (the caller names the file and the fix)."""
    try:
        fd = safeio.open_regular(path)
    except OSError as exc:
        return f"cannot be read ({safeio.reason(exc)})"
    with os.fdopen(fd, "rb") as fh:
        try:
            with zipfile.ZipFile(fh) as archive:
                return _archive_problem(archive)
        except zipfile.BadZipFile:
            return ("is not a whole checkpoint: it was cut short (a copy or a write that "
                    "stopped) or is not a checkpoint at all")
        except (OSError, EOFError, ValueError, NotImplementedError, zlib.error):
            return ("is damaged: its records are not where its index says (bytes were lost "
                    "or added)")


def _archive_problem(archive: zipfile.ZipFile) -> str | None:
    pickles = [i for i in archive.infolist() if i.filename.rsplit("/", 1)[-1] == "data.pkl"]
    if len(pickles) != 1:
        return "is a zip archive but not a torch checkpoint (it holds no data.pkl)"
    for info in archive.infolist():
        if info.is_dir():
            continue
        bad = _record_problem(archive, info)
        if bad:
            return bad
    return _pickle_problem(archive.read(pickles[0]))


def _record_problem(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> str | None:
    """Read one record through, which checks its CRC-32 (torch may be told to write none:
    then its CRC is 0 and only its length is checked)."""
    if info.CRC == 0 and info.file_size:
        with archive.open(info) as fh, _no_crc(fh):
            return _read_through(fh, info)
    with archive.open(info) as fh:
        return _read_through(fh, info)


def _read_through(fh, info: zipfile.ZipInfo) -> str | None:
    try:
        while fh.read(_CHUNK):
            pass
    except zipfile.BadZipFile:
        return f"is damaged: its record {info.filename} does not match its checksum"
    except EOFError:
        return f"is damaged: its record {info.filename} is cut short"
    return None


class _no_crc:
    """Turn off the CRC check of one open record (its CRC field was not written)."""

    def __init__(self, fh):
        self.fh = fh

    def __enter__(self):
        self.fh._expected_crc = None
        return self.fh

    def __exit__(self, *exc):
        return False


def _pickle_problem(data: bytes) -> str | None:
    """The pickle parses to its end (as opcodes: nothing is built or run) and names the keys
    of a gputui checkpoint."""
    strings: set[str] = set()
    try:
        for op, arg, _ in pickletools.genops(data):
            if isinstance(arg, str) and op.name in ("BINUNICODE", "SHORT_BINUNICODE", "UNICODE",
                                                    "BINUNICODE8"):
                strings.add(arg)
    except Exception:  # noqa: BLE001 - genops raises ValueError, struct.error, ... on garbage
        return "is damaged: its data.pkl is cut short or not a pickle"
    missing = [k for k in KEYS if k not in strings]
    if missing:
        return (f"is a torch file but not a gputui checkpoint (it has no "
                f"{', '.join(missing)})")
    return None
