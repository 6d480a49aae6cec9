"""``dp``: ``torch.nn.DataParallel``, one process, the batch scattered over the CUDA devices.

Each step DataParallel replicates the model from the first device onto the others, scatters
the batch, runs the replicas in threads and gathers the outputs on the first device, where the
loss is taken; backward sums every replica's gradients into the first device's parameters.
Only what differs from ``single`` lives here (its step runs through ``self.wrapped``): the
wrapper, and its honest report on CPU.

DataParallel has no CPU mode. On CPU devices torch's DataParallel, finding no accelerator, just
calls the module, so the run trains without replication on one CPU device, and says so.
"""

from __future__ import annotations

import torch
from torch import nn

from gputui.core import breakdown
from gputui.core.events import DeviceStep, StepReport
from gputui.train.strategies.meter import Clock, Meter
from gputui.train.strategies.single import Single


def scatter_sizes(total: int, n: int) -> list[int]:
    """Examples per device as DataParallel's scatter cuts a batch (``Tensor.chunk``: chunks of
    ceil(total/n), so a small batch can leave the last devices idle)."""
    per = -(-total // n)
    return [max(0, min(per, total - i * per)) for i in range(n)]


def accelerator_present() -> bool:
    """Whether DataParallel will find an accelerator: its own (private) check where torch
    still has it, else the public CUDA one."""
    try:
        from torch._utils import _get_available_device_type
    except ImportError:
        return torch.cuda.is_available()
    return _get_available_device_type() is not None


class DeviceMarks(Clock):
    """A clock over every GPU of a DataParallel step: each mark is one CUDA event per
    device, recorded on that device's current stream (no sync; read at the log interval), so
    each device's part of the step is timed on its own clock. ``seconds`` reads the first
    device's, as the meter's spans expect."""

    def __init__(self, devices: list[torch.device]):
        super().__init__(devices[0])
        self.devices = devices

    def mark(self) -> tuple:
        out = []
        for d in self.devices:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(d))
            out.append(ev)
        return tuple(out)

    def seconds(self, start, end) -> float:
        return self.seconds_on(0, start, end)

    def seconds_on(self, i: int, start, end) -> float:
        end[i].synchronize()
        return start[i].elapsed_time(end[i]) / 1000.0


def other_devices(meter: Meter, n: int) -> list[breakdown.Breakdown]:
    """The breakdowns of devices 2..n of a metered DataParallel step, each on its own clock
    (``meter.clock``, a DeviceMarks): compute is the step's compute span on that device's
    stream (its replica's forward and backward, and the copies DataParallel makes to and from
    it, which are not split out: comm None), then the wait for the first device's update."""
    clock = meter.clock
    assert isinstance(clock, DeviceMarks)
    begin, backward_end = meter.compute.marks[0]
    return [breakdown.make(clock.seconds_on(i, meter.start, meter.end), meter.data_s,
                           clock.seconds_on(i, begin, backward_end), 0.0,
                           comm_exposed_s=None, comm_overlap_s=None,
                           wait_s=clock.seconds_on(i, backward_end, meter.end))
            for i in range(1, n)]


class DataParallelStrategy(Single):
    """The model on the first device, wrapped in ``nn.DataParallel`` over every chosen GPU."""

    name = "dp"
    cuda: bool  # DataParallel replicates over the GPUs (False: CPU devices, no replication)

    def setup(self) -> None:
        super().setup()  # the model, optimizer and scaler on the first device, as single has
        self.wrapped = self.lean(self.model)  # eager: see compiles()
        self.cuda = self.devices[0].kind == "cuda"
        if self.cuda:
            ids = [d.index for d in self.devices]
            self.wrapped = nn.DataParallel(self.model, device_ids=ids, output_device=ids[0])
            self.meter = Meter([self.device], clock=DeviceMarks(self.torch_devices))
        elif not accelerator_present():
            # The same call as on GPUs; with no accelerator DataParallel forwards to the module.
            self.wrapped = nn.DataParallel(self.model)
        # else: CPU devices on a GPU machine; DataParallel would grab the GPUs, so the step
        # runs through the plain model (single's default)
        if not self.cuda:
            idle = [d.name for d in self.devices[1:]]
            self.notes.append(
                f"DataParallel has no CPU mode: it ran without replication, the whole batch on "
                f"one CPU device ({self.devices[0].name})"
                + (f"; {', '.join(idle)} stayed idle" if idle else ""))
        elif any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.model.modules()):
            self.notes.append("DataParallel: BatchNorm normalises each device's share of the "
                              "batch, and keeps the first device's running statistics")

    def compiles(self) -> bool:
        """DataParallel replicates its module on every step, which torch.compile does not
        trace: a dp run trains eager (and says so)."""
        if self.cfg.run.compile != "off":
            self.notes.append("run.compile does not apply to dp: DataParallel replicates the "
                              "model every step, which torch.compile does not trace; eager")
        return False

    def step_report(self) -> StepReport | None:
        """The metered step: on GPUs every device's breakdown, from the CUDA events of its own
        stream (``DeviceMarks``), and its share of the examples; DataParallel's copies stay in
        compute (comm None). On the CPU the first device trained alone."""
        m = self.meter
        if not m.measured:
            return None
        step = m.step_s()
        comm = None if self.cuda else 0.0
        first = breakdown.make(step, m.data_s, m.compute.seconds(), m.optimizer.seconds(),
                               comm, comm)
        names = [d.name for d in self.devices]
        if not self.cuda:
            rows = [DeviceStep(names[0], samples=m.samples, compute_s=step, breakdown=first)]
            rows += [DeviceStep(name) for name in names[1:]]
            return StepReport(step_s=step, comm_s=None, devices=tuple(rows))
        k = min(self.cfg.optim.micro_batches, m.samples)
        shares = [0] * len(names)
        for j in range(k):  # micro-batch sizes as tensor_split cuts them in forward_backward
            part = m.samples // k + (1 if j < m.samples % k else 0)
            for i, size in enumerate(scatter_sizes(part, len(names))):
                shares[i] += size
        parts = [first, *other_devices(m, len(names))]
        return StepReport(step_s=step, comm_s=None, devices=tuple(
            DeviceStep(name, samples=n, breakdown=bd) for name, n, bd in zip(names, shares, parts,
                                                                          strict=True)))

    def models(self) -> list[nn.Module]:
        """The module a step calls (DataParallel around the model, or the model flattened):
        checkpoints hold its state dict, parameter names as it gives them."""
        return [self.wrapped]

    def primary_model(self) -> nn.Module:
        return self.model


STRATEGY = DataParallelStrategy
