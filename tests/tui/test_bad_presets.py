"""Presets that are not what they should be, chosen in the app with the real keys: a fifo, a
symlink to /dev/zero, a folder, a binary file and a dangling link named *.toml. Each gives an
error notification naming the file; the app keeps running with the form as it was."""

from __future__ import annotations

import os

from scripted import wait_until
from textual.widgets import Input, OptionList

from gputui.tui.app import make_app

SIZE = (140, 44)


def bad_presets(folder):
    folder.mkdir()
    os.mkfifo(folder / "afifo.toml")
    (folder / "bzero.toml").symlink_to("/dev/zero")
    (folder / "cdir.toml").mkdir()
    (folder / "dbinary.toml").write_bytes(bytes(range(256)))
    (folder / "edangling.toml").symlink_to(folder / "nowhere.toml")
    return {"afifo": "fifo (named pipe), not a file", "bzero": "character device, not a file",
            "cdir": "folder, not a file", "dbinary": "is not UTF-8 text",
            "edangling": "which does not exist"}


async def test_choosing_a_bad_preset_is_an_error_notification(tmp_path, inventory, presets):
    expected = bad_presets(tmp_path / "presets")
    listed = presets + sorted((tmp_path / "presets").iterdir())
    app = make_app(inventory=inventory, presets=listed)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        epochs = app.screen.query_one("#f-run-epochs", Input).value
        for i, path in enumerate(listed[1:], start=1):
            app.screen.query_one("#preset-list", OptionList).focus()
            await pilot.press("home", *["down"] * i, "enter")
            await wait_until(pilot, lambda: any(path.name in n.message
                                                for n in app._notifications),
                             what=f"the notification about {path.name}")
            note = next(n for n in app._notifications if path.name in n.message)
            assert note.severity == "error" and expected[path.stem] in note.message
            assert app.is_running and app.return_code is None
        assert app.screen.query_one("#f-run-epochs", Input).value == epochs  # form unchanged
