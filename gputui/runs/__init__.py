"""The parent side (torch-free in this process): launching a run (``launcher``, ``prepare``),
following and listing records (``follow``, ``history``, ``ids``, ``runlock``), energy, export,
``verify``, and the topics grown into subpackages: ``predict/``, ``compare/``, ``sweep/``,
``tune/`` and ``forecast/`` (``gputui plan``).

Imports core, plan, hw and train (to name the child processes' entry points).
"""
