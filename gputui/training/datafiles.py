"""Where real datasets live on disk, checked without importing torch.

The CLI and the TUI call :func:`missing_data` before a run starts, so a missing dataset is
refused with one line saying which files to put where, instead of failing in the child.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

# torchvision's layout: <root>/<folder>/raw/<file>, files as the official mirrors name them.
IDX_FOLDERS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}


def data_root(root: str) -> Path:
    """The configured data.root, or the default under the user's cache dir."""
    from gputui.config_schema import default_data_root

    return Path(root or default_data_root()).expanduser()


def splits_needed(source: str) -> tuple[str, ...]:
    """Which splits a data.source reads: both, or only the test split."""
    return ("test",) if source == "test-split" else ("train", "test")


def idx_raw_folder(root: Path, name: str) -> Path:
    """<root>/MNIST/raw or <root>/FashionMNIST/raw."""
    return root / IDX_FOLDERS[name] / "raw"


def ensure_idx_files(raw: Path, split: str) -> list[str]:
    """Decompress ``.gz`` files already present (a local step, no network); return the names
    still missing."""
    missing = []
    for stem in IDX_FILES[split]:
        plain, packed = raw / stem, raw / f"{stem}.gz"
        if plain.exists():
            continue
        if packed.exists():
            with gzip.open(packed, "rb") as src, open(plain, "wb") as dst:
                shutil.copyfileobj(src, dst)
            continue
        missing.append(f"{stem}.gz")
    return missing


def missing_data(name: str, root: str, source: str = "standard") -> str | None:
    """None when the dataset can be read locally, else one line: which files, where, and how."""
    if name == "synthetic":
        return None
    base = data_root(root)
    if name in IDX_FOLDERS:
        raw = idx_raw_folder(base, name)
        missing = [f for split in splits_needed(source) for f in ensure_idx_files(raw, split)]
        if missing:
            return (f"{name}: missing {', '.join(missing)} in {raw}; put the files there "
                    f"(or set data.root, or data.download = true with internet access)")
        return None
    if name == "cifar10":
        folder = base / CIFAR_FOLDER
        missing = [f for split in splits_needed(source) for f in CIFAR_FILES[split]
                   if not (folder / f).exists()]
        if missing:
            return (f"cifar10: missing {', '.join(missing)} in {folder}; extract "
                    f"cifar-10-python.tar.gz into {base} (or set data.root, or "
                    f"data.download = true with internet access)")
        return None
    return f"unknown dataset {name!r}"
