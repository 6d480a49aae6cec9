"""The GPU proof in one prepared script: the driver behind ``scripts/gpu-check.sh`` (its header
says how to prepare and run it).

    python3 scripts/gpu_check.py [--cpu] [--no-install] [--wheels DIR] [--budget S]
                                 [--parts a,b] [OUTDIR]

Installs gputui without the network where it does not import, then runs each part in a
process group of its own under its own time limit (a part that runs past it is killed, its
children too, and fails; the rest still run), and writes ``report.md`` (every figure, each
part's verdict PASS / FAIL / SKIP with the reason, a failed part's last lines) and one log per
part into OUTDIR (else ``$OUT``): at most 8 files. The report is printed last; the exit status
is 1 when a part failed, 2 for bad input. The driver itself imports only the standard library
(it runs before the install); the parts that read gputui's record run as ``--worker NAME``
in a child process.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORT = "report.md"
TAIL_LINES = 30
XDIST_WORKERS = 6

# The transformer: gpt2-small-1gpu as shipped (12 x 768, context 1024, batch 16, bf16, compiled)
# for one epoch of a fixed number of steps; on the CPU, the preset's own rehearsal at a tiny size.
GPT_STEPS = 150
GPT_GPU = ["--set", f"data.train_size={16 * GPT_STEPS}", "--set", "data.test_size=64",
           "--set", "run.log_every=10", "--set", "run.checkpoint=false"]
GPT_CPU = ["--set", "model.n_layer=2", "--set", "model.n_embd=64", "--set", "model.n_head=2",
           "--set", "data.context=64", "--set", "data.train_size=256", "--set",
           "data.test_size=32", "--set", "run.precision=fp32", "--set", "run.compile=off",
           "--set", "run.log_every=4", "--set", "run.checkpoint=false", "--set",
           "optim.warmup_steps=4", "--lr", "0.003"]
# part 4: GPT-2 small eager, 40 steps, under each activation checkpointing mode
AC_MODES = ("none", "full", "selective")
AC_RUN = ["--set", "run.compile=off", "--set", "data.train_size=640", "--set",
          "data.test_size=64", "--set", "run.log_every=5", "--set", "optim.warmup_steps=5",
          "--set", "run.checkpoint=false"]
BENCH_GPU = ["--device", "cuda", "--n-layer", "12", "--n-head", "12", "--n-embd", "768",
             "--context", "1024", "--batch-size", "16", "--train-size", "640", "--precision",
             "bf16", "--compile", "--rounds", "1", "--epochs", "2"]
BENCH_CPU = ["--device", "cpu", "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
             "--context", "32", "--batch-size", "8", "--train-size", "64", "--rounds", "1",
             "--epochs", "2", "--threads", "1"]
# NVML: quickstart (LeNet) on GPU 0 for a few epochs, telemetry every 0.25 s
NVML_RUN = ["--epochs", "3", "--set", "telemetry.interval_s=0.25", "--set", "run.checkpoint=false"]


@dataclass
class Part:
    """One part of the check: its limits (GPU, CPU rehearsal) and, after it ran, its result."""

    key: str
    number: int
    title: str
    limit: tuple[float, float]  # seconds: on a GPU, in the rehearsal
    floor: float  # what is kept for it when earlier parts run long
    verdict: str = "SKIP"
    reason: str = "not run"
    figures: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    tail: str = ""
    log: str = ""


def make_parts() -> list[Part]:
    """The parts in the report's order."""
    return [
        Part("gpu-tests", 1, "the GPU test suite (pytest -m gpu)", (330, 150), 120),
        Part("transformer", 2, "the transformer: gpt2-small-1gpu, bf16, compiled", (210, 150), 60),
        Part("nvml", 3, "NVML: energy per sample, GPM, topology", (75, 60), 30),
        Part("plan", 4, "plan: predicted memory and step time against measured", (180, 30), 15),
        Part("cp", 5, "context parallelism on CUDA", (60, 30), 15),
    ]


# the order they run in: the longest, the test suite, last, with what time is left
RUN_ORDER = ["nvml", "transformer", "plan", "cp", "gpu-tests"]


# ------------------------------------------------------------------------------ processes
def run_logged(cmd: list[str], log: Path, limit: float, env: dict[str, str],
               stdout: Any = None) -> tuple[int, bool, float]:
    """Run ``cmd`` in a new process group, its output appended to ``log`` (stdout to ``stdout``
    where given); past ``limit`` seconds the whole group is ended (TERM, then KILL).
    (exit status, whether it ran past the limit, seconds)."""
    t0 = time.monotonic()
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}    (limit {limit:.0f} s)\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=stdout or fh,
                                stderr=subprocess.STDOUT if stdout is None else fh,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(limit, 0.1))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = stop_group(proc)
        seconds = time.monotonic() - t0
        fh.write(f"[exit status {rc}{', killed: ran past its limit' if timed_out else ''}, "
                 f"{seconds:.1f} s]\n")
    return rc, timed_out, seconds


def stop_group(proc: subprocess.Popen) -> int:
    """End ``proc``'s process group: TERM, 10 s to go, then KILL."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.returncode if proc.returncode is not None else -9


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# ------------------------------------------------------------------------------ install
def imports_ok(py: str, env: dict[str, str]) -> tuple[bool, str]:
    """Whether gputui (this checkout's) and what the parts need import."""
    code = ("import gputui, textual, textual_plotext, tomli_w, pytest, pytest_asyncio, torch; "
            "print(gputui.__file__)")
    proc = subprocess.run([py, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return False, (proc.stderr.strip().splitlines() or ["?"])[-1]
    where = Path(proc.stdout.strip()).resolve()
    if ROOT not in where.parents:
        return False, f"gputui imports from {where}, not from this checkout"
    return True, ""


def install(args: argparse.Namespace, env: dict[str, str], log: Path) -> Part:
    part = Part("install", 0, "install", (120, 60), 0)
    t0 = time.monotonic()
    ok, why = imports_ok(args.python, env)
    if args.no_install or ok:
        part.verdict, part.reason = ("PASS", "already installed: gputui and its dependencies "
                                     "import") if ok else ("FAIL", f"--no-install, and {why}")
        part.seconds = time.monotonic() - t0
        log.write_text(f"{part.reason}\n", encoding="utf-8")
        return part
    wheels = sorted(glob.glob(str(Path(args.wheels) / "*.whl")))
    log.write_text(f"does not import yet: {why}\n", encoding="utf-8")
    if not wheels:
        part.verdict = "FAIL"
        part.reason = (f"gputui does not import ({why}) and {args.wheels} holds no wheels: make "
                       f"them with ../shared/gpu/fetch-wheels.sh {args.wheels} where there is "
                       f"a network, or pip install -e '.[test]'")
        return part
    site = os.environ.get("GPUCHECK_SITE", "/tmp/gpucheck-site")
    rc, _, _ = run_logged([args.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                           "--no-compile", "--no-cache-dir", "--upgrade", "--target", site,
                           *wheels], log, 120, env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
    if rc == 0:
        rc2, _, _ = run_logged([args.python, "-m", "pip", "install", "-q", "--no-deps",
                                "--no-build-isolation", "--no-index", "-e", "."], log, 120, env)
        if rc2 != 0:  # a Python we may not write to: the checkout itself on the path
            env["PYTHONPATH"] = os.pathsep.join((str(ROOT), env["PYTHONPATH"]))
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"pip install -e . refused: {ROOT} put on PYTHONPATH instead\n")
    ok, why = imports_ok(args.python, env)
    part.seconds = time.monotonic() - t0
    part.figures = [("wheels", str(len(wheels))), ("site", site)]
    if ok:
        part.verdict, part.reason = "PASS", f"{len(wheels)} wheels from {args.wheels}, no network"
    else:
        part.verdict, part.reason = "FAIL", f"still does not import after the install: {why}"
        part.tail = tail(log)
    return part


def probe(py: str, env: dict[str, str]) -> dict[str, Any]:
    """Python, torch, CUDA as torch sees them, and nvidia-smi's GPUs (no CUDA context made
    beyond torch's device count)."""
    code = ("import json, platform, torch; print(json.dumps({'python': platform.python_version(),"
            " 'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'gpus': torch.cuda.device_count()}))")
    out: dict[str, Any] = {}
    proc = subprocess.run([py, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        out.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    else:
        out["torch_error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True)
        out["nvidia_smi"] = smi.stdout.strip().splitlines() if smi.returncode == 0 else []
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True) if shutil.which("git") else None
    out["commit"] = git.stdout.strip() if git is not None and git.returncode == 0 else "unknown"
    if out["commit"] != "unknown":  # a copied working tree can be ahead of its .git's HEAD
        dirty = subprocess.run(["git", "status", "--porcelain"],
                               cwd=ROOT, capture_output=True, text=True)
        if dirty.returncode == 0 and dirty.stdout.strip():
            out["commit"] += " with changes not committed there"
    return out


# ------------------------------------------------------------------------------ part 1
def gpu_test_files() -> list[str]:
    """The test files that carry the gpu mark, as the suite has them now."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if "pytest.mark.gpu" in path.read_text(encoding="utf-8", errors="replace"):
            found.append(str(path.relative_to(ROOT)))
    return found


def part_gpu_tests(part: Part, cpu: bool, py: str, env: dict[str, str], log: Path,
                   limit: float) -> None:
    files = gpu_test_files()
    part.figures.append(("files with the gpu mark", ", ".join(files) or "none"))
    if not files:
        part.verdict, part.reason = "FAIL", "no test file carries the gpu mark"
        return
    cmd = [py, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "-o", "timeout=150",
           "-rfEs", *files]
    if not cpu and importlib.util.find_spec("xdist") is not None:
        # one GPU, six workers: each test starts its own small runs on cuda:0, most of their
        # time is starting Python, torch and CUDA
        cmd[3:3] = ["-n", str(XDIST_WORKERS), "--dist", "load"]
        part.figures.append(("pytest-xdist workers", str(XDIST_WORKERS)))
    rc, timed_out, part.seconds = run_logged(cmd, log, limit, env)
    text = log.read_text(encoding="utf-8", errors="replace")
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error", "errors", "deselected")}
    summary = [ln for ln in text.splitlines() if re.match(r"^=+ .*\d+ \w+.* in [\d.]+s", ln)]
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)",
                              summary[-1] if summary else ""):
        counts[what] += int(n)
    errors = counts["error"] + counts["errors"]
    part.figures += [("passed", str(counts["passed"])), ("failed", str(counts["failed"])),
                     ("errors", str(errors)), ("skipped", str(counts["skipped"]))]
    if timed_out:
        done = len(re.findall(r"\b(PASSED|FAILED|ERROR|SKIPPED)\b", text))
        part.verdict = "FAIL"
        part.reason = f"ran past its limit of {limit:.0f} s ({done} test outcomes seen by then)"
    elif rc == 0 and counts["passed"]:
        part.verdict, part.reason = "PASS", f"{counts['passed']} gpu tests passed"
    elif rc == 0 and counts["skipped"]:
        why = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", text, re.M)
        part.verdict = "SKIP"
        part.reason = (f"{counts['skipped']} gpu tests collected, all skipped: "
                       f"{why[0] if why else 'see the log'}")
    elif rc == 5:
        part.verdict, part.reason = "FAIL", "no test was collected under -m gpu"
    else:
        part.verdict = "FAIL"
        part.reason = f"{counts['failed']} failed, {errors} errors (pytest exit status {rc})"
    if part.verdict == "FAIL":
        lines = [ln for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        part.tail = "\n".join(lines[-15:] + ["..."] + text.splitlines()[-15:])


# ------------------------------------------------------------------------------ the workers
def worker_env() -> dict[str, Any]:
    return {"cpu": os.environ.get("GPUCHECK_CPU") == "1",
            "work": Path(os.environ["GPUCHECK_WORK"])}


def child(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    """A command of a worker: its stderr into the part's log, its stdout kept and echoed."""
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, **kw)
    print(proc.stdout, end="", flush=True)
    print(f"[exit status {proc.returncode}, {time.monotonic() - t0:.1f} s]", flush=True)
    return proc


def gputui_run(args: list[str], runs: Path) -> tuple[dict | None, Path | None, str]:
    """``gputui run ARGS --json``: (summary, run folder, why not)."""
    proc = child([sys.executable, "-m", "gputui", "run", *args, "--json", "--runs-dir",
                  str(runs)])
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        return None, None, f"gputui run exited {proc.returncode} without a summary"
    run_dir = Path(summary.get("run_dir", ""))
    if summary.get("status") != "finished":
        return summary, run_dir, f"the run ended {summary.get('status')}: {summary.get('reason')}"
    return summary, run_dir, ""


def events(run_dir: Path, name: str = "events.jsonl") -> list[dict]:
    out = []
    try:
        for line in (run_dir / name).read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    except OSError:
        pass
    return out


def num(value: Any, fmt: str = ".3f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "n/a"


def ms(seconds: float | None) -> str:
    return f"{seconds * 1000:.1f} ms" if isinstance(seconds, (int, float)) else "n/a"


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def flops_text(value: float | None) -> str:
    if not value:
        return "n/a"
    return f"{value / 1e12:.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.2f} GFLOP/s"


def w_transformer() -> dict:
    ctx = worker_env()
    cpu, work = ctx["cpu"], ctx["work"]
    figures: list[list[str]] = []
    problems: list[str] = []
    summary, run_dir, why = gputui_run(
        ["gpt2-small-1gpu", "--devices", "cpu" if cpu else "0", "--epochs", "1",
         *(GPT_CPU if cpu else GPT_GPU)], work / "runs")
    if summary is None or run_dir is None or why:
        return {"verdict": "FAIL", "reason": f"gpt2-small-1gpu: {why}", "figures": figures}
    evs = events(run_dir)
    by = {e.get("type"): e for e in evs}  # the last of each kind
    init, flops = by.get("init_done", {}), by.get("flops", {})
    steps = [e for e in evs if e.get("type") == "step"]
    per_sample = summary.get("tokens_per_sample") or 0
    steady = steps[1:] or steps
    tps = statistics.median(e["samples_per_s"] * per_sample for e in steady) if steady else None
    mfus = [e["mfu"] for e in steady if e.get("mfu") is not None]
    mfu = statistics.mean(mfus) if mfus else None
    step_s = statistics.median(e["step_time_s"] for e in steady) if steady else None
    mems = [r for e in evs if e.get("type") == "memory" for r in e.get("per_device", [])]
    peaks = [r["peak"] for r in mems if isinstance(r.get("peak"), int)]
    last = mems[-1] if mems else {}
    counted = sum(last.get(k) or 0 for k in ("params", "grads", "optim", "activations"))
    cfg = by.get("run_started", {}).get("config", {})
    model, run = cfg.get("model", {}), cfg.get("run", {})
    figures += [
        ["model", f"GPT {model.get('n_layer')} x {model.get('n_embd')}, {model.get('n_head')} "
                  f"heads, context {cfg.get('data', {}).get('context')}, "
                  f"{summary.get('params') or 0:,} parameters"],
        ["precision, compile", f"{run.get('precision')}, {run.get('compile')}"],
        ["device", ", ".join(summary.get("devices") or [])],
        ["steps", f"{summary.get('steps_per_epoch')} of batch "
                  f"{cfg.get('optim', {}).get('batch_size')}"],
        ["init, of which compile", f"{init.get('seconds', 0):.1f} s, "
                                   f"{init.get('compile_s', 0):.1f} s"],
        ["tokens/s (median of the logged windows after the first)",
         "n/a" if tps is None else f"{tps:,.0f}"],
        ["step time (median)", "n/a" if step_s is None else f"{step_s * 1000:.1f} ms"],
        ["tokens/s (the epoch, warm-up included)", f"{summary.get('tokens_per_s') or 0:,.0f}"],
        ["peak FLOP/s it is measured against",
         f"{flops_text(flops.get('peak_flops'))} {flops.get('dtype')} "
         f"({flops.get('source') or 'none'})"],
        ["MFU (mean of the logged windows after the first)",
         "n/a" if mfu is None else f"{mfu * 100:.1f} %"],
        ["peak memory (CUDA allocator)", gib(max(peaks)) if peaks else "n/a (no CUDA allocator)"],
        ["training memory counted (params + grads + optimizer + activations)", gib(counted)],
        ["loss", f"first logged {num(steps[0].get('loss'))}, last "
                 f"{num(summary.get('train_loss'))}, val {num(summary.get('val_loss'))}"
         if steps else "no steps logged"],
    ]
    if not tps or tps <= 0:
        problems.append("no tokens/s")
    if mfu is None or mfu <= 0:
        problems.append("no MFU in the record")
    elif cpu and mfu > 1:
        # a CPU's peak is a short matmul measured here, under whatever else runs (the record's
        # machine state says): on a shared machine the run can beat it
        figures.append(["note", "MFU above 100 %: the CPU's peak was measured under load"])
    if not cpu:
        if mfu is not None and mfu > 1:
            problems.append(f"MFU {mfu * 100:.0f} % is above the peak")
        if not peaks:
            problems.append("no CUDA peak memory in the record")
        if not init.get("compile_s"):
            problems.append("nothing was compiled (run.compile fell back to eager?)")
        if "measured" in str(flops.get("source", "")):
            figures.append(["note", "this GPU is not in gputui.train.flops.PEAK_TFLOPS: the "
                                    "peak was measured, not taken from a data sheet"])
    (work / "transformer.json").write_text(json.dumps(
        {"step_s": step_s, "peak": max(peaks) if peaks else None, "counted": counted,
         "tokens_per_s": tps, "run": run_dir.name}), encoding="utf-8")
    bench = child([sys.executable, "benchmarks/bench_lm.py", *(BENCH_CPU if cpu else BENCH_GPU),
                   "--json"])
    got = None
    for line in reversed(bench.stdout.splitlines()):
        if line.startswith("{"):
            got = json.loads(line)
            break
    if bench.returncode != 0 or got is None:
        problems.append(f"benchmarks/bench_lm.py exited {bench.returncode} without its figures")
    else:
        figures += [
            ["bench_lm: gputui single, tokens/s", f"{got['gputui']:,.0f}"],
            ["bench_lm: the plain loop, tokens/s", f"{got['plain']:,.0f}"],
            ["bench_lm: ratio gputui / plain (goal >= 0.95)",
             f"{got['ratio']:.3f} ({'met' if got['ratio'] >= 0.95 else 'NOT met'})"],
            ["bench_lm: largest parameter difference after training",
             f"{got['max_param_diff']:.2g}"],
            ["bench_lm: where", f"{got['device']}, {' '.join(BENCH_CPU if cpu else BENCH_GPU)}"],
        ]
        # fp32 eager (the rehearsal) is the same arithmetic in the same order: equal
        if cpu and got["max_param_diff"] > 1e-4:
            problems.append(f"gputui's single and the plain loop trained different models "
                            f"(parameters differ by {got['max_param_diff']:.2g})")
    if problems:
        return {"verdict": "FAIL", "reason": "; ".join(problems), "figures": figures}
    where = "tiny GPT on the CPU, fp32, eager (rehearsal)" if cpu else "on the GPU"
    return {"verdict": "PASS", "reason": f"trained {summary.get('steps_per_epoch')} steps {where}",
            "figures": figures}


def w_nvml() -> dict:
    ctx = worker_env()
    cpu, work = ctx["cpu"], ctx["work"]
    from gputui.hw import nvml
    from gputui.hw.discovery import gpu_links

    if not nvml.init():
        return {"verdict": "SKIP", "reason": f"no NVML: {nvml.reason()}", "figures": []}
    gpus, why = nvml.cuda_gpus({}) if cpu else nvml.cuda_gpus()
    figures = [["driver", nvml.driver_version() or "n/a"],
               ["GPUs (NVML)", "; ".join(f"{g.index}: {g.name}" for g in gpus) or why]]
    if not gpus:
        return {"verdict": "SKIP", "reason": f"NVML lists no GPU: {why}", "figures": figures}
    problems: list[str] = []
    h = nvml.handle(gpus[0].uuid)
    gpm = nvml.gpm_supported(h)
    figures.append(["GPM on GPU 0", "supported" if gpm else "not supported by this GPU or "
                                                            "driver (Hopper and newer)"])
    # topology: every pair, and GPU 0's active NVLinks
    links = gpu_links(gpus)
    active = sum(1 for i in range(18) if nvml.call("nvmlDeviceGetNvLinkState", h, i))
    figures.append(["GPU 0's active NVLinks", str(active)])
    if len(gpus) < 2:
        figures.append(["topology", "one GPU: no pair to read"])
    for (a, b), (n, path) in sorted(links.items()):
        figures.append([f"topology GPU {a} - GPU {b}", f"{n} NVLinks, PCIe: {path or 'not said'}"])
        if path is None and n == 0:
            problems.append(f"NVML gave no link between GPU {a} and GPU {b}")
    if cpu:
        return {"verdict": "FAIL" if problems else "PASS", "figures": figures,
                "reason": "; ".join(problems) or "read NVML without a GPU run (rehearsal: no "
                                                  "energy, no GPM activity)"}
    e0 = nvml.energy_mj(h)
    g0 = nvml.gpm_sample(h) if gpm else None
    summary, run_dir, why = gputui_run(["quickstart", "--devices", "0", *NVML_RUN], work / "runs")
    e1 = nvml.energy_mj(h)
    g1 = nvml.gpm_sample(h) if gpm else None
    whole = nvml.gpm_metrics(g0, g1) if g0 is not None and g1 is not None else {}
    for s in (g0, g1):
        if s is not None:
            nvml.gpm_free(s)
    if summary is None or run_dir is None or why:
        return {"verdict": "FAIL", "reason": f"quickstart on GPU 0: {why}", "figures": figures}
    from gputui.runs import energy

    got = energy.run_figures(run_dir)
    samples = (summary.get("train_samples") or 0) * (summary.get("epochs_done") or 0)
    rows = [r for r in events(run_dir, "telemetry.jsonl") if r.get("device") == "cuda:0"]
    figures += [
        ["the run", f"quickstart (LeNet), {summary.get('epochs_done')} epochs of "
                    f"{summary.get('train_samples') or 0:,} samples on {summary.get('devices')}, "
                    f"{summary.get('samples_per_s') or 0:,.0f} samples/s"],
        ["energy (energy.json, the epochs)",
         "n/a" if got["energy_j"] is None else f"{got['energy_j']:.1f} J"],
        ["energy per sample (energy.json)",
         "n/a" if got["j_per_sample"] is None else f"{got['j_per_sample'] * 1000:.3f} mJ"],
        ["energy counter around the whole command (init included)",
         "n/a" if e0 is None or e1 is None else
         f"{(e1 - e0) / 1000:.1f} J, {(e1 - e0) / max(samples, 1):.3f} mJ per sample"],
        ["telemetry rows of cuda:0", str(len(rows))],
    ]
    for key, label in (("util", "utilization %"), ("power_w", "power W"),
                       ("sm_active", "GPM SM active %"), ("sm_occupancy", "GPM SM occupancy %"),
                       ("tensor_active", "GPM tensor active %")):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        figures.append([f"telemetry {label} (max, mean)",
                        f"{max(vals):.1f}, {statistics.mean(vals):.1f}" if vals else "n/a"])
    for key, value in sorted(whole.items()):
        figures.append([f"GPM over the whole command: {key} %", f"{value:.1f}"])
    if not got["j_per_sample"] or got["j_per_sample"] <= 0:
        problems.append("no energy per sample (energy.json)")
    if not rows or not any((r.get("util") or 0) > 0 for r in rows):
        problems.append("telemetry never saw GPU 0 busy")
    if gpm and not whole and not any(r.get("sm_active") is not None for r in rows):
        problems.append("GPM is supported but gave no metric")
    return {"verdict": "FAIL" if problems else "PASS", "figures": figures,
            "reason": "; ".join(problems) or "energy, GPM and topology read"}


def w_plan() -> dict:
    ctx = worker_env()
    cpu, work = ctx["cpu"], ctx["work"]
    probe_ = child([sys.executable, "-m", "gputui", "plan", "--help"],
                   stderr=subprocess.STDOUT)
    if probe_.returncode != 0:
        return {"verdict": "SKIP", "figures": [],
                "reason": f"no `gputui plan` in this checkout (issue 33): `gputui plan --help` "
                          f"exited {probe_.returncode}"}
    if cpu:
        return {"verdict": "SKIP", "figures": [],
                "reason": "`gputui plan` exists; its plan against a measured run needs a GPU "
                          "(on CPU ranks the plan's own tests check it)"}
    measured = json.loads((work / "transformer.json").read_text(encoding="utf-8")) \
        if (work / "transformer.json").is_file() else {}
    if not measured.get("run"):
        return {"verdict": "SKIP", "figures": [],
                "reason": "part 2 recorded no run to plan against"}
    # the product's own check: part 2's record beside the plan of its mesh on its GPU
    def check(run: str) -> subprocess.CompletedProcess:
        return child([sys.executable, "-m", "gputui", "plan", "--check", run, "--runs-dir",
                      str(work / "runs"), "--json"])

    proc = check(measured["run"])
    try:
        got = json.loads(proc.stdout)
        planned, recorded = got["planned"], got["measured"]
    except (ValueError, KeyError):
        return {"verdict": "FAIL", "figures": [],
                "reason": f"`gputui plan --check {measured['run']} --json` exited "
                          f"{proc.returncode} without its JSON"}
    mem_ratio = planned["peak"] / recorded["peak"] if recorded.get("peak") else None
    step_ratio = (planned["step_s"] / recorded["step_s"]
                  if planned.get("step_s") and recorded.get("step_s") else None)
    figures = [["command", "gputui plan --check RUN --json (RUN: part 2's record)"],
               ["mesh", str(got.get("mesh"))],
               ["planned peak memory", gib(planned.get("peak"))],
               ["recorded peak memory (CUDA allocator)", gib(recorded.get("peak"))],
               ["planned / recorded memory", "n/a" if mem_ratio is None else f"{mem_ratio:.3f}"],
               ["planned step time", ms(planned.get("step_s"))],
               ["recorded step time (steady)", ms(recorded.get("step_s"))],
               ["planned / recorded step time",
                "n/a" if step_ratio is None else f"{step_ratio:.3f}"],
               ["planned FLOPs per step", f"{planned.get('flops_per_rank', 0):.4g}"]]
    figures += [["plan's assumption", a] for a in got.get("plan", {}).get("assumptions", [])
                if "efficiency" in a or "device" in a]
    off = []
    if mem_ratio is None or abs(mem_ratio - 1) > 0.10:
        off.append("memory not within 10 %")
    if step_ratio is None or abs(step_ratio - 1) > 0.25:
        off.append("step time not within 25 % (compiled, the profile's assumed efficiency)")
    # a plan made now finds part 2's record (the same model on this GPU): its efficiency
    from gputui.core.config import ConfigError
    from gputui.runs.forecast import profiles

    try:  # the profile of this GPU, by its name, as plan --check finds it
        short = profiles.for_device(profiles.load_profiles(),
                                    os.environ.get("GPUCHECK_GPU_NAME", "")).name
    except ConfigError as exc:
        short = None
        figures.append(["a plan made after part 2's run", f"not made: {exc}"])
    if short:
        again = child([sys.executable, "-m", "gputui", "plan", "gpt2-small-1gpu", "--gpus",
                       f"1x{short}", "--runs-dir", str(work / "runs"), "--json"])
        try:
            said = [a for a in json.loads(again.stdout)["assumptions"] if "efficiency" in a]
            figures.append(["a plan made after part 2's run", said[0] if said else "no line"])
        except (ValueError, KeyError):
            figures.append(["a plan made after part 2's run", f"exited {again.returncode}"])
    # the memory levers, eager (what the plan traces): each checkpointing mode's allocator peak
    # beside its plan
    for ac in AC_MODES:
        summary, run_dir, why = gputui_run(["gpt2-small-1gpu", "--devices", "0", "--epochs", "1",
                                            *AC_RUN, "--set", f"parallel.ac={ac}"], work / "runs")
        if summary is None or run_dir is None or why:
            off.append(f"ac {ac}: {why}")
            continue
        proc = check(run_dir.name)
        try:
            p, r = (json.loads(proc.stdout)[k] for k in ("planned", "measured"))
        except (ValueError, KeyError):
            off.append(f"ac {ac}: plan --check gave no JSON")
            continue
        ratio = p["peak"] / r["peak"] if r.get("peak") else None
        figures.append([f"ac {ac}, eager: planned / recorded peak",
                        f"{gib(p.get('peak'))} / {gib(r.get('peak'))} = "
                        + ("n/a" if ratio is None else f"{ratio:.3f}")])
        if ratio is None or abs(ratio - 1) > 0.10:
            off.append(f"ac {ac}: memory not within 10 %")
        if r.get("step_s"):
            figures.append([f"ac {ac}, eager: recorded step time", f"{r['step_s'] * 1000:.1f} ms"])
    return {"verdict": "FAIL" if off else "PASS", "figures": figures,
            "reason": "; ".join(off) or "the plan is within issue 33's bounds"}


def w_cp() -> dict:
    ctx = worker_env()
    cpu = ctx["cpu"]
    from gputui.core import registry
    from gputui.core.config import ConfigError, RunConfig, apply_overrides

    # context parallelism is the mesh's parallel.cp degree; until it lands, a degree above 1
    # is refused when the config is read ("not in gputui yet")
    try:
        apply_overrides(RunConfig(), [("gpu-check", "parallel.cp", 2)])
        fields = ["cp"]
    except ConfigError:
        fields = []
    has_strategy = "cp" in registry.names()
    torch_cp = child([sys.executable, "-c", "import torch.distributed.tensor.experimental as x; "
                      "print(hasattr(x, 'context_parallel'))"])
    figures = [["torch's context_parallel", "present" if "True" in torch_cp.stdout else
                "absent from this torch"]]
    if not has_strategy and not fields:
        return {"verdict": "SKIP", "figures": figures,
                "reason": "no context parallelism in gputui yet (issue 32): parallel.cp above 1 "
                          "is refused"}
    if cpu:
        return {"verdict": "SKIP", "figures": figures,
                "reason": "context_parallel drives CUDA attention kernels only: needs a GPU"}
    extra = [] if has_strategy else ["--set", "parallel.cp=1"]
    proc = child([sys.executable, "-m", "gputui", "verify", "gpt-tiny", "--devices", "0",
                  "--strategies", "cp" if has_strategy else "ddp", *extra, "--json"])
    figures.append(["gputui verify", f"exit status {proc.returncode}"])
    try:  # which attention ran: the cp run's own log line
        run_id = json.loads(proc.stdout)["strategies"][0]["run_id"]
        said = [e.get("message", "") for e in events(ctx["work"] / "runs" / run_id)
                if e.get("type") == "log" and "context parallel over" in e.get("message", "")]
        figures.append(["the cp run says", said[0] if said else "nothing about its attention"])
    except (ValueError, KeyError, IndexError, OSError) as exc:
        figures.append(["the cp run says", f"(its record could not be read: {exc})"])
    return {"verdict": "PASS" if proc.returncode == 0 else "FAIL", "figures": figures,
            "reason": "cp on cuda:0 trains single's model" if proc.returncode == 0 else
            f"`gputui verify gpt-tiny --devices 0` with cp exited {proc.returncode}"}


WORKERS = {"transformer": w_transformer, "nvml": w_nvml, "plan": w_plan, "cp": w_cp}


def part_worker(part: Part, py: str, env: dict[str, str], log: Path, limit: float,
                work: Path) -> None:
    result = work / f"{part.key}.result.json"
    rc, timed_out, part.seconds = run_logged(
        [py, str(Path(__file__).resolve()), "--worker", part.key, str(result)], log, limit, env)
    got = json.loads(result.read_text(encoding="utf-8")) if result.is_file() else None
    if timed_out:
        part.verdict, part.reason = "FAIL", f"ran past its limit of {limit:.0f} s"
    elif got is None:
        part.verdict, part.reason = "FAIL", f"the part exited {rc} without a result"
    else:
        part.verdict, part.reason = got["verdict"], got["reason"]
        part.figures += [(a, b) for a, b in got.get("figures", [])]
    if part.verdict == "FAIL":
        part.tail = tail(log)


# ------------------------------------------------------------------------------ the report
def report(parts: list[Part], install_part: Part, info: dict[str, Any], cpu: bool,
           total_s: float, budget: float) -> str:
    failed = [p for p in [install_part, *parts] if p.verdict == "FAIL"]
    lines = [f"# gputui GPU check: {'FAIL' if failed else 'PASS'}", ""]
    smi = "; ".join(info.get("nvidia_smi") or []) or "no nvidia-smi"
    lines += [f"- mode: {'CPU rehearsal (--cpu)' if cpu else 'GPU'}",
              f"- when: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, checkout "
              f"{info.get('commit') or 'unknown'}",
              f"- python {info.get('python', '?')}, torch {info.get('torch', '?')} "
              f"(CUDA {info.get('cuda')}, {info.get('gpus', 0)} GPU(s) seen by torch)"
              + (f"; torch failed: {info['torch_error']}" if "torch_error" in info else ""),
              f"- nvidia-smi: {smi}",
              f"- wall time: {total_s:.0f} s of a {budget:.0f} s budget", "",
              "| part | verdict | seconds | reason |", "|---|---|---|---|"]
    for p in [install_part, *parts]:
        lines.append(f"| {p.number} {p.key} | {p.verdict} | {p.seconds:.0f} | "
                     f"{p.reason.replace('|', '/')} |")
    for p in [install_part, *parts]:
        lines += ["", f"## {p.number} {p.key}: {p.verdict}", "", f"{p.title}: {p.reason}", ""]
        lines += [f"- {a}: {b}" for a, b in p.figures]
        if p.log:
            lines.append(f"- log: {p.log}")
        if p.tail:
            lines += ["", "last lines:", "", "```", p.tail, "```"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ main
def bad(msg: str) -> None:
    print(f"gpu-check: {msg}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT", ""),
                    help="the folder for report.md and the logs (default $OUT)")
    ap.add_argument("--cpu", action="store_true", help="the CPU rehearsal at tiny sizes")
    ap.add_argument("--no-install", action="store_true", help="use the Python as it is")
    ap.add_argument("--wheels", default=".whl", help="the wheel folder (default .whl)")
    ap.add_argument("--budget", type=float, default=None,
                    help="the whole run's limit in seconds (540 on a GPU, 300 with --cpu)")
    ap.add_argument("--parts", default=",".join(RUN_ORDER),
                    help=f"which parts, comma-separated (default all: {','.join(RUN_ORDER)})")
    ap.add_argument("--worker", nargs=2, metavar=("PART", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        # this checkout's gputui, also where the Python has another one installed (a venv
        # made for another clone): every command here runs from this checkout's root
        sys.path.insert(0, str(ROOT))
        name, result = args.worker
        import gputui

        print(f"gputui from {Path(gputui.__file__).parent}", flush=True)
        got = WORKERS[name]()
        Path(result).write_text(json.dumps(got), encoding="utf-8")
        return 0
    if not args.out:
        bad("no output folder: give one as an argument or set $OUT")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        bad(f"{out} is a file: give a folder for the report")
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in RUN_ORDER]
    if unknown or not wanted:
        bad(f"unknown part(s) {', '.join(unknown) or '(none given)'}: choose from "
            f"{','.join(RUN_ORDER)}")
    if args.budget is not None and args.budget <= 0:
        bad(f"--budget {args.budget:g}: give a positive number of seconds")
    budget = args.budget or (300.0 if args.cpu else 540.0)
    args.python = sys.executable
    out.mkdir(parents=True, exist_ok=True)
    stale = [f for f in (REPORT, "install.log", *(f"{k}.log" for k in RUN_ORDER))
             if (out / f).exists()]
    for f in stale:  # a rerun into the same folder: this run's files only
        (out / f).unlink()
    t0 = time.monotonic()
    deadline = t0 + budget
    work = Path(tempfile.mkdtemp(prefix="gpucheck-"))
    env = dict(os.environ, PYTHONUNBUFFERED="1", GPUCHECK_WORK=str(work),
               GPUTUI_RUNS_DIR=str(work / "runs"), GPUTUI_CACHE_DIR=str(work / "cache"),
               XDG_CACHE_HOME=str(work / "cache"), GPUCHECK_CPU="1" if args.cpu else "0")
    if args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the rehearsal is the same on any machine
    try:
        install_part = install(args, env, out / "install.log")
        install_part.log = "install.log"
        info = probe(args.python, env)
        if not args.cpu and install_part.verdict == "PASS" and not info.get("gpus"):
            bad("torch sees no CUDA GPU here: run with --cpu for the rehearsal")
        env["GPUCHECK_GPU_NAME"] = (info.get("nvidia_smi") or [""])[0].split(",")[0]
        parts = {p.key: p for p in make_parts()}
        order = [k for k in RUN_ORDER if k in wanted]
        for i, key in enumerate(order):
            part = parts[key]
            if install_part.verdict != "PASS":
                part.reason = "not run: the install failed"
                continue
            reserve = sum(parts[k].floor for k in order[i + 1:])
            limit = min(part.limit[1 if args.cpu else 0], deadline - time.monotonic() - reserve)
            limit = max(limit, 1.0)
            log = out / f"{key}.log"
            part.log = log.name
            print(f"gpu-check: part {part.number} {key} (limit {limit:.0f} s) ...", flush=True)
            if key == "gpu-tests":
                part_gpu_tests(part, args.cpu, args.python, env, log, limit)
            else:
                part_worker(part, args.python, env, log, limit, work)
            print(f"gpu-check: part {part.number} {key}: {part.verdict} ({part.seconds:.0f} s) "
                  f"{part.reason}", flush=True)
        shown = [parts[k] for k in RUN_ORDER if k in wanted]
        shown.sort(key=lambda p: p.number)
        text = report(shown, install_part, info, args.cpu, time.monotonic() - t0, budget)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / REPORT).write_text(text, encoding="utf-8")
    print(text, end="")
    return 1 if text.startswith("# gputui GPU check: FAIL") else 0


if __name__ == "__main__":
    raise SystemExit(main())
