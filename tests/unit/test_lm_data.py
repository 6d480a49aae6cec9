"""Byte-level text for language modelling (gputui.train.text): the stdlib corpus, the user's
text, windows with next-byte targets, the unigram baseline, and the config rules around them."""

from __future__ import annotations

import math

import pytest
import torch

from gputui.core.config import ConfigError, RunConfig
from gputui.core.devices import cpu_devices
from gputui.plan import check_files, validate
from gputui.runs.prepare import override_checked
from gputui.train import text
from gputui.train.dataset import DataError


def test_windows_are_the_text_and_its_next_bytes():
    tokens = torch.arange(10, dtype=torch.uint8)
    x, y = text.windows(tokens, 3)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert y.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert x.dtype == y.dtype == torch.long
    assert text.windows(tokens, 3, cap=2)[0].shape == (2, 3)


def test_unigram_entropy_is_log_256_for_every_byte_once_and_0_for_one():
    assert text.unigram_entropy(torch.arange(256)) == pytest.approx(math.log(256))
    assert text.unigram_entropy(torch.zeros(50, dtype=torch.long)) == pytest.approx(0.0)


def test_pystdlib_is_python_source_split_90_10_with_its_baseline():
    ds = text.load_text("pystdlib", "", 64, train_size=100, test_size=20)
    assert (ds.task, ds.num_classes, ds.n_train, ds.n_test) == ("lm", 256, 100, 20)
    assert ds.train_x.shape == (100, 64) and torch.equal(ds.train_x[:, 1:], ds.train_y[:, :-1])
    sample = bytes(ds.train_x.flatten().tolist())
    assert b"def " in sample or b"import " in sample  # it is Python source
    assert 2.5 < ds.baseline < 4.5  # code's byte entropy, in nats (uniform would be 5.55)
    assert "standard library" in ds.source and "sha256" in ds.source
    # the same bytes every time (the selection is fixed)
    again = text.load_text("pystdlib", "", 64, train_size=100, test_size=20)
    assert torch.equal(again.train_x, ds.train_x) and torch.equal(again.test_y, ds.test_y)


def test_stdlib_files_leave_out_tests_and_installed_packages():
    files = text.stdlib_files()
    assert len(files) > 100
    for f in files:
        assert not {"test", "tests", "site-packages"} & set(f.parts[-4:-1]), f


def test_a_users_folder_is_read_in_sorted_order_hidden_files_skipped(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"B" * 50)
    (tmp_path / "a.txt").write_bytes(b"A" * 50)
    (tmp_path / ".hidden").write_bytes(b"H" * 50)
    assert text.user_bytes(str(tmp_path)) == b"A" * 50 + b"B" * 50
    ds = text.load_text("text", str(tmp_path), 8)
    assert ds.n_train == (90 - 1) // 8 and set(ds.test_x.flatten().tolist()) == {ord("B")}
    assert ds.baseline == pytest.approx(math.log(2), rel=0.05)


def test_unreadable_or_too_little_text_is_one_line(tmp_path):
    with pytest.raises(DataError, match="no file or folder"):
        text.load_text("text", str(tmp_path / "nope"), 8)
    (tmp_path / "t.txt").write_bytes(b"short")
    with pytest.raises(DataError, match="fewer than one window"):
        text.load_text("text", str(tmp_path / "t.txt"), 8)


def _cfg(**changes) -> RunConfig:
    return override_checked(RunConfig(), [("p", k, v) for k, v in changes.items()]).config


@pytest.mark.parametrize("changes, message", [
    ({"model.name": "gpt"}, "model.name = 'gpt' reads text"),
    ({"data.name": "pystdlib"}, "data.name = 'pystdlib' is text"),
    ({"model.name": "gpt", "data.name": "pystdlib", "model.n_head": 3},
     "model.n_head (3) must divide model.n_embd (128)"),
    ({"model.name": "gpt", "data.name": "text"}, "data.name = 'text' needs data.path"),
])
def test_the_model_and_the_data_must_agree_on_the_task(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(_cfg(**changes), cpu_devices(1), "p.toml")


def test_a_missing_text_path_is_refused_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="^p: data.path: no file or folder"):
        _cfg(**{"model.name": "gpt", "data.name": "text", "data.path": str(tmp_path / "x")})
    (tmp_path / "x").write_text("some text, long enough for a window of context " * 40)
    cfg = _cfg(**{"model.name": "gpt", "data.name": "text", "data.path": str(tmp_path / "x")})
    check_files(cfg, "p.toml")


def test_model_parallel_refuses_a_tied_gpt_across_gpus_only():
    from gputui.core.devices import Device
    from gputui.plan import why_not

    cfg = _cfg(**{"model.name": "gpt", "data.name": "pystdlib", "strategy.name":
                  "model_parallel", "devices.spec": "cpu*2"})
    gpus = [Device("cuda", 0, "gpu"), Device("cuda", 1, "gpu")]
    assert "model.tie = false" in why_not(cfg, gpus)
    assert why_not(cfg, cpu_devices(2)) is None
    untied = _cfg(**{"model.name": "gpt", "data.name": "pystdlib", "model.tie": False,
                     "strategy.name": "model_parallel", "devices.spec": "cpu*2"})
    assert why_not(untied, gpus) is None
    # gpt's blocks: the embedding, n_layer blocks, the head
    assert "at most 6 stages" in why_not(untied, [Device("cuda", i, "g") for i in range(7)])
