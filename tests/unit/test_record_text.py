"""Text from a record or a folder name is shown as text, never as Rich markup: a run named
``[/bold]q`` is listed (it raised MarkupError), a bracketed folder name keeps its brackets so
the id shown can be typed back."""

from __future__ import annotations

from gputui import cli
from run_records import write_record

ODD_NAME = "[/bold]q"
ODD_ID = "20260101-000000-[b]x[i]-aaaa"


def odd_record(runs, run_id: str, name: str) -> None:
    """A record whose name holds markup that is not even balanced: today's config rules refuse
    '/' in a name, but records written before (or by hand) hold one."""
    run_dir = write_record(runs, run_id, name="placeholder")
    for file in ("config.toml", "events.jsonl"):
        path = run_dir / file
        path.write_text(path.read_text().replace("placeholder", name))


def test_runs_table_shows_names_and_ids_literally(tmp_path, capsys):
    runs = tmp_path / "runs"
    odd_record(runs, "20260101-000000-q-aaaa", ODD_NAME)
    write_record(runs, ODD_ID)
    code = cli.main(["runs", "--runs-dir", str(runs)])
    out = capsys.readouterr()
    assert code == 0, out.err
    text = out.out.replace("\n", "")
    assert ODD_NAME in out.out and "[b]x[i]" in text


def test_the_id_shown_can_be_typed_back(tmp_path, capsys):
    runs = tmp_path / "runs"
    odd_record(runs, ODD_ID, ODD_NAME)
    assert cli.main(["compare", ODD_ID, "--runs-dir", str(runs)]) == 0
    assert "[b]x[i]" in capsys.readouterr().out.replace("\n", "")
