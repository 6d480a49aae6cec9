"""Property tests of the config loader (hypothesis): random TOML documents and random override
strings either give a RunConfig, which is sane and round-trips through its TOML, or raise
ConfigError, never anything else."""

from __future__ import annotations

import dataclasses
import math

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputui.core.config import ConfigError, RunConfig, load_preset, parse_assignment
from gputui.core.config_schema import SECTIONS
from gputui.runs.prepare import load_checked, override_checked
from gputui.tui.form import build as form_build, FIELDS as FORM_FIELDS
from gputui.tui.widgets.param_form import ConfigFieldValidator

KNOWN = {table: [f.name for f in dataclasses.fields(cls)] for table, cls in SECTIONS.items()}
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                min_size=0, max_size=12)
scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True),
    st.booleans(), names, st.sampled_from(["cpu", "cpu*2", "0,1", "all", "²", "١", "cpu*99",
                                            "single", "scratch", "lenet", "mlp", "synthetic",
                                            "../x", "os.system", "fp16", "bf16", ""]))
values = st.one_of(scalars, st.lists(scalars, max_size=4),
                   st.dictionaries(names, scalars, max_size=3))
# Device choices built from the tokens users type, digits of other scripts among them.
specs = st.one_of(st.lists(st.sampled_from(["0", "1", "7", "²", "١", "٣", ",", "cpu", "cuda:",
                                            "*", "all", " ", "-"]), max_size=4).map("".join),
                  names)
tables = st.one_of(st.sampled_from(list(KNOWN)), names)


@st.composite
def documents(draw) -> dict:
    """A TOML-shaped dict mixing real tables and keys with made-up ones."""
    doc: dict = {}
    for table in draw(st.lists(tables, max_size=4, unique=True)):
        keys = st.one_of(st.sampled_from(KNOWN.get(table) or ["x"]), names)
        doc[table] = draw(st.dictionaries(keys, values, max_size=4))
    if draw(st.booleans()):
        doc[draw(names) or "k"] = draw(scalars)  # a top-level key that is not a table
    if draw(st.booleans()):  # device choices are parsed further: give them more tries
        doc["devices"] = {"spec": draw(specs)}
    return doc


def _check_sane(cfg: RunConfig, tmp_path) -> None:
    for section in cfg.to_dict().values():
        for value in section.values():
            if isinstance(value, float):
                assert not math.isnan(value)
    again = tmp_path / "again.toml"
    again.write_text(cfg.to_toml(), encoding="utf-8")
    assert load_preset(again) == cfg  # what is accepted is saved and read back unchanged


@SETTINGS
@given(doc=documents())
def test_random_documents_give_a_config_or_config_error(tmp_path, doc):
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    try:
        cfg = load_checked(path).config
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path))
        return
    _check_sane(cfg, tmp_path)


@SETTINGS
@given(text=st.text(max_size=80))
def test_random_text_gives_a_config_or_config_error(tmp_path, text):
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_checked(path)
    except ConfigError as exc:
        assert "\n" not in str(exc)


keys = st.one_of(st.just("devices.spec"), st.sampled_from([f"{t}.{k}" for t, ks in KNOWN.items() for k in ks]),
                 names, st.builds(lambda a, b: f"{a}.{b}", names, names))
raw_values = st.one_of(names, specs, scalars.map(lambda v: tomli_w.dumps({"v": v})[4:].strip()
                                          if not isinstance(v, float) or math.isfinite(v)
                                          else str(v)))


@SETTINGS
@given(pairs=st.lists(st.tuples(keys, raw_values), min_size=1, max_size=4))
def test_random_overrides_give_a_config_or_config_error(tmp_path, pairs):
    try:
        overrides = []
        for key, raw in pairs:
            k, v = parse_assignment(f"{key}={raw}")
            overrides.append((f"--set {key}={raw}", k, v))
        cfg = override_checked(RunConfig(), overrides).config
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    _check_sane(cfg, tmp_path)


# ------------------------------------------------------------------ the app's form fields
FEW = settings(max_examples=30, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
typed = st.one_of(st.text(max_size=24),
                  st.lists(st.sampled_from(["[", "]", "/", "[/]", "[b]", "[/x]", "[@click=quit]",
                                            "\\[", "=", ".", "1", "0.5", "-", "e9", " ", "cpu*2",
                                            "\n", "\x1b", "🙂"]), max_size=6).map("".join))


@FEW
@given(values=st.dictionaries(st.sampled_from([f.key for f in FORM_FIELDS if f.kind == "input"]),
                              typed, max_size=6),
       extra=typed)
def test_typed_form_values_give_a_config_or_one_line_shown_as_text(values, extra):
    """What the form's validator and build make of any typed text: a config, or one-line
    messages which a markup=False Static (the form's error line) shows verbatim."""
    from textual.widgets import Static

    base = RunConfig()
    for key, text in values.items():
        message = ConfigFieldValidator(key).validate(text)
        for line in message.failure_descriptions:
            assert "\n" not in line
            assert str(Static(line, markup=False).render()) == line  # never markup
    result = form_build(base, values, "cpu", "single", extra)
    assert result.ok or result.field_errors or result.error
    for line in [*result.field_errors.values(), result.error]:
        assert "\n" not in line and str(Static(line, markup=False).render()) == line


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(typed, min_size=len(FORM_FIELDS), max_size=len(FORM_FIELDS)))
def test_the_real_form_takes_any_typed_text(texts):
    """Every input of the running app's form given drawn text: the app keeps running and each
    field's error line shows its message as plain text."""
    import asyncio
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tui"))
    from scripted import ScriptedLauncher, fixed_inventory
    from textual.widgets import Input, Static

    from gputui.tui.app import make_app
    from gputui.tui.widgets.param_form import ParamForm

    async def drive() -> None:
        app = make_app(launcher=ScriptedLauncher(), inventory=fixed_inventory(), presets=[])
        async with app.run_test(size=(140, 44)) as pilot:
            await pilot.pause()
            form = app.screen.query_one(ParamForm)
            inputs = [f for f in FORM_FIELDS if f.kind == "input"] + [None]
            for spec, text in zip(inputs, texts):
                app.screen.query_one(f"#{spec.dom_id if spec else 'f-extra'}", Input).value = text
            await pilot.press("ctrl+r")  # the --set text is read when a run starts
            await pilot.pause(0.2)
            assert app.is_running and app.return_code is None
            for spec in inputs[:-1]:
                shown = form.error_text(spec.key)
                if shown:
                    label = app.screen.query_one(f"#{spec.dom_id}-error", Static)
                    assert str(label.render()) == shown

    asyncio.run(drive())


# ------------------------------------------------------------------ the presets folder
KINDS = ("toml", "bytes", "fifo", "dir", "zero", "dangling", "loop")


@FEW
@given(files=st.lists(st.tuples(st.text("abcxyz-_.", min_size=1, max_size=6),
                                st.sampled_from(KINDS), documents(),
                                st.binary(max_size=64)), max_size=6))
def test_any_presets_folder_is_listed_without_crashing_or_blocking(files):
    import contextlib
    import io
    import json
    import os
    import tempfile
    from pathlib import Path

    from gputui import cli

    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "presets"
        folder.mkdir()
        made = set()
        for stem, kind, doc, raw in files:
            path = folder / f"{stem}.toml"
            if os.path.lexists(path):
                continue
            if not stem.startswith("."):  # hidden files are not presets
                made.add(stem)
            if kind == "toml":
                path.write_text(tomli_w.dumps(doc), encoding="utf-8")
            elif kind == "bytes":
                path.write_bytes(raw)
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "dir":
                path.mkdir()
            elif kind == "zero":
                path.symlink_to("/dev/zero")
            elif kind == "dangling":
                path.symlink_to(folder / "missing")
            else:
                path.symlink_to(path)  # a link to itself: ELOOP
        out = io.StringIO()
        try:
            os.chdir(tmp)
            with contextlib.redirect_stdout(out):
                code = cli.main(["presets", "--json"])
        finally:
            os.chdir(here)
    assert code == 0
    listed = {p["name"]: p for p in json.loads(out.getvalue())}
    mine = {name for name, p in listed.items() if p["path"].startswith(str(folder))}
    assert mine == made
    assert all("\n" not in p["problem"] for p in listed.values())
    assert listed["quickstart"]["problem"] == "" or "quickstart" in made
