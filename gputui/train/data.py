"""Datasets and batches: the embedded synthetic task and real sets in torchvision's layout.

Small datasets are held as tensors (on the training device) and indexed per batch; large ones
go through a DataLoader. Either way the batch order comes from one seeded permutation per
epoch, so every strategy sees the same global batches as ``single`` does.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from gputui.core import datafiles
from gputui.core.config_schema import TEXT_DATASETS
from gputui.core.errors import first_line
from gputui.train import readers, synthetic
from gputui.train.dataset import DataError, Dataset  # noqa: F401 - also this module's API

SYNTHETIC_TRAIN = datafiles.SYNTHETIC_SIZES["train"]
SYNTHETIC_TEST = datafiles.SYNTHETIC_SIZES["test"]
TENSOR_LIMIT_BYTES = 2 * 1024**3
SHUFFLE_COPY_LIMIT = 1024**3  # TensorBatches: above this, gather per batch (no second copy)


def load_from_config(data) -> "Dataset":
    """The dataset the [data] table names: ``data.factory`` (the user's, see userdata) when
    set, else the built-in ``data.name``."""
    if data.factory:
        from gputui.train.userdata import load_user_data

        return load_user_data(data)
    if data.name in TEXT_DATASETS:
        from gputui.train.text import load_text

        return load_text(data.name, data.path, data.context, data.train_size, data.test_size)
    return load_dataset(data.name, data.root, data.download, data.train_size, data.test_size,
                        data.source)


def load_dataset(name: str, root: str = "", download: bool = False, train_size: int = 0,
                 test_size: int = 0, source: str = "standard") -> Dataset:
    """Load (or generate) a dataset as float tensors [N, C, H, W] and int64 labels."""
    if name == "synthetic":
        train = synthetic.generate(train_size or SYNTHETIC_TRAIN, seed=0)
        test = synthetic.generate(test_size or SYNTHETIC_TEST, seed=1)
    else:
        problem = datafiles.missing_data(name, root, source)
        if problem and download:
            _download(name, root)
            problem = datafiles.missing_data(name, root, source)
        if problem:
            raise DataError(problem)
        reader = _read_idx if name in datafiles.IDX_FOLDERS else _read_cifar
        base = datafiles.data_root(root)
        if source == "test-split":
            x, y = reader(base, name, "test")
            train, test = _carve(x, y, train_size, test_size)
        else:
            train = _cap(*reader(base, name, "train"), train_size)
            test = _cap(*reader(base, name, "test"), test_size)
    return _standardise(name, train, test)


def _cap(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (x[:n], y[:n]) if n else (x, y)


def _carve(x: torch.Tensor, y: torch.Tensor, n_train: int, n_test: int):
    """Split one set into disjoint train and held-out parts by a fixed permutation."""
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    n_train = n_train or int(0.8 * len(x))
    n_test = n_test or len(x) - n_train
    if n_train + n_test > len(x):
        raise DataError(f"data.train_size + data.test_size ({n_train} + {n_test}) exceed the "
                        f"{len(x)} examples of the test split; lower them")
    tr, te = perm[:n_train], perm[n_train:n_train + n_test]
    return (x[tr], y[tr]), (x[te], y[te])


def _standardise(name: str, train, test) -> Dataset:
    (tx, ty), (vx, vy) = train, test
    dims = (0, 2, 3)
    mean, std = tx.mean(dim=dims, keepdim=True), tx.std(dim=dims, keepdim=True).clamp_min(1e-6)
    return Dataset(name, ((tx - mean) / std).contiguous(), ty.long(),
                   ((vx - mean) / std).contiguous(), vy.long())


def _read_idx(base, name: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    raw = datafiles.idx_raw_folder(base, name)
    images, labels = (datafiles.idx_path(raw, stem) or raw / stem
                      for stem in datafiles.IDX_FILES[split])
    try:
        x, y = readers.read_idx_pair(images, labels)
    except readers.FormatError as exc:
        raise DataError(f"{name}: {exc}; replace the file") from None
    except OSError as exc:
        raise DataError(f"{name}: cannot read {images} ({exc.strerror})") from None
    return torch.from_numpy(x.copy()).unsqueeze(1).float().div_(255.0), torch.from_numpy(y)


def _read_cifar(base, name: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    folder = base / datafiles.CIFAR_FOLDER
    xs, ys = [], []
    for fname in datafiles.CIFAR_FILES[split]:
        try:
            x, y = readers.read_cifar_batch(folder / fname)
        except readers.FormatError as exc:
            raise DataError(f"cifar10: {exc}; replace the file") from None
        except OSError as exc:
            raise DataError(f"cifar10: cannot read {folder / fname} ({exc.strerror})") from None
        xs.append(x)
        ys.append(y)
    images = torch.from_numpy(np.concatenate(xs)).float().div_(255.0)
    return images, torch.from_numpy(np.concatenate(ys))


def _download(name: str, root: str) -> None:
    """Fetch a missing dataset with torchvision's downloader (only when data.download asks)."""
    base = str(datafiles.data_root(root))
    try:
        from torchvision import datasets
    except Exception as exc:  # noqa: BLE001 - e.g. a CUDA torchvision beside a CPU-only torch
        first = first_line(exc) or type(exc).__name__
        raise DataError(f"{name}: data.download needs torchvision, which cannot be imported "
                        f"here ({first}); put the files in {base} by hand") from None
    cls = {"mnist": datasets.MNIST, "fashion-mnist": datasets.FashionMNIST,
           "cifar10": datasets.CIFAR10}[name]
    try:
        for train in (True, False):
            cls(base, train=train, download=True)
    except Exception as exc:  # noqa: BLE001 - any network/IO failure becomes one line
        first = first_line(exc) or type(exc).__name__
        raise DataError(f"{name}: download into {base} failed ({first}); put the files there "
                        f"by hand (see `gputui run --help`)") from None


# ------------------------------------------------------------------ batches

def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The batch order of one epoch: a function of (seed, epoch, n) only."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class TensorBatches:
    """Global batches out of tensors that live on ``device`` (no per-step loader).

    Each epoch gathers the whole set into its shuffled order once (two gathers per epoch into
    buffers reused from epoch to epoch), and the batches are views of that copy: a step pays
    no slicing of the permutation and no gathers. A set larger than ``SHUFFLE_COPY_LIMIT``
    is gathered per batch instead, so its memory is not doubled."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int,
                 device: torch.device | str = "cpu", channels_last: bool = False):
        self.x, self.y = x.to(device), y.to(device)
        self.device = torch.device(device)
        # run.channels_last: each epoch's copy (or each batch) in channels_last, once
        self.format = (torch.channels_last if channels_last and x.dim() == 4
                       else torch.contiguous_format)
        self.batch_size, self.seed = batch_size, seed
        self.steps_per_epoch = len(x) // batch_size  # the last partial batch is dropped
        n = self.steps_per_epoch * batch_size
        self.copy = self.x.element_size() * self.x[:n].nelement() <= SHUFFLE_COPY_LIMIT
        self._bufs: tuple[torch.Tensor, torch.Tensor] | None = None

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's batches from step ``start`` (0-based) on; the order is a function of
        (seed, epoch) only, so a resumed epoch continues with the same batches."""
        b, steps = self.batch_size, self.steps_per_epoch
        perm = epoch_permutation(len(self.x), self.seed, epoch).to(self.device)
        perm = perm[start * b:steps * b]
        if not self.copy:
            return ((self.x[idx].contiguous(memory_format=self.format), self.y[idx])
                    for idx in perm.split(b))
        n = len(perm)
        if self._bufs is None:
            self._bufs = (self.x.new_empty((steps * b, *self.x.shape[1:])),
                          self.y.new_empty((steps * b, *self.y.shape[1:])))
        bx, by = self._bufs[0][:n], self._bufs[1][:n]
        torch.index_select(self.x, 0, perm, out=bx)
        torch.index_select(self.y, 0, perm, out=by)
        return zip(bx.contiguous(memory_format=self.format).split(b), by.split(b), strict=True)


class LoaderBatches:
    """The same global batches through torch's DataLoader (for sets too large to hold)."""

    def __init__(self, x, y: torch.Tensor | None, batch_size: int, seed: int,
                 device: torch.device | str = "cpu", workers: int = 0,
                 channels_last: bool = False):
        # x and y tensors, or (y None) any torch Dataset of (x, y) items
        self.dataset = torch.utils.data.TensorDataset(x, y) if y is not None else x
        self.format = (torch.channels_last if channels_last and getattr(x, "dim", lambda: 0)()
                       == 4 else torch.contiguous_format)
        self.device = torch.device(device)
        self.batch_size, self.seed, self.workers = batch_size, seed, workers
        self.steps_per_epoch = len(self.dataset) // batch_size

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        b = self.batch_size
        order = epoch_permutation(len(self.dataset), self.seed, epoch)[start * b:].tolist()
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=self.batch_size, sampler=order, drop_last=True,
            num_workers=self.workers, pin_memory=self.device.type == "cuda")
        for xb, yb in loader:
            yield (xb.to(self.device, non_blocking=True).contiguous(memory_format=self.format),
                   yb.to(self.device, non_blocking=True))


def make_batches(ds: Dataset, batch_size: int, seed: int, device, loader: str = "auto",
                 workers: int = 0, channels_last: bool = False):
    """Pick tensors or a DataLoader ("auto": tensors below 2 GiB); a user's lazy Dataset
    always goes through a DataLoader; ``channels_last`` gives image batches in that memory
    format (run.channels_last)."""
    if batch_size > ds.n_train:
        raise DataError(f"optim.batch_size ({batch_size}) is larger than the training set "
                        f"({ds.n_train} examples); lower it or raise data.train_size")
    if not isinstance(ds, Dataset):  # userdata.SetData
        return LoaderBatches(ds.train_set, None, batch_size, seed, device, workers)
    size = ds.train_x.element_size() * ds.train_x.nelement()
    if loader == "tensors" or (loader == "auto" and size < TENSOR_LIMIT_BYTES):
        return TensorBatches(ds.train_x, ds.train_y, batch_size, seed, device, channels_last)
    return LoaderBatches(ds.train_x, ds.train_y, batch_size, seed, device, workers,
                         channels_last)


def eval_batches(ds: Dataset, batch_size: int,
                 device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The test set in order, in batches, moved to ``device``."""
    if not isinstance(ds, Dataset):  # userdata.SetData: read through a DataLoader
        loader = torch.utils.data.DataLoader(ds.test_set, batch_size=batch_size)
        for xb, yb in loader:
            yield xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        return
    for i in range(0, len(ds.test_x), batch_size):
        yield (ds.test_x[i:i + batch_size].to(device, non_blocking=True),
               ds.test_y[i:i + batch_size].to(device, non_blocking=True))
