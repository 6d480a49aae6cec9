"""The activation meter's cost: one LeNet step (batch 256, CPU) under
``gputui.train.memory.ActivationMeter`` against the same step without it, in the same
process, alternating; medians of 15 each. The loop meters only a run's first step.

    .venv/bin/python benchmarks/bench_memory_meter.py
"""
import statistics, time, torch
from torch.nn import functional as F
from gputui.train import memory
from gputui.train.models import build_model
m = build_model("lenet", 1, 28, 10, seed=0)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))
def step():
    opt.zero_grad(set_to_none=True); F.cross_entropy(m(x), y).backward(); opt.step()
for _ in range(5): step()
plain, metered = [], []
for _ in range(15):
    t = time.perf_counter(); step(); plain.append(time.perf_counter() - t)
    t = time.perf_counter()
    with memory.ActivationMeter(): step()
    metered.append(time.perf_counter() - t)
p, q = statistics.median(plain), statistics.median(metered)
print(f"plain {p*1e3:.2f} ms, metered {q*1e3:.2f} ms, ratio {q/p:.3f}")
