"""The screens' widgets: the set-up's pickers, form and preset panel; a run's device panels,
figures, status, log, epoch table and plots; the history's rows, the comparison's overlaid
curves and the plan's memory-against-speed view."""
