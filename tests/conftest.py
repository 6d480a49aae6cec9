"""Shared fixtures: paths, and a private home, cache and runs folder per test; the session
fails when a test changed the user's own folders or the repository's presets/."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# OpenMP threads that wait passively (sleep) instead of spinning. torch's intra-op threads spin
# at every barrier by default; when anything else shares the cores (a second pytest worker, a
# run's ranks, the app's thread) a spinning thread burns the time slice its partner needs:
# ResNet-18 steps on 2 quiet cores: 3.2 s with two such processes at once against 0.45 s passive
# (0.23 s alone, 0.26 s alone and passive; benchmarks/bench_omp_wait.py). Set before torch loads here, inherited by
# every process a test starts; timings are never asserted, so only the suite's time changes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
GPUTUI = [sys.executable, "-m", "gputui"]


def guarded_folders() -> list[Path]:
    """The user's folders gputui reads and writes by default, as this environment names them
    (read before any test changes it): the cache (each rule of gputui.core.cachedir), the
    repository's runs/ and presets/."""
    home = Path(os.environ.get("HOME") or Path.home())
    found = [home / ".cache" / "gputui", ROOT / "presets", ROOT / "runs"]
    if os.environ.get("XDG_CACHE_HOME"):
        found.append(Path(os.environ["XDG_CACHE_HOME"]) / "gputui")
    if os.environ.get("GPUTUI_CACHE_DIR"):
        found.append(Path(os.environ["GPUTUI_CACHE_DIR"]))
    return sorted(set(found))


def snapshot(folders: list[Path]) -> dict[str, tuple]:
    """Every file under ``folders``: its size and modification time (a folder that is not
    there is recorded as missing)."""
    out: dict[str, tuple] = {}
    for folder in folders:
        if not folder.is_dir():
            out[str(folder)] = ("missing",)
            continue
        for path in sorted(folder.rglob("*")):
            try:
                st = path.lstat()
            except OSError:
                continue
            out[str(path)] = (st.st_size, st.st_mtime_ns)
    return out


def private_env(folder: Path) -> dict[str, str]:
    """A home, cache and runs folder under ``folder``, in the usual layout (so the app still
    shows "~/.cache/gputui/data")."""
    home = folder / "home"
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "GPUTUI_CACHE_DIR": str(home / ".cache" / "gputui"),
            "GPUTUI_RUNS_DIR": str(folder / "runs")}


GUARDED = guarded_folders()  # the user's, read before they are moved aside below
SESSION_TMP = Path(tempfile.mkdtemp(prefix="gputui-tests-"))
# Module- and session-scoped fixtures start before any test's own folders exist: they get
# this session's, not the user's.
os.environ.update(private_env(SESSION_TMP))
os.environ.setdefault("TRITON_CACHE_DIR", str(SESSION_TMP / "triton"))  # shared compiles
_BEFORE = pytest.StashKey[dict]()


def pytest_sessionstart(session):
    session.config.stash[_BEFORE] = snapshot(GUARDED)
    # The suite's own process makes a great deal of cyclic garbage (the app's widgets, fake
    # tensors, traced graphs), and at Python's default thresholds (700, 10, 10) a full
    # collection walks everything alive about once a few tests: 0.2 CPU-s each, a tenth of
    # the process's CPU on the app's tests. Rarer collections (young garbage still collected
    # at every 20,000 allocations) free the same objects later. The processes the tests
    # start (gputui's own, the ranks) keep Python's defaults.
    gc.set_threshold(20_000, 10, 10)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when a test changed the user's cache, or the repo's runs/ or presets/."""
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        shutil.rmtree(SESSION_TMP, ignore_errors=True)
        return
    after = snapshot(GUARDED)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        sys.stderr.write(f"\nA test changed the user's own folders or the repository's presets/: "
                         f"{shown}. Tests must write under tmp_path (conftest's _private_folders)."
                         f"\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(SESSION_TMP, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_folders(tmp_path_factory, monkeypatch):
    """Every test gets its own home, cache and runs folder in a temp folder of its own (not
    its tmp_path, which stays as empty as the test expects): no test reads or writes the
    user's ~/.cache/gputui (kept measurements change predict's and tune's answers), home or
    ./runs. Compile caches (inductor's under /tmp, triton's) stay shared over the session, so
    a compiling test does not start cold each time."""
    for name, value in private_env(tmp_path_factory.mktemp("private")).items():
        monkeypatch.setenv(name, value)
    # the suite run inside a SLURM allocation (an srun step of its own) must not make every
    # test's `gputui run` a job step: the SLURM tests set the variables of their own jobs
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _no_warm_host_left():
    """A warm run host that a test's command started in this process (a sweep's, a verify's:
    `gputui` closes them only at exit) is closed after the test, so the next test on this
    worker starts its runs as it expects (a run in a leftover host reached its first step
    before the sampler's first sample: test_launcher failed)."""
    yield
    from gputui.runs import warm

    warm.close_all()


def pytest_collection_modifyitems(config, items):
    """Files with the most training processes first; skip tests marked gpu on machines
    without CUDA (checked through NVML, not torch)."""
    _heaviest_files_first(items)
    from gputui.hw.discovery import discover_gpus

    gpus, reason = discover_gpus()
    if gpus:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _heaviest_files_first(items) -> None:
    """Order the files by how many of their tests start training processes (the ``slow``
    mark), most first, keeping each file's own order. The README's command hands whole files
    to pytest-xdist's workers in this order: a long file started last would leave the other
    workers idle at the end. Every worker collects the same order (it depends only on the
    items)."""
    def file_of(item) -> str:
        return item.nodeid.split("::")[0]

    slow: dict[str, int] = {}
    for item in items:
        slow[file_of(item)] = slow.get(file_of(item), 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda it: -slow[file_of(it)])  # stable: files and tests keep their order


@pytest.fixture
def fake_gpus(monkeypatch):
    """``fake_gpus(n)``: this process sees n GPUs through a fake pynvml (0 = a machine without
    a GPU: the driver is not loaded), whatever the machine really has; the real NVML comes
    back afterwards. CUDA_VISIBLE_DEVICES is cleared so the fake's order is the CUDA order."""
    from gputui.hw import nvml
    from fakes.nvml import FakeGpu, FakeNvml

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(n: int, name: str = "NVIDIA H100 80GB HBM3"):
        if n == 0:
            mod = FakeNvml([], init_error=FakeNvml.NVMLError_DriverNotLoaded)
        else:
            mod = FakeNvml([FakeGpu(name, f"GPU-{i:04d}-fake", f"00000000:{16 + i:02X}:00.0",
                                    mem_total=80 * 1024**3) for i in range(n)])
        nvml.use_module(mod)
        return mod

    yield install
    nvml.use_module(None)
