"""Comparison on recorded runs (speedup, matching baseline, damaged records) and every export
parsed back (CSV, JSON, Markdown, PNG, TensorBoard's message)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import sys

import pytest

from gputui import cli
from gputui.runs.compare import export
from gputui.runs.compare.table import TABLE_COLUMNS, compare, summary_lines, table_rows
from run_records import truncate_record, write_record


@pytest.fixture
def runs(tmp_path):
    base = tmp_path / "runs"
    write_record(base, "20260101-100000-exp-b256", "single", 1, batch=256, sps=1000, windows=2)
    write_record(base, "20260101-100100-exp-b128", "single", 1, batch=128, sps=800, windows=2)
    write_record(base, "20260101-100200-exp-s256", "scratch", 1, batch=256, sps=900, windows=2)
    write_record(base, "20260101-100300-exp-weak", "scratch", 2, batch=256, scale=True,
                 sps=1800, comm=0.25, windows=2)
    write_record(base, "20260101-100400-exp-strong", "scratch", 2, batch=256, sps=1200,
                 comm=0.1, windows=2)
    write_record(base, "20260101-100500-exp-mlp", "scratch", 2, batch=256, model="mlp",
                 sps=5000, windows=2)
    torn = write_record(base, "20260101-100600-exp-torn", "scratch", 2, batch=256, sps=1700,
                        epochs=3)
    truncate_record(torn, keep_lines=4)  # one epoch survived, then a torn line
    cut = write_record(base, "20260101-100700-exp-cut", "scratch", 2, batch=256)
    truncate_record(cut, keep_lines=1)  # nothing but RunStarted
    return base


def by_id(items):
    return {it.row.id.rsplit("-", 1)[1]: it for it in items}


def test_speedup_against_the_matching_one_device_run(runs):
    items = by_id(compare(sorted(p for p in runs.iterdir()), runs))
    weak = items["weak"]  # 512 over two devices: 256 per device, as the 256 single run
    assert weak.baseline.endswith("b256") and weak.baseline_kind == "same batch per device"
    assert weak.speedup == pytest.approx(1.8) and weak.efficiency == pytest.approx(0.9)
    assert weak.comm_share == pytest.approx(0.25)
    strong = items["strong"]  # 256 over two: 128 per device, as the 128 single run
    assert strong.baseline.endswith("b128") and strong.speedup == pytest.approx(1.5)
    assert items["b256"].speedup == pytest.approx(1.0) and items["b256"].baseline.endswith("b256")
    # a one-device scratch run is measured against single, not against itself
    assert items["s256"].baseline.endswith("b256") and items["s256"].speedup == pytest.approx(0.9)
    assert items["mlp"].speedup is None and items["mlp"].baseline == ""  # no mlp baseline
    (hint,) = [ln for ln in summary_lines(list(items.values())) if "mlp" in ln]
    assert hint.endswith("no speedup (run the same preset with --devices cpu --strategy single)")
    flags = hint.split("preset with ")[1].rstrip(")").split()
    assert cli.main(["run", "quickstart", *flags, "--dry-run"]) == 0  # the hint runs here


def test_global_batch_match_when_no_per_device_match(tmp_path):
    base = tmp_path / "runs"
    write_record(base, "20260101-100000-exp-b256", "single", 1, batch=256, sps=1000)
    run = write_record(base, "20260101-100400-exp-strong", "scratch", 2, batch=256, sps=1200)
    (item,) = compare([run], base)
    assert item.baseline_kind == "same global batch" and item.speedup == pytest.approx(1.2)
    assert item.efficiency == pytest.approx(0.6)


def test_truncated_records_compare_without_breaking(runs):
    items = by_id(compare([runs / "20260101-100600-exp-torn", runs / "20260101-100700-exp-cut",
                           runs / "20260101-100300-exp-weak"], runs))
    torn = items["torn"]
    assert torn.row.status == "incomplete" and torn.row.epochs_done == 1
    # a run that did not finish has no speed figures (issue 24), but its curves
    assert torn.speedup is None and torn.row.samples_per_s is None
    assert torn.row.no_speed.startswith("incomplete") and len(torn.acc_curve) == 1
    cut = items["cut"]
    assert cut.speedup is None and cut.row.samples_per_s is None and cut.loss_curve == []
    assert items["weak"].speedup == pytest.approx(1.8)


def test_curves_for_overlay(runs):
    (item,) = compare([runs / "20260101-100300-exp-weak"], runs)
    assert [e for e, _ in item.acc_curve] == [1, 2]
    # epoch progress, loss: two log windows an epoch
    assert item.loss_curve == [(0.5, 2.0), (1.0, 2.0), (1.5, 1.0), (2.0, 1.0)]


@pytest.fixture
def items(runs):
    return compare(sorted(p for p in runs.iterdir()), runs)


def test_csv_parses_back(items):
    text = export.render(table_rows(items), TABLE_COLUMNS, "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(items) and list(rows[0]) == list(TABLE_COLUMNS)
    weak = next(r for r in rows if r["id"].endswith("weak"))
    # scratch's 2 CPU virtual devices run in one process: its 1.8x is flagged, not a result
    assert weak["speedup"] == "flagged" and weak["check"] == "FLAGGED" and weak["devices"] == "2"
    strong = next(r for r in rows if r["id"].endswith("strong"))  # the same: 1.5x
    assert strong["speedup"] == "flagged" and strong["efficiency"] == "flagged"
    b256 = next(r for r in rows if r["id"].endswith("b256"))
    assert float(b256["speedup"]) == pytest.approx(1.0) and b256["check"] == ""
    assert next(r for r in rows if r["id"].endswith("cut"))["speedup"] == ""


def test_json_parses_back(items):
    data = json.loads(export.to_json([it.to_dict() for it in items]))
    weak = next(d for d in data if d["id"].endswith("weak"))
    assert weak["speedup"] == pytest.approx(1.8) and weak["acc_curve"] == [[1, 0.9], [2, 0.9]]
    assert any("one process" in f for f in weak["flags"])  # the JSON keeps figure and reason


def test_markdown_table_shape(items):
    text = export.render(table_rows(items), TABLE_COLUMNS, "md")
    lines = text.splitlines()
    assert len(lines) == len(items) + 2
    assert all(ln.startswith("|") and ln.endswith("|") for ln in lines)
    assert {ln.count("|") for ln in lines} == {len(TABLE_COLUMNS) + 1}
    assert set(lines[1]) <= set("|-:")
    # scratch@cpu*2 flagged; a plain figure with its noise beside it
    assert "flagged" in text and "1.00x ±0.04" in text and "100.0% ±4%" in text


def test_png_plots(items, tmp_path):
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(export.ExportError, match="pip install 'gputui\\[plots\\]'"):
            export.plot_curves(items, tmp_path / "c.png")
        pytest.skip("matplotlib is not installed: checked the one-line message instead")
    for path in (export.plot_curves(items, tmp_path / "c.png"),
                 export.plot_speedup(items, tmp_path / "s.png")):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_missing_extras_name_the_install_the_readme_gives(runs, tmp_path, monkeypatch):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]  # the README and the pages under docs/
    readme = "".join(p.read_text() for p in [root / "README.md", *(root / "docs").glob("*.md")])
    for module in ("tensorboardX", "torch.utils.tensorboard", "matplotlib"):
        monkeypatch.setitem(sys.modules, module, None)  # an import of it now fails
    with pytest.raises(export.ExportError) as tb:
        export.to_tensorboard([runs / "20260101-100300-exp-weak"], tmp_path / "tb")
    with pytest.raises(export.ExportError) as png:
        export.plot_curves(compare([runs / "20260101-100300-exp-weak"], runs), tmp_path / "c.png")
    for exc, extra in ((tb.value, "tensorboard"), (png.value, "plots")):
        hint = f".venv/bin/pip install -e '.[{extra}]'"
        assert str(exc).endswith(f"pip install 'gputui[{extra}]' (in a clone: {hint})")
        assert hint in readme


def test_tensorboard_export_or_its_message(runs, tmp_path):
    dirs = [runs / "20260101-100300-exp-weak"]
    has_tb = any(importlib.util.find_spec(m) for m in ("tensorboardX", "tensorboard"))
    if not has_tb:
        with pytest.raises(export.ExportError, match=r"pip install 'gputui\[tensorboard\]'"):
            export.to_tensorboard(dirs, tmp_path / "tb")
        return
    (out,) = export.to_tensorboard(dirs, tmp_path / "tb")
    (path,) = [p for p in out.iterdir() if p.name.startswith("events.out.tfevents")]
    if importlib.util.find_spec("tensorboardX") is None:
        return
    from tensorboardX.proto.event_pb2 import Event

    scalars, data = {}, path.read_bytes()
    while data:  # TFRecord: u64 length, u32 crc, payload, u32 crc
        n = int.from_bytes(data[:8], "little")
        ev = Event.FromString(data[12:12 + n])
        for v in ev.summary.value:
            scalars.setdefault(v.tag, []).append((ev.step, round(v.simple_value, 4)))
        data = data[12 + n + 4:]
    # two 10-step windows per epoch
    assert scalars["train/loss"] == [(10, 2.0), (20, 2.0), (30, 1.0), (40, 1.0)]
    assert scalars["test/accuracy"] == [(1, 0.9), (2, 0.9)]
    assert [s for _, s in scalars["epoch/samples_per_s"]] == [1800.0, 1800.0]


def test_cli_compare_formats(runs, tmp_path, capsys):
    out = tmp_path / "cmp.csv"
    assert cli.main(["compare", "weak", "b256", "--runs-dir", str(runs), "--format", "csv",
                     "-o", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["id"][-4:] for r in rows] == ["weak", "b256"]
    assert cli.main(["compare", "weak", "--runs-dir", str(runs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["speedup"] == pytest.approx(1.8)
    assert cli.main(["compare", "weak", "strong", "--runs-dir", str(runs)]) == 0
    text = capsys.readouterr().out
    assert "1.80x" in text and "1.50x" in text and "(same batch per device)" in text


def test_cli_compare_bad_input(runs, capsys):
    assert cli.main(["compare", "nosuchrun", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run 'nosuchrun'" in err
    assert cli.main(["compare", "--runs-dir", str(runs)]) == 2
    assert cli.main(["compare", "--sweep", "nope", "--runs-dir", str(runs)]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err


def test_step_breakdown_shares_in_the_table_and_every_export(tmp_path):
    from gputui.core.breakdown import make

    base = tmp_path / "runs"
    warm = make(1.0, 0.0, 1.0, 0.0)  # the first metered step (warm-up): left out
    steady = make(span_s=0.09, data_s=0.01, compute_s=0.05, optimizer_s=0.01,
                  comm_exposed_s=0.02, comm_overlap_s=0.01)  # host 0.01
    run = write_record(base, "20260101-100000-exp-ddp", "ddp", 2, breakdowns=[warm, steady])
    (item,) = compare([run], base)
    row = table_rows([item])[0]
    assert row["compute_share"] == pytest.approx(0.5)
    assert row["comm_exposed_share"] == pytest.approx(0.2)
    assert row["comm_overlap_share"] == pytest.approx(0.1)
    assert row["optimizer_share"] == pytest.approx(0.1) and row["data_share"] == pytest.approx(0.1)
    assert row["host_share"] == pytest.approx(0.1)
    csv_row = next(csv.DictReader(io.StringIO(export.render([row], TABLE_COLUMNS, "csv"))))
    assert float(csv_row["comm_exposed_share"]) == pytest.approx(0.2)
    md = export.render([row], TABLE_COLUMNS, "md")
    assert "| 20% |" in md and "| 50% |" in md
    data = json.loads(export.to_json([item.to_dict()]))[0]
    assert data["breakdown"]["comm_exposed_s"] == pytest.approx(0.02)
    assert summary_lines([item])[0].startswith("step breakdown, as shares of a metered step")


def test_compare_names_each_collective_a_step_took():
    """A record's steps name their collectives per rank (tp's all-reduces, fsdp's all-gathers
    ...): compare gives each kind's mean over the ranks and metered steps, and says it."""
    from gputui.core.events import StepMetrics
    from gputui.core.events import DeviceStep
    from gputui.runs.compare.table import read_hw_figures

    def step(n, tp_ms, ag_ms):
        rows = tuple(DeviceStep(f"cpu:{r}", rank=r, collectives={
            "tp all-reduce": tp_ms[r] / 1000, "fsdp all-gather": ag_ms[r] / 1000})
            for r in range(2))
        return StepMetrics(epoch=1, step=n, global_step=n, steps_per_epoch=4, loss=1.0,
                           samples_per_s=10.0, step_time_s=0.1, lr=0.1, per_device=rows)

    got = read_hw_figures("", events=[step(1, (2, 4), (1, 1)), step(2, (4, 6), (3, 3))])
    assert got["collectives"] == pytest.approx({"fsdp all-gather": 0.002,
                                                "tp all-reduce": 0.004})
    assert read_hw_figures("", events=[])["collectives"] is None


@pytest.mark.parametrize("flag,value,expected", [
    ("--target-loss", "inf", "'inf' is not a finite number"),
    ("--target-loss", "nan", "'nan' is not a finite number"),
    ("--target-loss", "-1", "--target-loss must be a loss above 0; got -1"),
    ("--target-acc", "-inf", "'-inf' is not a finite number"),
])
def test_a_target_that_can_never_be_met_is_refused(runs, capsys, flag, value, expected):
    try:
        code = cli.main(["compare", "--runs-dir", str(runs), "b256", "strong", f"{flag}={value}"])
    except SystemExit as exc:  # argparse's own refusal, one line through cli's Parser
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
