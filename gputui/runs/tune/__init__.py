"""``gputui tune``: rank candidate configurations by the prediction, then confirm the best few
by short real runs.

``space``: the candidates and their predicted speed; ``tuner``: the engine (measure what the
prediction lacks within the budget, confirm); ``result``: predicted against measured, the
choice and its preset.
"""
