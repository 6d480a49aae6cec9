"""Where real datasets live on disk, checked without importing torch and without writing.

Every run checks :func:`data_problem` before it starts (``gputui.runs.prepare``), so a missing
dataset, or sizes the dataset cannot give, are refused with one line naming the fix, instead
of failing in the child. Nothing here changes the disk: ``.gz`` files are read as they are.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from gputui.core.config_schema import default_data_root

# torchvision's layout: <root>/<folder>/raw/<file>, files as the official mirrors name them.
IDX_FOLDERS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
CIFAR_PER_FILE = 10_000
# Where the files can be fetched by hand (the mirrors torchvision's downloader uses).
SOURCES = {
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "cifar10": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
}
SYNTHETIC_SIZES = {"train": 12_000, "test": 2_000}  # data.train_size/test_size = 0
OTHER_WAYS = ("or set data.root to the folder holding them, or data.download = true with "
              "internet access, or train on the embedded task with --set data.name=synthetic")


def data_root(root: str) -> Path:
    """The configured data.root, or the default under the user's cache dir."""
    return Path(root or default_data_root()).expanduser()


def splits_needed(source: str) -> tuple[str, ...]:
    """Which splits a data.source reads: both, or only the test split."""
    return ("test",) if source == "test-split" else ("train", "test")


def idx_raw_folder(root: Path, name: str) -> Path:
    """<root>/MNIST/raw or <root>/FashionMNIST/raw."""
    return root / IDX_FOLDERS[name] / "raw"


def idx_path(raw: Path, stem: str) -> Path | None:
    """The file holding ``stem``: the plain file, else its ``.gz``, else None."""
    for path in (raw / stem, raw / f"{stem}.gz"):
        if path.is_file():
            return path
    return None


def _missing(name: str, base: Path, split: str) -> list[str]:
    if name in IDX_FOLDERS:
        raw = idx_raw_folder(base, name)
        return [f"{stem}.gz" for stem in IDX_FILES[split] if idx_path(raw, stem) is None]
    folder = base / CIFAR_FOLDER
    return [f for f in CIFAR_FILES[split] if not (folder / f).is_file()]


def missing_data(name: str, root: str, source: str = "standard") -> str | None:
    """None when the dataset can be read locally, else one line: which files, where, and how
    to get them (or what to run instead)."""
    if name == "synthetic":
        return None
    if name not in SOURCES:
        return f"unknown dataset {name!r}"
    base = data_root(root)
    missing = {split: _missing(name, base, split) for split in splits_needed(source)}
    files = [f for split in missing.values() for f in split]
    if not files:
        return None
    where = idx_raw_folder(base, name) if name in IDX_FOLDERS else base / CIFAR_FOLDER
    if name in IDX_FOLDERS:
        get = f"download them from {SOURCES[name]} into that folder"
    else:
        get = f"extract {SOURCES[name]} into {base}"
    hint = ""
    if source == "standard" and missing["train"] and not missing["test"]:
        hint = (" (the test split is there: --set data.source=test-split trains and tests on "
                "parts of it)")
    return f"{name}: missing {', '.join(files)} in {where}{hint}; {get}, {OTHER_WAYS}"


def idx_count(path: Path) -> int:
    """The number of items an IDX file declares (its header only, read without writing)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            head = fh.read(8)
    except (OSError, EOFError):
        return -1  # unreadable: the reader names the damage when the run loads it
    return int.from_bytes(head[4:8], "big") if len(head) == 8 else -1


def split_size(name: str, base: Path, split: str) -> int:
    """Examples in one split of a dataset present on disk (-1 when it cannot be told)."""
    if name in IDX_FOLDERS:
        path = idx_path(idx_raw_folder(base, name), IDX_FILES[split][1])
        return idx_count(path) if path else -1
    return CIFAR_PER_FILE * len(CIFAR_FILES[split])


def size_problem(name: str, root: str, source: str, train_size: int, test_size: int,
                 batch_size: int) -> str | None:
    """Sizes the dataset cannot give (data.train_size, data.test_size, optim.batch_size)."""
    if name == "synthetic":
        n_train = train_size or SYNTHETIC_SIZES["train"]
    elif source == "test-split":
        n = split_size(name, data_root(root), "test")
        if n < 0:
            return None
        n_train = train_size or int(0.8 * n)
        n_test = test_size or n - n_train
        if n_test <= 0 or n_train + n_test > n:
            return (f"data.train_size + data.test_size ({n_train} + {max(n_test, 0)}) exceed "
                    f"the {n} examples of {name}'s test split (data.source = test-split); "
                    f"lower them, e.g. --set data.train_size={int(0.8 * n)} "
                    f"--set data.test_size={n - int(0.8 * n)}")
    else:
        base = data_root(root)
        sizes = {split: split_size(name, base, split) for split in ("train", "test")}
        for split, wanted in (("train", train_size), ("test", test_size)):
            if sizes[split] >= 0 and wanted > sizes[split]:
                return (f"data.{split}_size ({wanted}) exceeds the {sizes[split]} examples of "
                        f"{name}'s {split} split; lower it (0 = all)")
        n_train = train_size or sizes["train"]
        if n_train < 0:
            return None
    if batch_size > n_train:
        return (f"optim.batch_size ({batch_size}) is larger than the training set ({n_train} "
                f"examples); lower it or raise data.train_size")
    return None


def data_problem(cfg) -> str | None:
    """Why a RunConfig's data cannot be had as configured (missing files, impossible sizes),
    or None. With data.download = true, missing files are left to the download."""
    d = cfg.data
    if getattr(d, "factory", ""):  # the user's data: their code reads it in the training process
        return None
    if d.name == "text":  # read in the training process; its size is known here
        return text_problem(d.path, d.context)
    if d.name == "pystdlib":  # read in the training process
        return None
    problem = missing_data(d.name, d.root, d.source)
    if problem:
        return None if d.download else problem
    return size_problem(d.name, d.root, d.source, d.train_size, d.test_size,
                        cfg.optim.batch_size)


TEXT_VAL_SHARE = 0.1  # as gputui.train.text.VAL_SHARE: the text's last tenth validates


def _kind(mode: int) -> str:
    import stat

    for test, words in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a fifo (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def text_bytes(path: str) -> tuple[int, str | None]:
    """The bytes of text ``data.path`` names (a file, or a folder's visible files, as
    ``gputui.train.text.user_bytes`` reads them), from their sizes alone; (0, why) when it
    names no file or folder of text."""
    import os

    p = Path(path).expanduser()
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return 0, f"data.path: no file or folder at {p}"
    import stat

    if stat.S_ISREG(mode):
        return p.stat().st_size, None
    if not stat.S_ISDIR(mode):
        return 0, (f"data.path: {p} is {_kind(mode)}, not a text file or folder; point it at "
                   f"a text file or a folder of them")
    total = 0
    for f in p.rglob("*"):
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts):
            total += f.stat().st_size
    return total, None


def text_problem(path: str, context: int) -> str | None:
    """Why the text ``data.path`` names cannot train as configured (it is no file or folder,
    it is empty, a split is shorter than one window), or None."""
    if not path:
        return None  # plan's rule: data.name = 'text' needs data.path
    total, why = text_bytes(path)
    if why:
        return why
    if total == 0:
        return f"data.path {path} is empty (0 bytes of text); point it at a file with text in it"
    cut = int(total * (1 - TEXT_VAL_SHARE))
    for split, size in (("training", cut), ("validation", total - cut)):
        if size < context + 1:
            return (f"data.path {path}: its {split} split has {size:,} bytes, fewer than one "
                    f"window of data.context + 1 = {context + 1}; lower data.context or give "
                    f"more text")
    return None


def text_windows(total: int, context: int, train_size: int = 0) -> int:
    """Training windows of ``total`` bytes of text (``gputui.train.text.windows``)."""
    n = max(0, (int(total * (1 - TEXT_VAL_SHARE)) - 1) // max(context, 1))
    return min(n, train_size) if train_size else n
