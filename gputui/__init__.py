"""gputui: a terminal experiment runner for multi-GPU training."""

__version__ = "0.1.0"
