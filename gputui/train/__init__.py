"""The child side: what runs in the training processes (the worker, the ddp agent and its
ranks, the warm worker): models, data, the loop, the strategies, checkpoints, the one
record writer, the stop path and the hand-off the parent gives them.

Importing this package does not import torch; the modules that need torch import it themselves.
"""
