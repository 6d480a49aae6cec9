"""The hardware: GPU discovery (``discovery``), NVML (``nvml``, the only module importing
pynvml), CUDA ordering, psutil readings for CPU virtual devices, and a sampler thread producing
frozen DeviceSample events.

Imports only ``gputui.core``; importing it does not import torch.
"""
