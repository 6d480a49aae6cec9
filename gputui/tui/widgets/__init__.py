"""Widgets of the set-up and run screens."""
