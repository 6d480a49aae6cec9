"""The Textual app (``gputui`` with no arguments). The core never imports this package."""
