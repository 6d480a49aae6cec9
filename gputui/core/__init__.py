"""The leaves: config schema and loading, device specs (parsing), events, the run
record, presets, the strategy registry, safe file writing and reading.

Nothing here imports torch, Textual, NVML or any other gputui layer; every other
layer may import it (tests/unit/test_import_graph.py holds this).
"""
