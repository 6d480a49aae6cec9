"""The one NVML entry point (the only module that imports pynvml).

Initialises lazily, never raises for a missing value (returns None, "not available"), and
explains in one sentence why no GPU is listed when there is no driver, library or device.
"""

from __future__ import annotations

import threading

from gputui.devices import GpuInfo

_lock = threading.Lock()
_state: dict = {"ready": None, "reason": ""}


def _init() -> bool:
    with _lock:
        if _state["ready"] is not None:
            return _state["ready"]
        try:
            import pynvml
        except ImportError:
            _state.update(ready=False, reason="the nvidia-ml-py package is not installed")
            return False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _state.update(ready=False, reason=f"no NVIDIA driver could be loaded ({exc})")
            return False
        _state.update(ready=True, reason="")
        return True


def cuda_gpus() -> tuple[list[GpuInfo], str]:
    """GPUs by CUDA ordinal, and the reason when there are none."""
    if not _init():
        return [], _state["reason"]
    import pynvml

    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        out.append(GpuInfo(i, str(pynvml.nvmlDeviceGetName(h))))
    return out, ("" if out else "the NVIDIA driver reports no GPU")
