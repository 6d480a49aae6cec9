"""Training: models, data, the loop, strategies, the launcher and the run record.

Importing this package does not import torch; the modules that need torch import it themselves.
"""
