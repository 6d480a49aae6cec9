"""The child side: what runs in a run's processes (the run host and its ddp/fsdp ranks):
models, data, the loop, the strategies, checkpoints, the one record writer, the stop path
and the hand-off the parent gives them.

Importing this package does not import torch; the modules that need torch import it themselves.
"""
