"""The common interface of every strategy, and what single-device training already does.

A strategy builds its model(s) on its devices, runs one optimizer step on a global batch
(``train_step``), and counts correct test predictions (``evaluate``). Subclasses hold only
what differs from single-device training.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from gputui.config import RunConfig, effective_batch_size, effective_lr
from gputui.devices import Device
from gputui.training.models import build_model
from gputui.training.strategies import fastpath

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Stopwatch:
    """Time marks without sync points: perf_counter on CPU, CUDA events on GPU (read later,
    at the log interval, where the loop synchronises anyway)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return end - start


def flat_layers(module: nn.Module) -> list[nn.Module]:
    """The layers of a plain Sequential, with nested plain Sequentials opened (subclasses,
    which may have their own forward, are kept whole)."""
    out: list[nn.Module] = []
    for child in module.children():
        out += flat_layers(child) if type(child) is nn.Sequential else [child]
    return out


class Strategy:
    """Base class: configuration, model building, the optimizer and one micro-batched
    forward/backward pass. ``meter`` is set by the loop on the steps it wants timed."""

    name = "base"

    def __init__(self, cfg: RunConfig, devices: list[Device], in_channels: int = 1,
                 image_size: int = 28, num_classes: int = 10, rank: int = 0,
                 world_size: int = 1, height: int = 0):
        self.cfg, self.devices = cfg, devices
        self.in_channels, self.image_size, self.num_classes = in_channels, image_size, num_classes
        self.height = height or image_size  # image_size is the width (built-in data: square)
        self.rank, self.world_size = rank, world_size
        n = max(len(devices), world_size)
        self.batch_size = effective_batch_size(cfg, n)
        self.lr = effective_lr(cfg, n)
        self.meter = False
        self.data_s = 0.0  # the metered step's wait for its batch, set by the loop
        self.comm_delay_s = cfg.debug.comm_delay_s  # added to each communication (a test knob)
        self.timing: dict[str, Any] = {}
        self.notes: list[str] = []
        self.scaler = None
        # decided once, not per step
        self.micro = cfg.optim.micro_batches
        self.amp_dtype = AMP_DTYPES.get(cfg.run.precision)
        # CUDA graphs (compile "reduce-overhead") reuse their output memory: each step says
        # where it begins, so the previous step's outputs are not taken for live ones.
        self.graph_steps = cfg.run.compile == "reduce-overhead"

    # ---------------------------------------------------------------- building blocks
    def build_model(self) -> nn.Module:
        """The configured model on the CPU, initialised from ``run.seed``: the built-in
        model.name, or what model.factory builds (the user's code, see userfactory)."""
        m = self.cfg.model
        if m.factory:
            from gputui.training.userfactory import build_model as build_user_model

            model = build_user_model(m, self.in_channels, self.height, self.image_size,
                                     self.num_classes, seed=self.cfg.run.seed)
        else:
            model = build_model(m.name, self.in_channels, self.image_size, self.num_classes,
                                seed=self.cfg.run.seed, init=m.init, init_std=m.init_std)
        return fastpath.to_channels_last(model) if self.cfg.run.channels_last else model

    def fast(self, module: nn.Module) -> nn.Module:
        """The module a step calls, through torch.compile when run.compile asks for it (see
        ``fastpath``); the eager module itself otherwise."""
        return fastpath.compile_module(module, self.cfg.run.compile)

    def compiles(self) -> bool:
        """Whether run.compile applies to this strategy (dp says no, and why)."""
        return True

    def lean(self, model: nn.Module) -> nn.Module:
        """What a step calls: a Sequential of nested plain Sequentials flattened into one that
        shares their layers (one call per layer, none per nesting level); anything else as is.
        Parameter names, checkpoints and the optimizer stay on ``model`` itself."""
        if type(model) is not nn.Sequential:
            return model
        leaves = flat_layers(model)
        return nn.Sequential(*leaves) if len(leaves) != len(model) else model

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """Minibatch SGD with the configured lr, momentum and weight decay."""
        o = self.cfg.optim
        return torch.optim.SGD(params, lr=self.lr, momentum=o.momentum,
                               weight_decay=o.weight_decay)

    def make_scaler(self, device: torch.device) -> None:
        """fp16 on CUDA needs a grad scaler; bf16 and fp32 do not."""
        if self.cfg.run.precision == "fp16" and device.type == "cuda":
            self.scaler = torch.amp.GradScaler("cuda")

    def autocast(self, device: torch.device):
        """Autocast for bf16/fp16, a no-op context for fp32."""
        dtype = AMP_DTYPES.get(self.cfg.run.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=dtype)

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         denom: float, device: torch.device, before_last=None) -> torch.Tensor:
        """Forward and backward of (x, y) with the loss scaled to ``len(x) / denom`` of the
        mean (``denom``: the global batch), so gradients add up to the full-batch mean; over
        ``optim.micro_batches`` slices when there are several. ``before_last`` is a context
        factory entered for all but the last micro-batch (DDP's no_sync). Returns the
        detached loss contribution. One micro-batch (the usual case) costs what a
        hand-written step does: forward, mean cross-entropy, backward."""
        if self.graph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        if self.micro == 1:
            return self._pass(model, x, y, len(x) / denom, device)
        k = min(self.micro, len(x))
        total = None
        for i, (xm, ym) in enumerate(zip(torch.tensor_split(x, k), torch.tensor_split(y, k))):
            ctx = before_last() if before_last is not None and i < k - 1 else contextlib.nullcontext()
            with ctx:
                part = self._pass(model, xm, ym, len(xm) / denom, device)
            total = part if total is None else total + part
        return total

    def _pass(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, share: float,
              device: torch.device) -> torch.Tensor:
        """One forward/backward: mean loss times ``share`` (skipped when it is 1)."""
        if self.amp_dtype is None:
            out = model(x)
        else:
            with torch.autocast(device_type=device.type, dtype=self.amp_dtype):
                out = model(x)
            out = out.float()
        loss = F.cross_entropy(out, y)
        if share != 1.0:
            loss = loss * share
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss.detach()

    def optimizer_step(self, opt: torch.optim.Optimizer) -> None:
        """One update (through the grad scaler when there is one)."""
        if self.scaler is not None:
            self.scaler.step(opt)
        else:
            opt.step()

    # ---------------------------------------------------------------- the interface
    def setup(self) -> None:
        """Build models and optimizers on the devices."""
        raise NotImplementedError

    def data_device(self) -> torch.device:
        """Where the dataset tensors should live (the first device by default)."""
        return torch.device(self.devices[0].torch_device)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step on a global batch; returns its mean loss, detached, unsynced."""
        raise NotImplementedError

    def eval_models(self) -> list[tuple[nn.Module, torch.device]]:
        """(model, device) pairs the test batches are split over."""
        raise NotImplementedError

    def primary_model(self) -> nn.Module:
        """The model whose parameters stand for the run (equivalence tests, checkpoints)."""
        return self.eval_models()[0][0]

    def set_train(self, mode: bool) -> None:
        for model, _ in self.eval_models():
            model.train(mode)

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Correct predictions on a test batch, split across the models' devices."""
        pairs = self.eval_models()
        first = pairs[0][1]
        correct = torch.zeros((), dtype=torch.long, device=first)
        for (model, dev), xs, ys in zip(pairs, torch.tensor_split(x, len(pairs)),
                                        torch.tensor_split(y, len(pairs))):
            if len(xs) == 0:
                continue
            with self.autocast(dev):
                pred = model(xs.to(dev, non_blocking=True)).argmax(dim=1)
            correct += (pred == ys.to(dev, non_blocking=True)).sum().to(first)
        return correct

    def read_timing(self) -> dict:
        """Seconds of the last metered step: {"step_s", "comm_s", "per_device": [...]}, read at
        the log interval; {} when nothing was metered. Each per_device row holds the step's
        ``breakdown`` (``gputui.breakdown.make``)."""
        return {}

    def reduce_metric(self, value: torch.Tensor) -> torch.Tensor:
        """Combine a metric over processes (identity for single-process strategies)."""
        return value

    def device_stats(self) -> list[dict]:
        """Per-device figures for StepMetrics at the log interval (memory from torch)."""
        out = []
        for d in self.devices:
            entry: dict[str, Any] = {"device": d.name}
            if d.kind == "cuda":
                entry["mem_alloc"] = torch.cuda.memory_allocated(d.index)
                entry["mem_reserved"] = torch.cuda.memory_reserved(d.index)
            out.append(entry)
        return out

    def memory_groups(self) -> list[tuple[str, torch.device, nn.Module, list]]:
        """(device name, torch device, model, optimizers) for each device this process holds
        training state on: one per device when every device has its own model and optimizer
        (replicas), else everything on the first device (one model spread over several, as
        model_parallel and dp, is counted whole there)."""
        pairs, opts = self.eval_models(), self.optimizers()
        if len(pairs) == len(opts) == len(self.devices) > 1:
            return [(d.name, dev, m, [o]) for d, (m, dev), o in zip(self.devices, pairs, opts)]
        return [(self.devices[0].name, pairs[0][1], self.primary_model(), opts)]

    def memory_rows(self, activations: dict[str, int] | None) -> list[dict]:
        """Every device's memory (see events.MemoryReport), gathered over the processes (a
        collective in multi-process strategies: call on every rank). ``activations``: an
        ActivationMeter's peaks by torch device, shared evenly by the virtual devices that
        share one torch device."""
        from gputui.training import memory

        groups = self.memory_groups()
        sharing = {}
        for _, dev, _, _ in groups:
            sharing[str(dev)] = sharing.get(str(dev), 0) + 1
        rows = []
        for name, dev, model, opts in groups:
            row: dict[str, Any] = {"device": name, **memory.counted(model, opts)}
            act = activations.get(str(dev)) if activations is not None else None
            row["activations"] = act // sharing[str(dev)] if act is not None else None
            row.update(memory.allocator(dev))
            rows.append(row)
        return self.gather_rows(rows)

    def gather_rows(self, rows: list[dict]) -> list[dict]:
        """Every process's rows, in rank order (this process's alone here)."""
        return rows

    def close(self) -> None:
        """Release resources (process groups, CUDA memory)."""

    # ---------------------------------------------------------------- checkpoints
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The strategy's optimizers, in a fixed order, for checkpoints. The default finds every
        optimizer attribute (or list of them) of the strategy; override when that is wrong."""
        found: list[torch.optim.Optimizer] = []
        for value in vars(self).values():
            items = value if isinstance(value, (list, tuple)) else [value]
            found += [o for o in items if isinstance(o, torch.optim.Optimizer)]
        return found

    def state_dict(self) -> dict[str, Any]:
        """Everything training needs to continue exactly: every model of ``eval_models()``
        (replicas, stages), every optimizer and the grad scaler. Tensors and plain containers
        only, so a checkpoint loads with ``weights_only=True``. Multi-process strategies call
        this on every rank (a sharded one gathers here); rank 0 writes the file."""
        return {"models": [m.state_dict() for m, _ in self.eval_models()],
                "optimizers": [o.state_dict() for o in self.optimizers()],
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what ``state_dict`` returned into the set-up models and optimizers."""
        models, opts = [m for m, _ in self.eval_models()], self.optimizers()
        if len(state["models"]) != len(models) or len(state["optimizers"]) != len(opts):
            raise ValueError(f"{len(state['models'])} model(s) and {len(state['optimizers'])} "
                             f"optimizer(s) saved, {len(models)} and {len(opts)} here")
        for model, saved in zip(models, state["models"]):
            model.load_state_dict(saved)
        for opt, saved in zip(opts, state["optimizers"]):
            opt.load_state_dict(saved)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
