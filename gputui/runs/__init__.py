"""The parent side: launching a run (the launcher and its hand-off), sweeps, history,
compare, export, the scaling prediction and the comm benchmark's driver.

Imports core, plan, hw and train (to name the child processes' entry points).
"""
