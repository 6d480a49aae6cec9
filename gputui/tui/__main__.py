"""``python -m gputui.tui [PRESET]``: the app without going through the CLI."""

import sys

from gputui.tui.app import run_tui
from gputui.tui.lifecycle import leave

leave(run_tui(sys.argv[1] if len(sys.argv) > 1 else None))
