"""Comparing recorded runs (``gputui compare``, the app's Compare): speed, speedup against the
matching one-device run, scaling efficiency, communication, energy and accuracy.

``table``: the rows read from the records and the tables and summary lines made of them;
``cells``: one figure as text with its noise; ``waterfall``: the ideal speedup to the measured
one, cause by cause; ``export``: the tables as CSV, Markdown or JSON, the plots (curves,
speedup, waterfall) and TensorBoard scalars.
"""
