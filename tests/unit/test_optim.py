"""Optimizers, lr schedules and clipping (gputui.train.optim): the schedules' shapes, the
defaults bit-identical to a hand-written SGD loop, clipping to the global norm, one-line
config errors, and a run stopped mid-schedule resuming to the uninterrupted run's parameters."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from gputui.core.config import ConfigError, RunConfig, from_dict
from gputui.core.config_schema import OptimSection
from gputui.train import checkpoint as ckpt
from gputui.train.data import TensorBatches
from gputui.train.models import build_model
from gputui.train.optim import Updater, clip_grad_norm, lr_factor, make_optimizer
from strategy_harness import (ADAMW, assert_params_close, make_config, params, run_steps,
                              small_data)
from test_resume import run_loop


def section(**kw) -> OptimSection:
    return from_dict({"optim": kw}).optim


def test_warmup_then_cosine_reaches_the_peak_then_the_floor():
    o = section(schedule="cosine", warmup_steps=4, min_lr_ratio=0.1)
    f = [lr_factor(o, s, 104) for s in range(104)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4] == 1.0 and f[54] == pytest.approx(0.55)  # half way down: the mid-point
    assert all(a >= b for a, b in zip(f[4:-1], f[5:], strict=True))  # decays monotonically
    assert f[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 99 / 100)))


def test_linear_and_step_and_constant():
    lin = section(schedule="linear", warmup_steps=0, min_lr_ratio=0.0)
    assert [lr_factor(lin, s, 4) for s in range(4)] == pytest.approx([1, 0.75, 0.5, 0.25])
    step = section(schedule="step", step_size=3, gamma=0.5, warmup_steps=2)
    assert [lr_factor(step, s, 100) for s in range(9)] == pytest.approx(
        [0.5, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.25])
    const = section(warmup_steps=2)
    assert [lr_factor(const, s, 10) for s in range(4)] == [0.5, 1, 1, 1]


def test_the_defaults_are_a_hand_written_sgd_loop_bit_for_bit():
    cfg = make_config("single", "cpu", "mlp", 32)  # sgd with momentum 0.5, constant lr
    strategy, _ = run_steps(cfg, 4)
    model = build_model("mlp", 1, 28, 10, seed=3, init="default")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    ds = small_data()
    for x, y in itertools.islice(TensorBatches(ds.train_x, ds.train_y, 32, 3).epoch(1), 4):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    got, want = params(strategy.model), params(model)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_the_optimizers_are_torchs_with_the_configured_arguments():
    p = [torch.nn.Parameter(torch.zeros(2))]
    adamw = make_optimizer(section(name="adamw", betas=[0.8, 0.9], eps=1e-6, weight_decay=0.1),
                           p, 0.3)
    assert type(adamw) is torch.optim.AdamW
    g = adamw.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (0.3, (0.8, 0.9), 1e-6, 0.1)
    assert type(make_optimizer(section(name="adam"), p, 0.1)) is torch.optim.Adam
    sgd = make_optimizer(section(momentum=0.9), p, 0.1)
    assert type(sgd) is torch.optim.SGD and sgd.param_groups[0]["momentum"] == 0.9


def test_clipping_scales_to_the_global_norm_over_devices_of_gradients():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])  # global norm 5
    norm = clip_grad_norm([a, b], 1.0)
    assert norm.item() == pytest.approx(5.0)
    assert torch.allclose(a.grad, torch.tensor([0.6, 0.0])) and torch.allclose(b.grad,
                                                                               torch.tensor([0.8]))
    clip_grad_norm([a, b], 10.0)  # below the limit: untouched
    assert torch.allclose(b.grad, torch.tensor([0.8]))
    a.grad = torch.tensor([3.0, 0.0])  # a second rank's stage holding norm 4 (pp's reduce)
    assert clip_grad_norm([a], 1.0, reduce_sq=lambda sq: sq + 16.0).item() == pytest.approx(5.0)
    assert torch.allclose(a.grad, torch.tensor([0.6, 0.0]))


def test_clipping_and_the_schedule_change_the_run():
    """The equivalence tests' AdamW settings really clip and really schedule: without either,
    single trains to other parameters."""
    ref, _ = run_steps(make_config("single", "cpu", "mlp", 32, **ADAMW), 5)
    assert [ref.updater.lr_at(s) for s in range(5)] == pytest.approx(
        [0.00025, 0.0005, 0.0005, 0.0003875, 0.0001625])
    for change in ({"optim.clip_grad_norm": 0.0}, {"optim.schedule": "constant",
                                                    "optim.warmup_steps": 0}):
        other, _ = run_steps(make_config("single", "cpu", "mlp", 32, **{**ADAMW, **change}), 5)
        a, b = params(ref.model), params(other.model)
        assert max((a[k] - b[k]).abs().max().item() for k in a) > 1e-5, change


@pytest.mark.parametrize("text,error", [
    ("name = 'lbfgs'", "optim.name must be one of sgd, adam, adamw; got 'lbfgs'"),
    ("lr = -0.001", "optim.lr must be greater than 0.0, got -0.001"),
    ("weight_decay = -1", "optim.weight_decay must be at least 0.0, got -1.0"),
    ("betas = [0.9, 1.2]", "optim.betas must be two numbers in [0, 1), e.g. [0.9, 0.999]; "
                           "got [0.9, 1.2]"),
    ("betas = [0.9]", "optim.betas must be two numbers in [0, 1)"),
    ("betas = [-0.1, 0.9]", "optim.betas must be two numbers in [0, 1)"),
    ("betas = ['a', 0.9]", "optim.betas must be two numbers in [0, 1)"),
    ("schedule = 'exp'", "optim.schedule must be one of constant, cosine, linear, step"),
    ("warmup_steps = -1", "optim.warmup_steps must be at least 0, got -1"),
    ("min_lr_ratio = 1.5", "optim.min_lr_ratio must be at most 1.0, got 1.5"),
    ("gamma = 0", "optim.gamma must be greater than 0.0, got 0.0"),
    ("step_size = 0", "optim.step_size must be at least 1, got 0"),
    ("clip_grad_norm = -1", "optim.clip_grad_norm must be at least 0.0, got -1.0"),
    ("eps = 0", "optim.eps must be greater than 0.0, got 0.0"),
])
def test_bad_optimizer_settings_are_one_line(text, error):
    import tomllib

    with pytest.raises(ConfigError) as info:
        from_dict(tomllib.loads(f"[optim]\n{text}\n"), source="p.toml")
    assert str(info.value).startswith(f"p.toml: {error}")
    assert "\n" not in str(info.value)


def test_a_warmup_as_long_as_the_run_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^optim.warmup_steps \(30\) is not shorter than the "
                                          r"run \(30 optimizer steps\); lower it or train longer$"):
        Updater(section(warmup_steps=30), 0.1).plan(30)
    cfg = make_config("single", "cpu", "mlp", 32, **{"optim.warmup_steps": 50, "run.epochs": 2})
    with pytest.raises(ConfigError, match=r"\(20 optimizer steps\)"):  # 10 steps an epoch
        run_loop(cfg, None)


def test_a_run_stopped_mid_schedule_resumes_to_the_uninterrupted_runs_parameters(tmp_path):
    """AdamW, warm-up then cosine over 20 steps, clipping: stopped at step 13 (mid-epoch,
    past the warm-up), resumed from its checkpoint; the same parameters and the same lr
    reported at each logged step as the run that never stopped."""
    extra = {**ADAMW, "optim.warmup_steps": 8, "run.epochs": 2, "run.log_every": 2}
    cfg = make_config("single", "cpu", "mlp", 32, **extra)
    (tmp_path / "ref").mkdir()
    reference, status, ref_events = run_loop(cfg, tmp_path / "ref")
    assert status == "finished" and reference.updater.steps == 20
    (tmp_path / "a").mkdir()
    _, status, _ = run_loop(cfg, tmp_path / "a", stop_after=14)
    saved = ckpt.load(tmp_path / "a")
    assert status == "stopped" and saved["schedule"] == {"steps": 13}
    assert saved["state"]["optimizers"][0]["state"][0]["step"].item() == 13  # AdamW's own count
    (tmp_path / "b").mkdir()
    resumed, status, events = run_loop(cfg.replace(run={"resume_from": str(tmp_path / "a")}),
                                       tmp_path / "b")
    assert status == "finished" and resumed.updater.steps == 20
    assert_params_close(params(resumed.model), params(reference.model))
    lrs = {e.global_step: e.lr for e in events if e.kind == "step"}
    ref_lrs = {e.global_step: e.lr for e in ref_events if e.kind == "step"}
    assert lrs and all(ref_lrs[s] == pytest.approx(lr) for s, lr in lrs.items())
    assert ref_lrs[2] == pytest.approx(0.0005 * 2 / 8)  # the warm-up, as the record shows it
    assert len(set(ref_lrs.values())) > 5


def test_a_checkpoint_without_a_schedule_resumes_from_its_global_step(tmp_path):
    """Checkpoints written before schedules existed hold no "schedule": the count is the
    position's global step."""
    cfg = make_config("single", "cpu", "mlp", 32, **{"run.epochs": 2})
    (tmp_path / "a").mkdir()
    run_loop(cfg, tmp_path / "a", stop_after=4)
    data = ckpt.load(tmp_path / "a")
    del data["schedule"]
    strategy, _ = run_steps(cfg, 0)
    assert ckpt.restore(strategy, data).global_step == 4 and strategy.updater.steps == 4


def test_the_default_config_is_sgd_constant_and_unclipped():
    o = RunConfig().optim
    assert (o.name, o.schedule, o.warmup_steps, o.clip_grad_norm) == ("sgd", "constant", 0, 0.0)


def test_the_printer_shows_a_scheduled_lr_only():
    import io

    from gputui.cli.printer import Printer
    from gputui.core.events import RunStarted, StepMetrics

    def printed(optim: dict) -> str:
        out = io.StringIO()
        printer = Printer(stream=out, live=False)
        cfg = RunConfig().replace(run={"epochs": 1}, optim=optim)
        printer.handle(RunStarted(run_id="r", config=cfg,
                                  devices=(), strategy="single", world_size=1))
        printer.handle(StepMetrics(epoch=1, step=5, global_step=5, steps_per_epoch=10,
                                   loss=2.0, samples_per_s=100.0, step_time_s=0.01,
                                   lr=0.00025))
        return out.getvalue().splitlines()[-1]

    assert printed({"schedule": "cosine"}) == ("epoch 1 step 5/10: loss 2.0000, lr 0.00025, "
                                               "100 samples/s, step 10.0 ms")
    assert "lr" not in printed({"schedule": "constant", "warmup_steps": 0})
    assert ", lr 0.00025" in printed({"warmup_steps": 3})


def test_clipping_under_a_grad_scaler_clips_the_unscaled_gradients():
    """fp16's grad scaler (CUDA runs; its CPU form here): the gradients are unscaled before
    the norm is taken, and the step after is the unscaled run's."""
    o = section(name="adamw", clip_grad_norm=0.1, schedule="linear", warmup_steps=1)

    def one_step(scaler):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = make_optimizer(o, model.parameters(), 0.01)
        updater = Updater(o, 0.01)
        updater.plan(4)
        loss = model(torch.randn(8, 4)).pow(2).mean()
        (scaler.scale(loss) if scaler else loss).backward()
        updater.before((opt,), scaler)
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        return norm.item(), params(model)

    norm, plain = one_step(None)
    scaled_norm, scaled = one_step(torch.amp.GradScaler("cpu", init_scale=1024.0))
    # clipped to 0.1 (less a hair: the coefficient is max_norm / (norm + 1e-6))
    assert norm == pytest.approx(0.1, rel=1e-4) and scaled_norm == pytest.approx(0.1, rel=1e-4)
    assert_params_close(scaled, plain)


def test_the_memory_prediction_counts_each_optimizers_state():
    from gputui.core.config_schema import optimizer_states

    kinds = ({}, {"momentum": 0.9}, {"name": "adam"}, {"name": "adamw", "momentum": 0.9})
    assert [optimizer_states(section(**kw)) for kw in kinds] == [0, 1, 2, 2]


def test_a_warmup_longer_than_a_synthetic_run_is_refused_before_it_starts(tmp_path):
    """The embedded set's size is in the config: 1024 examples of 256 over 2 epochs are 8
    optimizer steps, so a warm-up of 8 is refused at once, blamed on its flag."""
    from gputui.runs.prepare import load_checked

    preset = tmp_path / "p.toml"
    preset.write_text("[data]\ntrain_size = 1024\n[run]\nepochs = 2\n")
    load_checked(preset, [("--set optim.warmup_steps=7", "optim.warmup_steps", 7)])
    with pytest.raises(ConfigError) as info:
        load_checked(preset, [("--set optim.warmup_steps=8", "optim.warmup_steps", 8)])
    assert str(info.value) == ("--set optim.warmup_steps=8: optim.warmup_steps (8) is not "
                               "shorter than the run (8 optimizer steps); lower it or train "
                               "longer")


def test_clipping_takes_dtensor_shards_and_plain_gradients_together():
    """A DTensor gradient (fsdp's and tp's shards; here on a mesh of this process alone)
    beside a plain one: one global norm over both, each scaled by it."""
    from old_checkpoints import world_of_one
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    with world_of_one():
        mesh = init_device_mesh("cpu", (1,))
        a = torch.nn.Parameter(distribute_tensor(torch.zeros(2), mesh, [Shard(0)]))
        a.grad = distribute_tensor(torch.tensor([3.0, 0.0]), mesh, [Shard(0)])
        b = torch.nn.Parameter(torch.zeros(1))
        b.grad = torch.tensor([4.0])
        assert clip_grad_norm([a, b], 1.0).item() == pytest.approx(5.0)
        assert torch.allclose(a.grad.full_tensor(), torch.tensor([0.6, 0.0]))
        assert torch.allclose(b.grad, torch.tensor([0.8]))


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_a_step_over_dtensors_and_plain_tensors_together_runs_where_torch_defaults_to_foreach(
        name, monkeypatch):
    """tp leaves the norms plain beside DTensor weights (pp x tp too; fsdp x ep keeps the
    experts plain): torch's multi-tensor kernels refuse such a list, and torch takes them by
    default on CUDA. Here CUDA's default is put in place on the CPU: the optimizer gputui
    builds keeps its per-tensor loop and steps; the one torch builds alone fails as on a GPU."""
    from old_checkpoints import world_of_one
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.optim import adam, sgd

    from gputui.train.optim import build, optimizer_class

    for module in (adam, sgd):  # where each takes torch's default (CUDA's, for CUDA tensors)
        monkeypatch.setattr(module, "_default_to_fused_or_foreach",
                            lambda *a, **k: (False, True))
    with world_of_one():
        mesh = init_device_mesh("cpu", (1,))
        a = torch.nn.Parameter(distribute_tensor(torch.ones(2), mesh, [Shard(0)]))
        b = torch.nn.Parameter(torch.ones(2))
        kind, args = optimizer_class(section(name=name, momentum=0.9, lr=0.1,
                                             weight_decay=0.1), 0.1)
        for p in (a, b):
            p.grad = torch.ones_like(p)
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            kind([a, b], **args).step()
        a.grad, b.grad = distribute_tensor(torch.ones(2), mesh, [Shard(0)]), torch.ones(2)
        opt = build(kind, args, [a, b])
        opt.step()
        assert opt.defaults["foreach"] is False
        assert torch.equal(a.full_tensor(), b.detach())  # the same update
        assert not torch.equal(b.detach(), torch.ones(2))
        plain = build(kind, args, [torch.nn.Parameter(torch.ones(1))])
        assert plain.defaults["foreach"] is None  # one kind: torch's own choice


def test_fp16s_grad_scaler_is_refused_in_one_line_where_it_would_take_mixed_gradients():
    """torch's GradScaler unscales a device's gradients in one multi-tensor call, which refuses
    DTensors and plain tensors together (as the optimizer's would): such a run ends at its set-up
    with the fix, not in its first step."""
    from old_checkpoints import world_of_one
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from gputui.train.optim import scaler_problem

    with world_of_one():
        mesh = init_device_mesh("cpu", (1,))
        a = torch.nn.Parameter(distribute_tensor(torch.ones(2), mesh, [Shard(0)]))
        b = torch.nn.Parameter(torch.ones(2))
        grads = [distribute_tensor(torch.ones(2), mesh, [Shard(0)]), torch.ones(2)]
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            torch._amp_foreach_non_finite_check_and_unscale_(
                grads, torch.zeros(1), torch.ones(1))  # the scaler's own call
        assert "use run.precision = 'bf16'" in scaler_problem([{"params": [a, b]}])
        assert scaler_problem([{"params": [b]}]) == scaler_problem([a]) == ""
