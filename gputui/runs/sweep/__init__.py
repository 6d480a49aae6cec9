"""Sweeps (``gputui sweep``): a preset run over a grid of device counts x strategies x fast-path
axes, one run after another, with a manifest that lets a stopped sweep resume.

``runner``: the points, the manifest and the loop that runs them; ``grid``: the grid as typed
(each axis checked where its flag gives it); ``progress``: live bars or one line per change;
``repeats``: the table of a sweep run ``--repeat N`` times; ``manifest_size``: the bounds
derived from the size a manifest is read at.
"""
