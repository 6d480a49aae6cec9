"""scripts/gpu-check.sh, the GPU proof in one prepared script, rehearsed on the CPU (--cpu): the
same script, the same parts, at tiny sizes, with the Python as it is (--no-install). What a GPU
machine will run is proven here as far as a CPU can: every part runs or says why not, the
report holds each part's verdict and figures, at most 8 files are written, a part that runs
past its limit fails with its last lines and the exit status says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
pytestmark = pytest.mark.slow


def check(*args: str, out_env: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUCHECK_PYTHON=sys.executable)
    env.pop("OUT", None)
    if out_env is not None:
        env["OUT"] = str(out_env)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=280)


def verdicts(report: str) -> dict[str, tuple[str, str]]:
    """The report's table: part -> (verdict, reason)."""
    rows = re.findall(r"^\| (\d) ([\w-]+) \| (PASS|FAIL|SKIP) \| \d+ \| (.*) \|$", report, re.M)
    return {name: (verdict, reason) for _, name, verdict, reason in rows}


def nvml_here() -> bool:
    code = "from gputui.hw import nvml; print(nvml.init())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True).stdout.strip() == "True"


def test_the_cpu_rehearsal_runs_every_part_and_reports_each(tmp_path):
    out = tmp_path / "out"
    proc = check("--cpu", "--no-install", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = (out / "report.md").read_text()
    assert proc.stdout.endswith(report)  # printed last
    assert report.startswith("# gputui GPU check: PASS\n")
    assert "- mode: CPU rehearsal (--cpu)" in report
    files = sorted(p.name for p in out.iterdir())
    assert files == ["cp.log", "gpu-tests.log", "install.log", "nvml.log", "plan.log",
                     "report.md", "transformer.log"]
    got = verdicts(report)
    assert list(got) == ["install", "gpu-tests", "transformer", "nvml", "plan", "cp"]
    assert got["install"] == ("PASS", "already installed: gputui and its dependencies import")
    # the gpu tests are collected (the acceptance suite among them) and skip without CUDA
    verdict, reason = got["gpu-tests"]
    assert verdict == "SKIP"
    skipped = re.match(r"(\d+) gpu tests collected, all skipped: ", reason)
    assert skipped and int(skipped.group(1)) >= 15, reason
    assert "tests/gpu/test_acceptance.py" in report
    # the transformer trained for real, and the benchmark compared it with the plain loop
    assert got["transformer"][0] == "PASS", report
    for figure in ("tokens/s (median of the logged windows after the first): ",
                   "MFU (mean of the logged windows after the first): ",
                   "peak FLOP/s it is measured against: ",
                   "bench_lm: ratio gputui / plain (goal >= 0.95): ",
                   "bench_lm: largest parameter difference after training: 0"):
        assert f"- {figure}" in report, figure
    tokens = re.search(r"tokens/s \(median of the logged windows after the first\): ([\d,]+)",
                       report)
    assert tokens and int(tokens.group(1).replace(",", "")) > 0
    if nvml_here():
        assert got["nvml"][0] == "PASS", report
    else:
        assert got["nvml"][0] == "SKIP" and got["nvml"][1].startswith("no NVML: "), got["nvml"]
    # the other issues' parts say why they did not run
    assert got["plan"][0] == "SKIP" and "gputui plan" in got["plan"][1]
    assert got["cp"][0] == "SKIP" and got["cp"][1]
    assert "- torch's context_parallel: " in report


def test_a_part_past_its_limit_fails_with_its_last_lines(tmp_path):
    """One part chosen, a budget no torch process can meet: killed, FAIL, its log's end in
    the report, exit status 1; the report goes to $OUT when no folder is named."""
    out = tmp_path / "out"
    proc = check("--cpu", "--no-install", "--parts", "transformer", "--budget", "1",
                 out_env=out)
    assert proc.returncode == 1, proc.stdout[-3000:]
    report = (out / "report.md").read_text()
    assert report.startswith("# gputui GPU check: FAIL\n")
    got = verdicts(report)
    assert list(got) == ["install", "transformer"]
    assert got["transformer"] == ("FAIL", "ran past its limit of 1 s")
    assert "last lines:" in report and "killed: ran past its limit" in report
    assert sorted(p.name for p in out.iterdir()) == ["install.log", "report.md",
                                                     "transformer.log"]


@pytest.mark.parametrize("args,says", [
    (["--cpu"], "no output folder: give one as an argument or set $OUT"),
    (["--cpu", "--parts", "nvml,gpus", "x"], "unknown part(s) gpus: choose from "),
    (["--cpu", "--budget", "0", "x"], "--budget 0: give a positive number of seconds"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = check(*[str(tmp_path / a) if a == "x" else a for a in args])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()
