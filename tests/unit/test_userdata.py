"""The user's factories in the training process: what data.factory may return, image folders,
torchvision models adapted to the data, and one line for every way a factory can fail."""

from __future__ import annotations

import sys
import textwrap
import types

import pytest
import torch
from torch import nn

from gputui.core.config import RunConfig, apply_overrides
from gputui.train.data import Dataset, eval_batches, make_batches
from gputui.train.userdata import SetData, load_user_data
from gputui.train.userfactory import UserCodeError, adapt_input_channels, build_model


def data_section(spec: str, **kwargs):
    return apply_overrides(RunConfig(), [("t", "data.factory", spec),
                                         ("t", "data.kwargs", kwargs)]).data


def model_section(spec: str, **kwargs):
    return apply_overrides(RunConfig(), [("t", "model.factory", spec),
                                         ("t", "model.kwargs", kwargs)]).model


@pytest.fixture
def code(tmp_path, monkeypatch):
    """Write a module of factories in a fresh folder; returns its 'file.py' spec prefix."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "own.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import Dataset, TensorDataset

        def pairs(n=40):
            g = torch.Generator().manual_seed(0)
            x = torch.randint(0, 256, (n, 3, 6, 5), generator=g, dtype=torch.uint8)
            return (x, torch.arange(n) % 3), (x[:10], torch.arange(10) % 3)

        def grey():
            return (torch.rand(20, 7, 7), torch.zeros(20, dtype=torch.long)), \\
                TensorDataset(torch.rand(8, 7, 7), torch.ones(8, dtype=torch.long))

        class Lazy(Dataset):
            def __init__(self, n): self.n = n
            def __len__(self): return self.n
            def __getitem__(self, i): return torch.full((2, 4, 4), float(i)), i % 5

        def lazy(num_classes=5):
            return {"train": Lazy(30), "test": Lazy(12), "num_classes": num_classes}

        def floats():
            x = torch.rand(4, 1, 2, 2)
            return (x, torch.rand(4)), (x, torch.rand(4))

        def one(): return (torch.rand(4, 1, 2, 2), torch.zeros(4, dtype=torch.long))
        def raises(): raise KeyError("no such split")
        def model(c, h, w, k, hidden=3): return torch.nn.Linear(c * h * w, k)
        def not_a_model(c, h, w, k): return "resnet"
        bad_import = None
    """))
    (tmp_path / "crash.py").write_text("import not_installed_anywhere\ndef f(): pass\n")
    return "own.py"


def test_tensor_pairs_give_a_dataset_with_shape_and_classes_from_the_data(code):
    ds = load_user_data(data_section(f"{code}:pairs", n=30))
    assert isinstance(ds, Dataset)
    assert (ds.in_channels, ds.height, ds.image_size, ds.num_classes) == (3, 6, 5, 3)
    assert ds.train_x.dtype == torch.float32 and float(ds.train_x.max()) <= 1.0  # uint8 / 255
    assert (ds.n_train, ds.n_test) == (30, 10)


def test_grey_images_and_tensor_datasets_become_tensors(code):
    ds = load_user_data(data_section(f"{code}:grey"))
    assert isinstance(ds, Dataset) and ds.in_channels == 1 and ds.num_classes == 2


def test_a_lazy_dataset_is_read_through_a_loader_in_the_seeded_order(code):
    ds = load_user_data(data_section(f"{code}:lazy"))
    assert isinstance(ds, SetData)
    assert (ds.in_channels, ds.height, ds.image_size, ds.num_classes) == (2, 4, 4, 5)
    batches = make_batches(ds, 8, seed=1, device="cpu")
    assert batches.steps_per_epoch == 3
    seen = [int(x[j, 0, 0, 0]) for x, y in batches.epoch(1) for j in range(len(x))]
    from gputui.train.data import epoch_permutation

    assert seen == epoch_permutation(30, 1, 1).tolist()[:24]  # the order single would see
    tested = torch.cat([y for _, y in eval_batches(ds, 5, "cpu")])
    assert tested.tolist() == [i % 5 for i in range(12)]


@pytest.mark.parametrize("fn,expected", [
    ("raises", "data.factory 'own.py:raises' failed: KeyError: 'no such split'"),
    ("one", "data.factory 'own.py:one' returned one (images, labels) pair; return (train, "
            "test)"),
    ("floats", "train labels are torch.float32; give class indices"),
    ("missing", "data.factory 'own.py:missing': own.py has no 'missing'"),
    ("bad_import", "'bad_import' is a NoneType, not a function"),
])
def test_a_data_factory_that_fails_is_one_line_naming_it(code, fn, expected):
    with pytest.raises(UserCodeError) as err:
        load_user_data(data_section(f"{code}:{fn}"))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_lazy_dataset_without_its_classes_is_refused(code):
    with pytest.raises(UserCodeError, match="does not say its classes"):
        load_user_data(data_section(f"{code}:lazy", num_classes=0))


def test_an_import_error_in_the_users_module_is_one_line(code):
    with pytest.raises(UserCodeError) as err:
        build_model(model_section("crash.py:f"), 1, 2, 2, 3, seed=0)
    assert str(err.value) == ("model.factory 'crash.py:f' cannot be imported: "
                              "ModuleNotFoundError: No module named 'not_installed_anywhere'")


def test_the_model_factory_gets_the_shape_and_kwargs_and_the_seed(code):
    a = build_model(model_section(f"{code}:model", hidden=2), 3, 6, 5, 4, seed=7)
    b = build_model(model_section(f"{code}:model", hidden=2), 3, 6, 5, 4, seed=7)
    assert a.in_features == 90 and a.out_features == 4
    assert torch.equal(a.weight, b.weight)  # the same seed, the same init in every process
    with pytest.raises(UserCodeError, match="returned a str, not an nn.Module"):
        build_model(model_section(f"{code}:not_a_model"), 1, 2, 2, 3, seed=0)


def test_an_image_folder_is_read_with_its_classes(tmp_path):
    from PIL import Image

    for split, n in (("train", 3), ("test", 1)):
        for k, cls in enumerate(("cat", "dog")):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(n):
                size = (10, 8) if i == 0 else (12, 9)  # other sizes are resized to the first
                Image.new("RGB", size, (40 * k, 0, 200)).save(tmp_path / split / cls / f"{i}.png")
    ds = load_user_data(data_section(f"imagefolder:{tmp_path}"))
    assert isinstance(ds, SetData) and ds.train_set.classes == ["cat", "dog"]
    assert (ds.in_channels, ds.height, ds.image_size, ds.num_classes) == (3, 8, 10, 2)
    x, y = ds.train_set[3]
    assert x.shape == (3, 8, 10) and y == 1 and abs(float(x[0, 0, 0]) - 40 / 255) < 1e-6


class _ThreeChannelNet(nn.Module):
    """Shaped like torchvision's classifiers: a stem conv for RGB, a head for num_classes."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
                                      nn.ReLU(), nn.Conv2d(8, 8, 3))
        self.fc = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))

    def forward(self, x):
        return self.fc(self.features(x))


def test_the_first_convolution_is_adapted_to_the_channels():
    model = adapt_input_channels(_ThreeChannelNet(10), 1)
    first = model.features[0]
    assert (first.in_channels, first.out_channels, first.stride, first.bias) == (1, 8, (2, 2), None)
    assert model.features[2].in_channels == 8  # only the first one changes
    assert model(torch.rand(2, 1, 16, 16)).shape == (2, 10)


def test_torchvision_models_by_name(monkeypatch):
    """torchvision's registry wheel does not import beside this CPU torch, so this is a fake at
    that boundary only (list_models/get_model, as torchvision >= 0.14 has them)."""
    calls = []

    def get_model(name, weights=None, num_classes=1000, **kwargs):
        calls.append((name, weights, num_classes, kwargs))
        return _ThreeChannelNet(num_classes)

    fake = types.SimpleNamespace(models=types.SimpleNamespace(
        list_models=lambda: ["resnet50", "mobilenet_v3_small"], get_model=get_model))
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    model = build_model(model_section("torchvision:mobilenet_v3_small", dropout=0.1),
                        1, 28, 28, 4, seed=0)
    assert calls == [("mobilenet_v3_small", None, 4, {"dropout": 0.1})]
    assert model(torch.rand(2, 1, 28, 28)).shape == (2, 4)
    with pytest.raises(UserCodeError, match="torchvision has no model 'resnet5'"):
        build_model(model_section("torchvision:resnet5"), 1, 28, 28, 4, seed=0)


def test_torchvision_that_cannot_import_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import raises ImportError
    with pytest.raises(UserCodeError) as err:
        build_model(model_section("torchvision:resnet50"), 3, 32, 32, 10, seed=0)
    assert str(err.value).startswith("model.factory 'torchvision:resnet50': torchvision cannot "
                                     "be imported here (ModuleNotFoundError: ")
    assert "\n" not in str(err.value)
