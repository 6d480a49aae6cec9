"""Training processes spawned from the app write to a log file, never over the screen."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

CHILD = """
import multiprocessing as mp, sys
from pathlib import Path
from gputui.tui.spawnsafe import private_terminal, ready_for_spawn

def child():
    print("child-stdout"); print("child-stderr", file=sys.stderr)

if __name__ == "__main__":
    with private_terminal() as private:
        ready_for_spawn(Path(sys.argv[1]))
        p = mp.get_context("spawn").Process(target=child)
        p.start(); p.join()
        print("drawn-by-the-app", private, file=sys.__stderr__, flush=True)
    print("after-the-app", flush=True)
"""


def test_children_write_to_the_log_and_the_terminal_is_given_back(tmp_path):
    script, log = tmp_path / "child.py", tmp_path / "runs" / "app-output.log"
    script.write_text(CHILD)
    master, slave = pty.openpty()  # a real terminal, as the app has
    proc = subprocess.Popen([sys.executable, str(script), str(log)], stdin=slave, stdout=slave,
                            stderr=slave, cwd=Path(__file__).resolve().parents[2])
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child side closed
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=60) == 0, seen
    terminal = seen.decode(errors="replace")
    assert "drawn-by-the-app True" in terminal and "after-the-app" in terminal
    assert "child-stdout" not in terminal and "child-stderr" not in terminal
    assert log.read_text().split() == ["child-stdout", "child-stderr"]
