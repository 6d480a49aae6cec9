"""Every shipped preset loads on machines with 0, 1, 2 and 8 GPUs (NVML through a fake):
what it asks for when the GPUs are there, its fallback, with one line saying what it runs on
instead, when they are not all there, and a refusal when it has no fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputui.core.config import ConfigError
from gputui.core.devices import DeviceSpecError, requested_count, wants_gpus
from gputui.hw.discovery import resolve_with_note
from gputui.runs.prepare import load_checked

PRESETS = sorted((Path(__file__).resolve().parents[2] / "presets").glob("*.toml"))


@pytest.mark.parametrize("n_gpus", [0, 1, 2, 8])
@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_preset_loads_on_this_many_gpus(fake_gpus, path, n_gpus):
    fake_gpus(n_gpus)
    # the full checks, devices resolved against the fake (a dataset this machine lacks is
    # left to data.download: the devices are the point here)
    prepared = load_checked(path, [("t", "data.download", True)])
    cfg = prepared.config
    spec, fallback = cfg.devices.spec, cfg.devices.fallback
    devices, note = resolve_with_note(spec, fallback)
    assert (prepared.devices, prepared.note) == (devices, note)
    if not wants_gpus(spec):
        assert {d.kind for d in devices} == {"cpu"} and note == ""
        return
    asked = n_gpus if spec.strip().lower() == "all" and n_gpus else requested_count(spec)
    if n_gpus >= asked and n_gpus > 0:
        assert [d.name for d in devices] == [f"cuda:{i}" for i in range(asked)]
        assert note == ""
    else:
        assert fallback == "cpu", f"{path.name} would refuse a machine with {n_gpus} GPU(s)"
        assert [d.name for d in devices] == [f"cpu:{i}" for i in range(asked)]
        assert note.startswith(f"devices.spec '{spec}' cannot be met (")
        assert f"running on {asked} CPU virtual device(s) instead" in note
        assert "\n" not in note


@pytest.mark.parametrize("n_gpus,spec,expected", [
    (1, "2", "this machine has 1 GPU(s)"),  # fewer than asked: the fallback too, not only none
    (0, "2", "no GPU is available"),
    (2, "0,3", "this machine has 2 GPU(s)"),  # an index that is not there
])
def test_the_fallback_degrades_and_says_what_it_ran_on(fake_gpus, spec, n_gpus, expected):
    fake_gpus(n_gpus)
    devices, note = resolve_with_note(spec, "cpu")
    assert [d.kind for d in devices] == ["cpu", "cpu"]
    assert expected in note
    with pytest.raises(DeviceSpecError):  # without a fallback the same choice is refused
        resolve_with_note(spec, "none")


@pytest.mark.parametrize("spec", ["0,0", "cpu,1", "gpu:x"])
def test_a_spec_wrong_on_every_machine_is_refused_whatever_the_fallback(fake_gpus, spec):
    fake_gpus(1)
    with pytest.raises(DeviceSpecError):
        resolve_with_note(spec, "cpu")


def test_a_preset_without_fallback_is_refused_in_one_line(fake_gpus, tmp_path):
    fake_gpus(1)
    p = tmp_path / "two.toml"
    p.write_text('[devices]\nspec = "2"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_checked(p)
    assert str(err.value) == (f"{p}: devices.spec: '2' asks for 2 GPUs but this machine has "
                              f"only 1; use a count up to 1, or 'all'")
