"""What gputui takes from a SLURM job step's variables (gputui.core.slurm), the one-line
refusals of a step that does not fit, and the sbatch script `gputui slurm` writes. The real
cluster is tests/slurm/test_slurm_cluster.py; here the variables are SLURM's own, as its
srun set them (seen on Debian's slurm-wlm 22.05)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from conftest import GPUTUI
from gputui.core import signals, slurm


def _step_env(**extra: str) -> dict[str, str]:
    """What srun -N2 --ntasks-per-node=1 gives the task on the second node."""
    env = {"SLURM_JOB_ID": "4127", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
           "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS": "2"}
    env.update(extra)
    return env


@pytest.mark.parametrize("nodelist, hosts", [
    ("node1", ["node1"]),
    ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
    ("gpu-a[01-03],login", ["gpu-a01", "gpu-a02", "gpu-a03", "login"]),
    ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
    ("a[9-10],b", ["a9", "a10", "b"]),
])
def test_the_compact_node_list_expands_as_scontrol_does(nodelist, hosts):
    assert slurm.hostnames(nodelist) == hosts


@pytest.mark.parametrize("bad", ["", "node[1-2", "node]1", "node[a-b]"])
def test_a_node_list_that_is_not_one_is_refused(bad):
    with pytest.raises(ValueError):
        slurm.hostnames(bad)


def test_tasks_per_node_reads_slurms_repeat_form():
    assert slurm.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.tasks_per_node("4") == [4]
    with pytest.raises(ValueError):
        slurm.tasks_per_node("two")


def test_one_task_per_node_takes_the_node_rank_first_host_and_a_port_of_the_job():
    step = slurm.from_env(_step_env())
    assert step is not None and not step.per_device
    assert (step.nnodes, step.node_rank) == (2, 1)
    assert step.endpoint == "node1:19127"  # 15000 + 4127
    assert slurm.overrides(step, "all", {}) == [
        ("dist.nnodes", 2), ("dist.node_rank", 1), ("dist.rdzv_endpoint", "node1:19127"),
        ("dist.rdzv_id", "slurm-4127.0")]
    assert slurm.describe(step) == (
        "SLURM job 4127 step 0: node 1 of 2 (node2), rendezvous at node1:19127 (id "
        "slurm-4127.0); one task per node: this node's ranks are its devices")
    # another step of the same job: another port and rendezvous id
    other = slurm.from_env(_step_env(SLURM_STEP_ID="1"))
    assert other is not None and other.endpoint != step.endpoint
    assert other.rdzv_id == "slurm-4127.1"


def test_one_task_per_gpu_makes_each_task_a_node_of_one_rank_on_its_own_gpu():
    env = _step_env(SLURM_STEP_TASKS_PER_NODE="4(x2)", SLURM_PROCID="6", SLURM_LOCALID="2")
    step = slurm.from_env(env)
    assert step is not None and step.per_device
    assert (step.nnodes, step.node_rank) == (8, 6)
    assert dict(slurm.overrides(step, "all", env))["devices.spec"] == "2,"
    # SLURM bound the task to one GPU (--gpus-per-task=1): it is that task's GPU 0
    bound = dict(slurm.overrides(step, "all", {**env, "CUDA_VISIBLE_DEVICES": "2"}))
    assert bound["devices.spec"] == "0,"
    assert dict(slurm.overrides(step, "cpu", env))["devices.spec"] == "cpu"


def test_a_step_of_one_task_keeps_its_own_local_port():
    step = slurm.from_env(_step_env(SLURM_STEP_NODELIST="node1", SLURM_NODEID="0",
                                    SLURM_PROCID="0", SLURM_STEP_TASKS_PER_NODE="1"))
    assert step is not None
    assert slurm.overrides(step, "all", {}) == [("dist.nnodes", 1), ("dist.node_rank", 0)]
    assert slurm.describe(step) == ("SLURM job 4127 step 0: one task on node1: this node's "
                                    "ranks are its devices")


def test_outside_a_job_step_slurm_is_not_used():
    assert slurm.from_env({}) is None
    batch = {k: v for k, v in _step_env().items() if k != "SLURM_STEP_ID"}
    assert slurm.from_env(batch) is None  # the batch script's own shell
    assert slurm.from_env(_step_env(GPUTUI_NO_SLURM="1")) is None
    assert slurm.follower(_step_env()) and not slurm.follower(_step_env(SLURM_NODEID="0"))


def _refusal(env: dict[str, str], multiprocess=True, strategy="ddp", nnodes=1,
             spec="all") -> str:
    step = slurm.from_env(env)
    assert step is not None
    with pytest.raises(slurm.SlurmMismatch) as caught:
        slurm.check(step, multiprocess, strategy, nnodes, spec)
    return str(caught.value)


def test_a_step_that_does_not_fit_the_preset_is_one_line_naming_the_fix():
    # Lightning #20391: --ntasks=3 on 2 nodes, without --ntasks-per-node
    assert _refusal(_step_env(SLURM_STEP_TASKS_PER_NODE="2,1")) == (
        "SLURM spread the step's 3 tasks unevenly over its 2 nodes (2,1): gputui needs the "
        "same number on each; ask for --ntasks-per-node=N (1: one gputui per node, the usual; "
        "or the GPUs of a node) instead of --ntasks")
    assert _refusal(_step_env(), multiprocess=False, strategy="single") == (
        "strategy 'single' runs in one process, but this SLURM step has 2 tasks on 2 node(s); "
        "use a ddp, fsdp or mesh preset, or run `srun -N1 -n1 gputui run ...`")
    assert _refusal(_step_env(), nnodes=4) == (
        "the preset's dist.nnodes = 4, but this SLURM step has 2 nodes; ask SLURM for 4 nodes "
        "(srun -N4 --ntasks-per-node=1) or set --set dist.nnodes=2")
    assert _refusal(_step_env(SLURM_STEP_TASKS_PER_NODE="4(x2)"), nnodes=8, spec="2") == (
        "SLURM started 4 tasks per node (one per device), but the preset's devices.spec '2' "
        "names 2 per node; ask for --ntasks-per-node=2, or --ntasks-per-node=1 (one gputui "
        "per node starts a rank on each of its devices)")
    step = slurm.from_env(_step_env())
    assert step is not None
    slurm.check(step, True, "ddp", 2, "all")  # fits: no error
    with pytest.raises(slurm.SlurmMismatch, match=r"^the preset runs on 4 GPUs per node, but "
                       r"SLURM gave this node 2 \(SLURM_GPUS_ON_NODE\); ask for "
                       r"--gpus-per-node=4, or set devices.spec = 2$"):
        slurm.check_gpus(step, 4, {"SLURM_GPUS_ON_NODE": "2"})


def _run(args: list[str], env: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run([*GPUTUI, *args], env={**clean, **env}, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


@pytest.mark.slow
def test_gputui_run_in_a_step_that_does_not_fit_exits_2_before_anything_starts(tmp_path):
    done = _run(["run", "gpt-tiny", "--runs-dir", str(tmp_path / "runs")], _step_env(),
                tmp_path)
    assert done.returncode == 2
    assert done.stderr == ("gputui: error: strategy 'single' runs in one process, but this "
                           "SLURM step has 2 tasks on 2 node(s); use a ddp, fsdp or mesh "
                           "preset, or run `srun -N1 -n1 gputui run ...`\n")
    assert not (tmp_path / "runs").exists()
    # the step's values go into the config (shown by --dry-run), flags still win
    shown = _run(["run", "gpt-tiny", "--strategy", "ddp", "--dry-run", "--rdzv-endpoint",
                  "127.0.0.1:29400"], _step_env(SLURM_NODEID="0", SLURM_PROCID="0"), tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "nnodes = 2\nnode_rank = 0\nrdzv_endpoint = \"127.0.0.1:29400\"\n" \
           "rdzv_id = \"slurm-4127.0\"" in shown.stdout, shown.stdout


def test_the_sbatch_script_is_commented_valid_bash_that_resumes_on_requeue(tmp_path):
    text = slurm.sbatch_script("/p/gpt.toml", "gpt", 4, 8, "/venv/bin/python -m gputui",
                               "/shared/runs", ["optim.lr=0.1"], time="1-00:00:00",
                               partition="gpu", signal_s=300)
    lines = text.splitlines()
    sbatch = [ln for ln in lines if ln.startswith("#SBATCH")]
    assert all("  # " in ln for ln in sbatch), sbatch  # every option says what it is for
    options = [ln.split()[1] for ln in sbatch]
    assert options == ["--job-name=gputui-gpt", "--nodes=4", "--ntasks-per-node=1",
                       "--gpus-per-node=8", "--time=1-00:00:00", "--partition=gpu",
                       "--signal=USR1@300", "--requeue", "--open-mode=append",
                       "--output=gputui-%j.out"]
    assert "export GPUTUI_RUNS_DIR=/shared/runs" in lines
    assert "    srun $GPUTUI run /p/gpt.toml --set optim.lr=0.1" in lines
    assert '    srun $GPUTUI resume "$last"' in lines
    assert f'if [ "$rc" -eq {128 + signal.SIGUSR1} ]; then' in lines
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    cpu = slurm.sbatch_script("gpt-tiny", "gpt", 2, 0, "gputui", "/r", [])
    assert "--gpus-per-node" not in cpu and "--time" not in cpu and "(CPU ranks)" in cpu


@pytest.mark.parametrize("args, line", [
    (["--nodes", "2", "--gpus-per-node", "0", "--time", "soon"],
     "--time 'soon' is not a SLURM time limit; give minutes (90), HH:MM:SS (01:30:00) or "
     "D-HH:MM:SS (1-00:00:00)"),
    (["--nodes", "2", "--gpus-per-node", "4", "--set", "strategy.name=ddp"],
     "--gpus-per-node 4, but the preset's devices.spec is 'cpu'; add --set "
     "devices.spec=all (each node's GPUs)"),
    (["--nodes", "2", "--gpus-per-node", "0", "--set", "strategy.name=single"],
     "strategy 'single' runs in one process, but this SLURM step has 2 tasks on 2 node(s); "
     "use a ddp, fsdp or mesh preset, or run `srun -N1 -n1 gputui run ...`"),
])
def test_gputui_slurm_refuses_what_cannot_run_in_one_line(args, line, tmp_path, capsys):
    from gputui.cli import main

    assert main(["slurm", "gpt-tiny", "--output", str(tmp_path / "job.sbatch"), *args]) == 2
    assert capsys.readouterr().err == f"gputui: error: {line}\n"
    assert not (tmp_path / "job.sbatch").exists()


def test_gputui_slurm_writes_the_script(tmp_path, capsys):
    from gputui.cli import main

    out = tmp_path / "job.sbatch"
    assert main(["slurm", "gpt-tiny", "--nodes", "2", "--gpus-per-node", "0", "--set",
                 "strategy.name=ddp", "--runs-dir", str(tmp_path / "runs"), "--output",
                 str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}: submit it with `sbatch {out}`\n"
    text = out.read_text()
    assert f"export GPUTUI_RUNS_DIR={tmp_path / 'runs'}" in text
    assert "--set strategy.name=ddp" in text and os.access(out, os.X_OK)


def test_sigusr1_is_a_stop_signal_said_as_the_time_limit_warning():
    assert signal.SIGUSR1 in signals.STOP_SIGNALS
    assert signals.stop_reason(signal.SIGUSR1) == \
        "stopped by SIGUSR1 (a batch system's time-limit warning)"
