"""Data of the user's own: what ``data.factory`` returns, and ImageFolder-style folders.

A factory returns ``(train, test)`` (or ``{"train": ..., "test": ..., "num_classes": N}``),
each part an ``(images, labels)`` pair of tensors, a ``TensorDataset`` of the two, or any torch
``Dataset`` of ``(image tensor, label)`` for what does not fit in memory. Tensors become the
usual :class:`~gputui.train.data.Dataset` (indexed on the device per batch); other datasets
become a :class:`SetData`, read through a DataLoader in the same seeded order. Channels and
image size come from the first image; the classes from ``num_classes``, a ``classes``
attribute, or the labels. The data is used as given (no standardisation); integer images
(uint8) are scaled to [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gputui.core.usercode import parse
from gputui.train.userfactory import UserCodeError, call, import_function

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass
class SetData:
    """Train and test torch Datasets that are read lazily (a DataLoader per epoch)."""

    name: str
    train_set: Any
    test_set: Any
    num_classes: int
    in_channels: int
    height: int
    image_size: int  # the width, as Dataset.image_size

    @property
    def n_train(self) -> int:
        return len(self.train_set)

    @property
    def n_test(self) -> int:
        return len(self.test_set)


def load_user_data(data: Any):
    """The Dataset or SetData that ``data.factory`` gives (``data`` is the [data] table)."""
    from gputui.train.dataset import Dataset

    spec = data.factory
    f = parse(spec)
    if f.kind == "imagefolder":
        root = Path(f.target).expanduser()
        train, test = FolderSet(root / "train"), FolderSet(root / "test")
        if test.classes != train.classes:
            raise UserCodeError(f"data.factory '{spec}': test/ has classes {test.classes}, "
                                f"train/ has {train.classes}; give both the same class folders")
        # every image takes the first training image's mode and size
        test.mode, test.size = train.mode, train.size
        got: Any = {"train": train, "test": test}
    elif f.kind == "torchvision":
        raise UserCodeError(f"data.factory '{spec}': name a torchvision dataset through your "
                            f"own factory (returning train and test), or use imagefolder:PATH")
    else:
        fn = import_function("data.factory", spec)
        got = call("data.factory", spec, fn, **dict(data.kwargs))
    train, test, classes = _unpack(spec, got)
    if train is not None and isinstance(train, tuple):
        (tx, ty), (vx, vy) = train, test
        classes = classes or int(max(ty.max(), vy.max() if len(vy) else 0)) + 1
        _check_labels(spec, classes, ty, vy)
        return Dataset(spec, tx, ty, vx, vy, num_classes=classes)
    return _set_data(spec, got, classes)


def _unpack(spec: str, got: Any):
    """(train, test, num_classes) with tensor pairs as (x, y) tuples; lazy sets as is."""
    classes = 0
    if isinstance(got, dict):
        missing = [k for k in ("train", "test") if k not in got]
        if missing:
            raise UserCodeError(f"data.factory '{spec}' returned a dict without "
                                f"{' and '.join(repr(m) for m in missing)}; return "
                                f"{{'train': ..., 'test': ...}}")
        classes = int(got.get("num_classes") or 0)
        got = (got["train"], got["test"])
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise UserCodeError(f"data.factory '{spec}' returned a {type(got).__name__}; return "
                            f"(train, test), each (images, labels) tensors or a torch Dataset")
    if all(isinstance(p, torch.Tensor) for p in got):
        raise UserCodeError(f"data.factory '{spec}' returned one (images, labels) pair; return "
                            f"(train, test), each an (images, labels) pair")
    parts = [_as_tensors(spec, part, which)
             for part, which in zip(got, ("train", "test"), strict=True)]
    if all(p is not None for p in parts):
        return parts[0], parts[1], classes
    return None, None, classes


def _as_tensors(spec: str, part: Any, which: str):
    """(x [N,C,H,W] float, y [N] int64) for tensor pairs and TensorDatasets, else None."""
    if isinstance(part, torch.utils.data.TensorDataset) and len(part.tensors) == 2:
        part = part.tensors
    if not (isinstance(part, (tuple, list)) and len(part) == 2
            and all(isinstance(t, torch.Tensor) for t in part)):
        if isinstance(part, torch.utils.data.Dataset):
            return None
        raise UserCodeError(f"data.factory '{spec}': the {which} part is a "
                            f"{type(part).__name__}; give (images, labels) tensors or a torch "
                            f"Dataset")
    x, y = part
    if x.dim() == 3:
        x = x.unsqueeze(1)  # [N, H, W] grey images
    if x.dim() != 4 or y.dim() != 1 or len(x) != len(y):
        raise UserCodeError(f"data.factory '{spec}': {which} images {list(x.shape)} and labels "
                            f"{list(y.shape)}; give images [N, C, H, W] and labels [N]")
    if y.is_floating_point() or y.dtype == torch.bool:
        raise UserCodeError(f"data.factory '{spec}': {which} labels are {y.dtype}; give class "
                            f"indices (an integer tensor)")
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    return x.contiguous(), y.long()


def _check_labels(spec: str, classes: int, *labels: torch.Tensor) -> None:
    for y in labels:
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= classes):
            raise UserCodeError(f"data.factory '{spec}': labels must lie in 0..{classes - 1}, "
                                f"got {int(y.min())}..{int(y.max())}")


def _set_data(spec: str, got: Any, classes: int) -> SetData:
    train, test = (got["train"], got["test"]) if isinstance(got, dict) else got
    if len(train) == 0 or len(test) == 0:
        raise UserCodeError(f"data.factory '{spec}': the train or test set is empty")
    first = call("data.factory", spec, train.__getitem__, 0)
    if not (isinstance(first, (tuple, list)) and len(first) == 2
            and isinstance(first[0], torch.Tensor) and first[0].dim() == 3):
        raise UserCodeError(f"data.factory '{spec}': a train item is "
                            f"{type(first).__name__}, not (image tensor [C, H, W], label); "
                            f"add a to-tensor transform")
    classes = classes or len(getattr(train, "classes", ()) or ())
    if not classes:
        raise UserCodeError(f"data.factory '{spec}': a Dataset does not say its classes; "
                            f"return {{'train': ..., 'test': ..., 'num_classes': N}}")
    c, h, w = first[0].shape
    return SetData(spec, train, test, classes, int(c), int(h), int(w))


class FolderSet(torch.utils.data.Dataset):
    """Images in class folders (torchvision's ImageFolder layout: classes sorted by name), read
    with Pillow as float tensors in [0, 1]; every image takes the first image's mode (grey or
    RGB) and size."""

    def __init__(self, root: Path):
        if not root.is_dir():
            raise UserCodeError(f"imagefolder: no folder {root}")
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.samples = [(p, i) for i, c in enumerate(self.classes)
                        for p in sorted((root / c).rglob("*"))
                        if p.suffix.lower() in IMAGE_EXTENSIONS]
        if not self.samples:
            raise UserCodeError(f"imagefolder: no images ({', '.join(IMAGE_EXTENSIONS)}) in "
                                f"class folders under {root}")
        from PIL import Image

        with Image.open(self.samples[0][0]) as im:
            self.mode = "L" if im.mode in ("L", "1", "I;16", "I") else "RGB"
            self.size = im.size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import numpy as np
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as opened:
            im = opened.convert(self.mode)
            if im.size != self.size:
                im = im.resize(self.size)
            arr = np.asarray(im, dtype=np.uint8)
        x = torch.from_numpy(arr.copy()).float().div_(255.0)
        return (x.unsqueeze(0) if x.dim() == 2 else x.permute(2, 0, 1)).contiguous(), label
