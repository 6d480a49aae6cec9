#!/usr/bin/env python3
"""Regenerate the screenshots of the README and docs/: SVGs exported by the app itself
(Textual's ``export_screenshot``) into docs/, and the README's PNG of the run screen.

* docs/tui-setup.svg: the set-up screen with the quickstart preset, on this machine's devices.
* docs/tui-setup-error.svg: the same with a bad learning rate typed in (the CLI's message).
* docs/tui-run.svg: the run screen of a REAL run (quickstart, shrunk), after it finished.
* docs/tui-quit.svg: Ctrl+Q while a run is active: the app asks before leaving.
* docs/tui-run.png: tui-run.svg as a PNG, the picture a browser shows on the README (needs
  cairosvg, which needs the cairo library: `pip install cairosvg`; skipped with a line without).

Usage: python scripts/screenshots.py   (about a minute: it trains a small real run)
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputui.tui.app import make_app  # noqa: E402
from gputui.tui.screens.dialogs import ChoiceDialog  # noqa: E402
from gputui.tui.screens.run import RunScreen  # noqa: E402

DOCS = ROOT / "docs"
SIZE = (180, 48)  # the full layout (panels beside the plots) from 160x45 up
PRESET = ROOT / "presets" / "quickstart.toml"


async def wait_until(pilot, predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: timed out waiting for {what}")
        await pilot.pause(0.1)


def save(app, name: str, title: str) -> None:
    path = DOCS / name
    path.write_text(app.export_screenshot(title=title), encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}")


async def type_into(pilot, selector: str, text: str) -> None:
    await pilot.click(selector)
    await pilot.press("ctrl+a", "ctrl+k", *text)


async def setup_shots() -> None:
    app = make_app(preset=str(PRESET), runs_dir="runs")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(1.0)  # the first device reading
        app.clear_notifications()
        await pilot.pause()
        save(app, "tui-setup.svg", "gputui: set-up")
        await type_into(pilot, "#f-optim-lr", "-0.1")
        await pilot.pause()
        save(app, "tui-setup-error.svg", "gputui: set-up, a bad field")


async def run_shots() -> None:
    app = make_app(preset=str(PRESET), runs_dir="runs")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await type_into(pilot, "#f-data-train-size", "6000")
        await type_into(pilot, "#f-run-log-every", "4")
        await type_into(pilot, "#f-extra", "data.test_size=1000")
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, RunScreen), 30, "the run screen")
        screen = app.screen
        await wait_until(pilot, lambda: len(screen.query(".device-panel")) >= 2
                         and screen.events_handled > 20, 120, "the first steps")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceDialog), 10, "the dialog")
        await pilot.pause()
        save(app, "tui-quit.svg", "gputui: quitting with a run active")
        await pilot.press("escape")  # stay
        await wait_until(pilot, lambda: screen.ended, 300, "the end of the run")
        await pilot.pause(1.5)  # the summary read and a last device reading
        app.clear_notifications()
        await pilot.pause()
        save(app, "tui-run.svg", "gputui: a run")


def main() -> int:
    DOCS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gputui-shots-") as tmp:
        os.chdir(tmp)  # the run record goes to a throw-away ./runs, shown as "runs/<id>"
        asyncio.run(setup_shots())
        asyncio.run(run_shots())
    to_png(DOCS / "tui-run.svg", DOCS / "tui-run.png")
    return 0


def to_png(svg: Path, png: Path) -> None:
    """The SVG drawn as a PNG 1400 pixels wide (the fonts: whatever monospace cairo finds)."""
    try:
        import cairosvg  # type: ignore[import-not-found]
    except (ImportError, OSError) as exc:  # OSError: the cairo library itself is missing
        print(f"skipped {png.relative_to(ROOT)}: cairosvg cannot be used ({exc})")
        return
    cairosvg.svg2png(url=str(svg), write_to=str(png), output_width=1400)
    print(f"wrote {png.relative_to(ROOT)}")


if __name__ == "__main__":
    raise SystemExit(main())
