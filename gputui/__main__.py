"""``python -m gputui``."""

from gputui.cli import main

# The guard matters: spawned training processes re-import the main module as __mp_main__.
if __name__ == "__main__":
    raise SystemExit(main())
