"""The scaling prediction (``gputui predict``, docs/prediction.md), torch-free in this process.

``scaling``: the model (step time, speedup, efficiency and memory per device from measured
inputs); ``measure``: measuring those inputs (short real runs; the collectives as a step
issues them, timed in spawned ranks), kept per machine; ``cache``: where the kept figures live
and how each is keyed; ``inputs``: a kept figure as the user reads it (its name, whether to
trust it); ``comm_peak``: the all-reduce peak ``gputui bench-comm`` kept, the yardstick for a
run's achieved bandwidth.
"""
