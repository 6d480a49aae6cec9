"""Readers for the real datasets' file formats: IDX (MNIST, Fashion-MNIST) and CIFAR-10's
python batches, in torchvision's folder layout.

They are written here, not taken from torchvision, because torchvision's wheels are built
against one torch build: the registry's torchvision does not import beside a CPU-only torch,
which is what machines without a GPU run. These readers need only numpy, check every header
and size, and raise :class:`FormatError` with one line naming the file when it is damaged.
CIFAR's batches are pickles, so they are opened with an unpickler that admits only the
numpy types the format uses: a crafted file cannot make gputui run code.
"""

from __future__ import annotations

import codecs
import gzip
import pickle
import zlib
from pathlib import Path

import numpy as np

try:  # numpy 2 moved the pickling helpers; files written by numpy 1 name the old module
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1
    # the same function from its numpy 1 home; mypy sees one name bound twice
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]

# IDX type codes (the third byte of the magic number) and their big-endian numpy dtypes.
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class FormatError(ValueError):
    """A dataset file that is not what its name says; the message is one line."""


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file as a numpy array of its declared shape and type."""
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":  # decompressed in memory: reading never writes beside the file
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise FormatError(f"{path}: not a readable gzip file ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise FormatError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise FormatError(f"{path}: truncated IDX header")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise FormatError(f"{path}: IDX data is {len(raw) - header} bytes, the header "
                          f"{shape} says {expected - header}; the file is damaged")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def read_idx_pair(images: str | Path, labels: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Images [N, H, W] uint8 and labels [N] of one split, checked against each other."""
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or y.ndim != 1:
        raise FormatError(f"{images}: expected images [N, H, W] and labels [N], got "
                          f"{list(x.shape)} and {list(y.shape)}")
    if len(x) != len(y):
        raise FormatError(f"{images}: {len(x)} images but {len(y)} labels in {labels}")
    return x, y.astype(np.int64)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Admits the few globals a CIFAR batch needs, nothing else."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"): _reconstruct,
               ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
               ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
               # protocol 2 stores an array's bytes as latin-1 text decoded by this
               ("_codecs", "encode"): codecs.encode}

    def find_class(self, module: str, name: str):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing {module}.{name}") from None


def read_cifar_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch: images [N, 3, 32, 32] uint8 and labels [N]."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            entry = _NumpyOnlyUnpickler(fh, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise FormatError(f"{path}: not a CIFAR-10 python batch ({exc})") from None
    if not isinstance(entry, dict) or "data" not in entry:
        raise FormatError(f"{path}: not a CIFAR-10 python batch (no 'data' entry)")
    data = np.asarray(entry["data"], dtype=np.uint8)
    labels = np.asarray(entry.get("labels", entry.get("fine_labels", [])), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
        raise FormatError(f"{path}: expected {len(labels)} rows of 3072 bytes, got "
                          f"{list(data.shape)}")
    return data.reshape(-1, 3, 32, 32), labels
