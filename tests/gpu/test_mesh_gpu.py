"""The mesh's functions on CUDA, on a mesh of one GPU (``pytest -m gpu``; skipped without CUDA).

One GPU cannot hold two NCCL ranks, so the strategies that need two devices (tp, pp x tp,
fsdp x ep) cannot run whole here. What they share with every wider mesh can: tp's DTensor
weights beside the plain norms, on a one-rank NCCL mesh, through gputui's optimizer and grad
scaler rules. torch's optimizers take their multi-tensor (foreach) kernels by default for CUDA
tensors, and those refuse a list that mixes DTensors and plain tensors; these tests show that
torch's default fails on the GPU and gputui's optimizer steps to the same model as a plain one.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs CUDA (torch sees no GPU)")]


@contextlib.contextmanager
def nccl_world_of_one():
    """An NCCL process group of this process alone, on cuda:0."""
    import torch.distributed as dist

    from gputui.train.strategies.rank import destroy_group

    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", init_method=f"file://{os.path.join(tmp, 'store')}",
                                rank=0, world_size=1, device_id=torch.device("cuda:0"))
        try:
            yield
        finally:
            destroy_group()


def tiny_gpt():
    from gputui.train.gpt import GPTShape
    from gputui.train.models import build_model

    shape = GPTShape(vocab_size=256, context=32, n_layer=2, n_head=2, n_embd=64)
    return build_model("gpt", 1, 0, 0, seed=3, shape=shape).cuda(), shape


def batches(shape, n: int = 3):
    g = torch.Generator().manual_seed(5)
    for _ in range(n):
        x = torch.randint(0, shape.vocab_size, (4, shape.context), generator=g)
        yield x.cuda(), torch.roll(x, -1, dims=1).cuda()


def backward(model, x, y) -> None:
    """fp32 (bf16's rounding differs between DTensor's kernels and plain ones, and AdamW's
    first steps move a parameter by about lr whatever its gradient's size: seen on an H200,
    1.5e-3 apart after three bf16 steps)."""
    from gputui.train.gpt import lm_loss

    lm_loss(model(x), y).backward()


def full(p):
    from torch.distributed.tensor import DTensor

    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().float()


def test_tp_weights_beside_plain_norms_step_on_cuda_where_torchs_default_fails():
    from torch.distributed.device_mesh import init_device_mesh

    from gputui.core.config import from_dict
    from gputui.train.optim import build, mixes_dtensors, optimizer_class
    from gputui.train.parallelize import apply_tp

    kind, args = optimizer_class(from_dict({"optim": {"name": "adamw", "lr": 1e-3,
                                                      "weight_decay": 0.1}}).optim, 1e-3)
    with nccl_world_of_one():
        model, shape = tiny_gpt()
        ref = copy.deepcopy(model)  # the same model, plain tensors: torch's default optimizer
        apply_tp(model, init_device_mesh("cuda", (1,), mesh_dim_names=("tp",)))
        params = list(model.parameters())
        assert mixes_dtensors(params) and all(p.is_cuda for p in params)

        x, y = next(batches(shape, 1))
        backward(model, x, y)
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            kind(params, **args).step()  # torch's own choice on CUDA: foreach

        model.zero_grad(set_to_none=True)
        opt, ref_opt = build(kind, args, params), kind(ref.parameters(), **args)
        assert opt.defaults["foreach"] is False and ref_opt.defaults["foreach"] is None
        for x, y in batches(shape):
            for m, o in ((model, opt), (ref, ref_opt)):
                o.zero_grad(set_to_none=True)
                backward(m, x, y)
                o.step()
        got, want = dict(model.named_parameters()), dict(ref.named_parameters())
        assert got.keys() == want.keys()
        worst = max((full(got[k]) - full(want[k])).abs().max().item() for k in want)
        moved = max((full(want[k]) - full(p)).abs().max().item()
                    for k, p in tiny_gpt()[0].named_parameters())
        assert moved > 1e-3  # three AdamW steps moved the model
        # the per-tensor loop's update is torch's foreach one (to rounding: each step moves a
        # parameter by up to lr = 1e-3)
        assert worst < 1e-4, worst


def test_fp16s_grad_scaler_on_cuda_refuses_mixed_gradients_and_gputui_says_so_first():
    from torch.distributed.device_mesh import init_device_mesh

    from gputui.train.optim import scaler_problem
    from gputui.train.parallelize import apply_tp

    with nccl_world_of_one():
        model, shape = tiny_gpt()
        apply_tp(model, init_device_mesh("cuda", (1,), mesh_dim_names=("tp",)))
        params = list(model.parameters())
        assert "use run.precision = 'bf16'" in scaler_problem(params)
        opt = torch.optim.SGD(params, lr=0.1, foreach=False)
        scaler = torch.amp.GradScaler("cuda")
        x, y = next(batches(shape, 1))
        with torch.autocast("cuda", dtype=torch.float16):
            from gputui.train.gpt import lm_loss

            loss = lm_loss(model(x), y)
        scaler.scale(loss).backward()
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            scaler.unscale_(opt)  # what the run's first step would have met
