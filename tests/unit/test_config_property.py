"""Property tests of the config loader (hypothesis): random TOML documents and random override
strings either give a RunConfig, which is sane and round-trips through its TOML, or raise
ConfigError, never anything else."""

from __future__ import annotations

import dataclasses
import math

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputui.config import ConfigError, RunConfig, apply_overrides, load_preset, parse_assignment
from gputui.config_schema import SECTIONS

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
        cfg = load_preset(path)
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
        load_preset(path)
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
        cfg = apply_overrides(RunConfig(), overrides)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    _check_sane(cfg, tmp_path)
