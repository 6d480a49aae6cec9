"""Training strategies: one module each behind ``base.Strategy``; ``registry`` is torch-free."""

from gputui.core import registry

__all__ = ["registry"]
