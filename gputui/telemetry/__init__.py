"""Device telemetry: NVML for GPUs (``nvml`` is the only module importing pynvml), psutil for
CPU virtual devices, and a sampler thread producing frozen DeviceSample events."""
