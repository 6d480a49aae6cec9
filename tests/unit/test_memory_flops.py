"""Memory by strategy and distance from the hardware, against answers computed by hand: the
bytes of an MLP's parameters, gradients and optimizer state, the activations autograd saves,
the FLOPs of linear layers, the GPU peak table and the cached matmul peak; and the loop's
record of them (fsdp against ddp on two ranks: test_equivalence_ddp.py)."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from torch import nn

from gputui.core.events import FlopsInfo, MemoryReport, MemoryRow, StepMetrics
from gputui.hw.discovery import resolve_devices
from gputui.train import flops, memory, strategies
from gputui.train.data import TensorBatches
from gputui.train.loop import train
from strategy_harness import make_config, small_data

B, IN, HID, OUT = 8, 20, 16, 10


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))


def test_flops_of_linear_layers_are_two_b_in_out_forward_and_twice_that_backward():
    got = flops.count_step_flops(mlp, (B, 1, 4, 5), OUT)
    forward = 2 * B * IN * HID + 2 * B * HID * OUT
    # the last layer computes grads of its weight and its input (2x forward); the first, whose
    # input needs no gradient, of its weight only
    backward = 2 * (2 * B * HID * OUT) + 2 * B * IN * HID
    assert got == forward + backward


def test_attention_on_cpu_tensors_is_counted_as_a_run_counts_it_on_the_meta_device():
    """torch's counter (2.13) has no formula for the CPU's attention kernel and counts 0 there:
    gputui's counter counts it as the run's MFU does on the meta device (two products forward,
    four backward), so a model the plan traces on the CPU counts what its run counts."""
    from torch.nn import functional as F
    from torch.utils import flop_counter as fc

    def attend(device: str, mode) -> int:
        q = torch.randn(2, 4, 64, 32, device=device, requires_grad=True)
        with mode as count:
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        return count.get_total_flops()

    on_meta = attend("meta", fc.FlopCounterMode(display=False))
    assert on_meta == 6 * 2 * (2 * 4 * 64 * 64 * 32)  # 6 products of 2 x B H T T d
    assert attend("cpu", flops.counter()) == on_meta


def test_the_whole_step_counter_counts_what_torchs_counts():
    """The plan's tracer counts FLOPs inside the step whose memory it traces, with the
    counter that neither tracks modules nor decomposes what it has no formula for: the same
    total as torch's counter over a GPT's step, checkpointed blocks and attention included."""
    from gputui.train.gpt import GPTShape, gpt, lm_loss
    from gputui.train.parallelize import apply_ac

    torch.manual_seed(0)
    model = gpt(GPTShape(vocab_size=64, context=16, n_layer=2, n_head=2, n_embd=16))
    apply_ac(model, "full")
    x = torch.randint(0, 64, (2, 16))

    def step(mode) -> int:
        with mode as count:
            lm_loss(model(x), x).backward()
        return count.get_total_flops()

    whole = step(flops.counter(modules=False))
    assert type(flops.counter(modules=False)).__name__ == "_WholeStep"
    assert whole == step(flops.counter()) > 0


def test_counting_flops_leaves_the_random_state_alone():
    before = torch.get_rng_state()
    flops.count_step_flops(mlp, (B, IN), OUT)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("make_opt, state_per_param", [
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), lambda n, count: n),
    (lambda p: torch.optim.SGD(p, lr=0.1), lambda n, count: 0),
    # Adam: two moments per parameter, and one float32 step counter per tensor
    (lambda p: torch.optim.Adam(p, lr=0.1), lambda n, count: 2 * n + 4 * count),
])
def test_params_grads_and_optimizer_state_by_hand(make_opt, state_per_param):
    model = mlp()
    param_bytes = 4 * (IN * HID + HID + HID * OUT + OUT)
    opt = make_opt(model.parameters())
    assert memory.counted(model, [opt]) == {"params": param_bytes, "grads": 0, "optim": 0}
    model(torch.randn(B, IN)).sum().backward()
    opt.step()
    assert memory.counted(model, [opt]) == {
        "params": param_bytes, "grads": param_bytes,
        "optim": state_per_param(param_bytes, 4)}


def test_activations_are_what_autograd_saves_and_micro_batches_do_not_add_up():
    model = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
    # saved: the input (first linear), relu's output (relu and the second linear: one
    # storage), the output (pow); the weights are parameters, not activations
    one = 4 * B * (IN + HID + OUT)
    with memory.ActivationMeter() as meter:
        for _ in range(2):  # two micro-batches, each freed by its own backward
            loss = model(torch.randn(B, IN)).pow(2).sum()
            assert meter.live == {"cpu": one}
            loss.backward()
            assert meter.live == {"cpu": 0}
    assert meter.peak == {"cpu": one}


@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "tf32", 378.0),
    ("NVIDIA H200", "fp16", 989.4), ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA L4", "fp32", 30.3), ("NVIDIA L40S", "bf16", 362.0),
    ("Tesla V100-SXM2-16GB", "bf16", None), ("Some Future GPU", "bf16", None),
])
def test_peak_table_by_nvml_name(name, dtype, tflops):
    peak = flops.table_peak(name, dtype)
    assert peak == (tflops * 1e12 if tflops is not None else None)


def test_measured_peak_is_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "gputui"))
    peak, source = flops.device_peak(torch.device("cpu"), "fp32")
    assert peak > 1e8 and "measured" in source
    data = json.loads(flops.cache_path().read_text())
    (key,) = data
    assert data[key]["flops"] == peak and key.startswith("cpu|")
    assert {"when", "host", "others_share", "contended"} <= set(data[key]["machine"])
    quiet = {"contended": False, "when": 0, "host": "h"}
    flops.cache_path().write_text(json.dumps({key: {"flops": 1234.0, "machine": quiet}}))
    assert flops.device_peak(torch.device("cpu"), "fp32")[0] == 1234.0  # read, not measured


def _peak_cache(tmp_path, monkeypatch, entries: dict) -> str:
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "gputui"))
    key = f"cpu|{flops.cpu_name()}|fp32|threads={torch.get_num_threads()}"
    data = {key.replace(f"threads={torch.get_num_threads()}", f"threads={t}"): e
            for t, e in entries.items()}
    flops.cache_path().parent.mkdir(parents=True)
    flops.cache_path().write_text(json.dumps(data))
    return key


def test_a_self_contradicting_peak_cache_is_measured_again(tmp_path, monkeypatch):
    """The issue's cache: 101.2 GFLOP/s on 1 thread, 49.6 on 2 (more threads slower)."""
    quiet = {"contended": False}
    n = torch.get_num_threads()
    key = _peak_cache(tmp_path, monkeypatch, {n: {"flops": 49.6e9, "machine": quiet},
                                              n + 1: {"flops": 20e9, "machine": quiet},
                                              n - 1 if n > 1 else n + 2: {
                                                  "flops": 101.2e9, "machine": quiet}})
    data = json.loads(flops.cache_path().read_text())
    assert flops.contradicting(data, key) and "more threads" in flops.distrust(data, key)
    peak, _ = flops.device_peak(torch.device("cpu"), "fp32")
    after = json.loads(flops.cache_path().read_text())
    assert peak == after[key]["flops"] != 49.6e9  # measured again, with its machine state
    assert "contradicts" in after[key]["remeasured"] and "machine" in after[key]


def test_a_peak_measured_under_contention_or_without_its_state_is_measured_again(
        tmp_path, monkeypatch):
    n = torch.get_num_threads()
    key = _peak_cache(tmp_path, monkeypatch, {n: {"flops": 1.0, "machine": {"contended": True}}})
    assert flops.device_peak(torch.device("cpu"), "fp32")[0] != 1.0
    assert "other processes" in json.loads(flops.cache_path().read_text())[key]["remeasured"]
    _peak_cache(tmp_path / "old", monkeypatch, {n: 2.0})  # an older cache: a bare number
    assert flops.device_peak(torch.device("cpu"), "fp32")[0] != 2.0


def test_the_loop_records_memory_flops_and_mfu(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTUI_CACHE_DIR", str(tmp_path / "gputui"))
    cfg = make_config("single", "cpu", "mlp", 32, **{"run.epochs": 1, "run.log_every": 5})
    ds = small_data()
    strategy = strategies.load("single")(cfg, resolve_devices("cpu"), ds.in_channels,
                                             ds.image_size, ds.num_classes)
    strategy.setup()
    events = []
    train(cfg, strategy, TensorBatches(ds.train_x, ds.train_y, 32, 3), ds, events.append,
          lambda: False)
    info = next(e for e in events if isinstance(e, FlopsInfo))
    d_in = ds.in_channels * ds.image_size * ds.height
    layers = [(d_in, 256), (256, 128), (128, 10)]
    fwd = sum(2 * 32 * a * b for a, b in layers)
    assert info.flops_per_step == 3 * fwd - 2 * 32 * d_in * 256  # no input grad at layer 1
    assert info.units == 1 and info.peak_flops > 0
    reports = [e for e in events if isinstance(e, MemoryReport)]
    assert len(reports) == 2  # after the first step and at the epoch's end
    (row,) = reports[0].per_device
    param_bytes = 4 * sum(a * b + b for a, b in layers)
    assert row.device == "cpu:0"
    assert row.params == row.grads == row.optim == param_bytes  # momentum buffers
    assert row.activations >= 4 * 32 * (d_in + 256 + 128)
    steps = [e for e in events if isinstance(e, StepMetrics)]
    for s in steps:
        assert s.flops_per_s == pytest.approx(info.flops_per_step / s.step_time_s, rel=1e-6)
        assert s.mfu == pytest.approx(s.flops_per_s / info.peak_flops)


def test_compare_reads_mfu_and_the_largest_devices_memory(tmp_path):
    from gputui.core import runstore
    from gputui.runs.compare.cells import fmt
    from gputui.runs.compare.table import read_hw_figures

    step = dict(epoch=1, steps_per_epoch=4, loss=1.0, samples_per_s=1.0, step_time_s=1.0,
                lr=0.1)
    rows = (MemoryRow(device="cpu:0", params=100, grads=100, optim=200, activations=50),
            MemoryRow(device="cpu:1", params=100, grads=100, optim=200, activations=70))
    log = runstore.EventLog(tmp_path / "events.jsonl")
    for ev in (StepMetrics(step=2, global_step=2, mfu=0.2, flops_per_s=2e9, **step),
               MemoryReport(epoch=1, per_device=(MemoryRow(device="cpu:0", params=1),)),
               StepMetrics(step=4, global_step=4, mfu=0.4, flops_per_s=4e9, **step),
               MemoryReport(epoch=1, per_device=rows)):
        log.write(ev)
    log.close()
    got = read_hw_figures(tmp_path)
    assert got["mfu"] == pytest.approx(0.3) and got["flops_per_s"] == pytest.approx(3e9)
    assert got["train_mem"] == 470 and got["memory"] == [r.to_dict() for r in rows]
    assert fmt("mfu", 0.3) == "30.0%" and fmt("train_mem", 470) == "470 B"


def test_measuring_the_peak_draws_nothing_from_the_runs_random_numbers():
    """The peak is measured on matrices from a generator of its own: a run that measures it
    (none kept yet) draws the same dropout masks as one that reads it kept."""
    import torch

    from gputui.train.flops import measure_matmul

    before = torch.get_rng_state()
    assert measure_matmul(torch.device("cpu"), "fp32", seconds=0.01) > 0
    assert torch.equal(torch.get_rng_state(), before)


def test_the_bytes_written_beside_the_flops_are_new_or_written_in_place_memory():
    """What the plan prices at this CPU's cost of a written byte (the elementwise work): a
    new output, or a tensor written in place; no view, alias or allocation. Counted on fake
    tensors as on real ones, the same bytes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def written(fake: bool) -> dict[str, int]:
        mode = FakeTensorMode() if fake else contextlib.nullcontext()
        with mode:
            a = torch.rand(4, 8)  # 128 bytes
            count = flops.counter(modules=False)
            with count:
                b = a * 2  # new: 128
                a.add_(1)  # in place: 128
                a.view(32)  # a view: 0
                torch.ops.aten._unsafe_view(b, [32])  # an alias of b: 0
                torch.empty(1000)  # allocated, not written: 0
                torch.zeros(16)  # new and written: 64
                a @ torch.ones(8, 2)  # a FLOP formula's: priced by FLOPs, not here (ones: 64)
                torch._foreach_add_([a, b], 1)  # writes its list, returns nothing: 256
                a.unsqueeze_(0)  # its metadata only: 0
                a.squeeze_(0)
                c = torch.empty(4, 8)
                torch.add(a, 1, out=c)  # into its out= argument: 128
            return count.work["step"]

    real, fake = written(False), written(True)
    assert real["bytes"] == 128 + 128 + 64 + 64 + 256 + 128 and real["ops"] >= 10
    assert fake == real
