"""Byte-level text for language modelling: no tokenizer, no download (vocab 256).

Two sources, one shape. ``pystdlib`` is this Python's own standard library source: every
``.py`` file under ``sysconfig``'s stdlib folder, leaving out test suites and installed
packages (any path part ``test``, ``tests``, ``idle_test``, ``site-packages`` or
``dist-packages``), ordered by the SHA-256 of its path relative to that folder (a fixed
shuffle, so the bytes kept span the whole library rather than the modules starting with 'a'),
joined with a newline until :data:`STDLIB_BYTES` bytes (4.5 MiB), the last file cut there.
The same Python version gives the same bytes; another version's library differs slightly,
and the run's log names the version and the text's fingerprint. ``text`` reads the file
``data.path`` names, or every regular file of that folder in sorted path order (hidden names
skipped).

Either text is split once: its first 90 % trains, its last 10 % validates (for pystdlib other
files, by the shuffle). Each split is cut into windows of ``context + 1`` bytes stepping by
``context``: x is a window's first ``context`` bytes and y the same bytes shifted by one (the
next-token targets), as int64 ``[N, context]`` tensors. The unigram baseline is the entropy
of the training split's byte distribution, in nats: the loss of a model that predicts every
byte from its frequency alone.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

import torch

from gputui.train.dataset import DataError, Dataset

VOCAB = 256
STDLIB_BYTES = 4_718_592  # 4.5 MiB: 4.05 MiB trains, 0.45 MiB validates
TEXT_LIMIT = 1 << 30  # a user's text is read into memory: at most 1 GiB
VAL_SHARE = 0.1
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's source files in pystdlib's order (see the module doc)."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP_PARTS]  # never walk into site-packages
        for f in files:
            if f.endswith(".py"):
                rel = (Path(folder) / f).relative_to(root).as_posix()
                found.append((hashlib.sha256(rel.encode()).hexdigest(), root / rel))
    return [p for _, p in sorted(found)]


def stdlib_bytes(budget: int = STDLIB_BYTES) -> bytes:
    """The first ``budget`` bytes of the stdlib files joined by newlines."""
    parts, total = [], 0
    for p in stdlib_files():
        data = p.read_bytes() + b"\n"
        parts.append(data)
        total += len(data)
        if total >= budget:
            break
    text = b"".join(parts)[:budget]
    if len(text) < budget // 2:
        raise DataError(f"pystdlib: only {len(text):,} bytes of Python source under "
                        f"{sysconfig.get_paths()['stdlib']}; use data.name = 'text' with your "
                        f"own data.path")
    return text


def user_bytes(path: str) -> bytes:
    """The text ``data.path`` names: a file, or a folder's files in sorted path order."""
    if not path:
        raise DataError("data.name = 'text' needs data.path: a text file or a folder of them")
    p = Path(path).expanduser()
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and not any(
            part.startswith(".") for part in f.relative_to(p).parts))
    else:
        raise DataError(f"data.path: no file or folder at {p}")
    parts, total = [], 0
    for f in files:
        try:
            data = f.read_bytes()
        except OSError as exc:
            raise DataError(f"data.path: cannot read {f} ({exc.strerror})") from None
        total += len(data)
        if total > TEXT_LIMIT:
            raise DataError(f"data.path: {p} holds more than {TEXT_LIMIT >> 20} MiB of text; "
                            f"point it at a smaller file or folder")
        parts.append(data)
    return b"".join(parts)


def fingerprint(text: bytes) -> str:
    """A short name for exactly these bytes (the log says which text trained)."""
    return hashlib.sha256(text).hexdigest()[:12]


def windows(tokens: torch.Tensor, context: int, cap: int = 0) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """(x, y) windows of ``context`` tokens stepping by ``context``, y shifted by one; at
    most ``cap`` of them (0 = all)."""
    n = (len(tokens) - 1) // context
    if cap:
        n = min(n, cap)
    x = tokens[:n * context].view(n, context)
    y = tokens[1:n * context + 1].view(n, context)
    return x.long(), y.long()


def unigram_entropy(tokens: torch.Tensor) -> float:
    """Entropy of the byte distribution of ``tokens``, in nats."""
    counts = torch.bincount(tokens.long().flatten(), minlength=VOCAB).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def load_text(name: str, path: str, context: int, train_size: int = 0,
              test_size: int = 0) -> Dataset:
    """The text dataset ``data.name`` names (pystdlib or text), as windows (module doc)."""
    raw = stdlib_bytes() if name == "pystdlib" else user_bytes(path)
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    cut = int(len(tokens) * (1 - VAL_SHARE))
    train_tok, val_tok = tokens[:cut], tokens[cut:]
    for split, part in (("training", train_tok), ("validation", val_tok)):
        if len(part) < context + 1:
            where = "pystdlib" if name == "pystdlib" else f"data.path {path}"
            raise DataError(f"{where}: its {split} split has {len(part):,} bytes, fewer than one "
                            f"window of data.context + 1 = {context + 1}; lower data.context "
                            f"or give more text")
    tx, ty = windows(train_tok, context, train_size)
    vx, vy = windows(val_tok, context, test_size)
    baseline = unigram_entropy(train_tok[:len(tx) * context + 1])
    where = (f"Python {sys.version_info.major}.{sys.version_info.minor} standard library"
             if name == "pystdlib" else str(Path(path).expanduser()))
    source = f"{where}, {len(raw):,} bytes (sha256 {fingerprint(raw)})"
    return Dataset(name, tx, ty, vx, vy, num_classes=VOCAB, task="lm", baseline=baseline,
                   source=source)
