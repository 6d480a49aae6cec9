"""ddp/fsdp without processes: what the config refuses (one line, the fix), how the agent
names a failed job's root cause, and the launch config each node gets."""

from __future__ import annotations

import json
import signal

import pytest

from gputui.core.config import ConfigError, RunConfig, apply_overrides, override_origins
from gputui.runs.prepare import prepare
from gputui.train.ranks import failure_event
from gputui.train.ranks import write_failure


def _cfg(**changes) -> RunConfig:
    """The config's own rules (plan.validate); not this machine's disk or network, which a
    launch checks (runs/prepare.check_network: this machine may give a loopback address)."""
    overrides = [("config", k, v) for k, v in changes.items()]
    cfg = apply_overrides(RunConfig(), overrides)
    return prepare(cfg, "config", override_origins(overrides), files=False).config


@pytest.mark.parametrize("changes,message", [
    ({"strategy.name": "scratch", "devices.spec": "cpu*2", "dist.nnodes": 2,
      "dist.rdzv_endpoint": "h:1"},
     "dist.nnodes = 2 needs a multi-process strategy (ddp or fsdp), not 'scratch'"),
    ({"strategy.name": "ddp", "devices.spec": "cpu*2", "strategy.backend": "nccl"},
     "strategy.backend = 'nccl' needs CUDA devices, devices.spec 'cpu*2' gives CPU ones; "
     "use 'gloo' or 'auto'"),
    ({"strategy.name": "fsdp", "devices.spec": "cpu*2", "dist.nnodes": 2,
      "dist.rdzv_endpoint": "10.0.0.1"},
     "dist.rdzv_endpoint must be HOST:PORT, e.g. 10.0.0.1:29400; got '10.0.0.1'"),
    ({"strategy.name": "ddp", "devices.spec": "cpu*2", "dist.nnodes": 2,
      "dist.rdzv_endpoint": "h:1", "optim.batch_size": 6, "optim.micro_batches": 2},
     "optim.batch_size (6) must give every one of the 4 ranks at least one example per "
     "micro-batch; raise the batch size"),
])
def test_refused_with_the_fix(changes, message):
    with pytest.raises(ConfigError) as err:
        _cfg(**changes)
    assert str(err.value) == f"config: {message}"


def test_ddp_is_accepted_on_one_and_many_nodes():
    _cfg(**{"strategy.name": "ddp", "devices.spec": "cpu"})
    _cfg(**{"strategy.name": "fsdp", "devices.spec": "cpu*2", "dist.nnodes": 3,
            "dist.node_rank": 2, "dist.rdzv_endpoint": "node-a.example:29400"})


class Failure:
    """The fields of torch elastic's ProcessFailure the agent reads (a fake at the boundary)."""

    def __init__(self, pid: int, exitcode: int, timestamp: int = 100):
        self.pid, self.exitcode, self.timestamp = pid, exitcode, timestamp

    def signal_name(self) -> str:
        return signal.Signals(-self.exitcode).name


def test_a_killed_rank_is_the_cause_not_the_ranks_it_broke(tmp_path):
    write_failure(tmp_path, 0, "DistBackendError: [gloo] Connection closed by peer", "tb")
    ev = failure_event({0: Failure(11, 1), 1: Failure(12, -signal.SIGKILL)}, tmp_path)
    assert ev.reason == "rank 1 (pid 12) was killed by SIGKILL"
    assert "rank 0: DistBackendError" in ev.detail  # the others are kept for the bug report


def test_a_rank_that_raised_gives_its_own_reason_and_traceback(tmp_path):
    write_failure(tmp_path, 1, "mnist: missing train-images-idx3-ubyte.gz", "Traceback ...")
    info = json.loads((tmp_path / "rank-failures" / "1.json").read_text())
    assert info["comm"] is False
    ev = failure_event({1: Failure(12, 1), 0: Failure(11, -signal.SIGTERM)}, tmp_path)
    assert ev.reason == "rank 1: mnist: missing train-images-idx3-ubyte.gz"
    assert ev.detail.startswith("Traceback ...")


def test_launch_config_per_node(tmp_path):
    from gputui.train.agent import launch_config

    cfg = _cfg(**{"strategy.name": "ddp", "devices.spec": "cpu*2", "dist.nnodes": 2,
                  "dist.node_rank": 1, "dist.rdzv_endpoint": "10.0.0.1:29400",
                  "dist.rdzv_id": "job7"})
    spec = _spec(cfg, tmp_path)
    lc = launch_config(spec)
    assert (lc.min_nodes, lc.max_nodes, lc.nproc_per_node) == (2, 2, 2)
    assert (lc.rdzv_backend, lc.rdzv_endpoint, lc.run_id) == ("c10d", "10.0.0.1:29400", "job7")
    assert lc.rdzv_configs["is_host"] is False and lc.max_restarts == 0
    assert "SIGINT" not in lc.signals_to_handle  # Ctrl-C is a graceful, agreed stop
    one = launch_config(_spec(_cfg(**{"strategy.name": "ddp"}), tmp_path))
    assert one.rdzv_endpoint.startswith("127.0.0.1:") and one.rdzv_configs["is_host"] is True
    assert one.run_id == "r"  # a fresh rendezvous per run on one node


def _spec(cfg, run_dir):
    """The launch spec of a two-device node, as launcher.launch builds it (no channels)."""
    from gputui.core.devices import cpu_devices
    from gputui.core.handoff import LaunchSpec

    return LaunchSpec(config=cfg, devices=tuple(cpu_devices(2)), run_id="r",
                      run_dir=str(run_dir), parent_pid=0, t_launch=0.0)


def _older_launch_config(*drop: str):
    """torch's LaunchConfig as an older torch declares it: the same dataclass without the
    fields ``drop`` names (2.11 has no shutdown_timeout; before 2.9 no signals_to_handle)."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    fields = [(f.name, f.type, f) for f in dataclasses.fields(LaunchConfig) if f.name not in drop]
    return dataclasses.make_dataclass("LaunchConfig", fields)


@pytest.mark.parametrize("drop,passed", [
    ((), {"signals_to_handle", "shutdown_timeout"}),  # as far as the installed torch has them
    (("shutdown_timeout",), {"signals_to_handle"}),  # torch 2.9 to 2.11
    (("shutdown_timeout", "signals_to_handle"), set()),  # before 2.9
])
def test_newer_launcher_arguments_only_where_torch_has_them(tmp_path, drop, passed):
    from gputui.train.agent import OPTIONAL_LAUNCH_ARGS, launch_config

    older = _older_launch_config(*drop)
    passed = passed & {f for f in OPTIONAL_LAUNCH_ARGS if f in older.__dataclass_fields__}
    spec = _spec(_cfg(**{"strategy.name": "ddp"}), tmp_path)
    lc = launch_config(spec, config_class=older)  # an unknown keyword would raise TypeError
    assert lc.nproc_per_node == 2
    for name in OPTIONAL_LAUNCH_ARGS:
        assert hasattr(lc, name) == (name in passed)


def test_the_installed_torch_is_read_not_assumed():
    import inspect

    from torch.distributed.launcher.api import LaunchConfig

    from gputui.train.agent import OPTIONAL_LAUNCH_ARGS, launcher_options

    accepted = set(inspect.signature(LaunchConfig).parameters)
    assert set(launcher_options(LaunchConfig)) == set(OPTIONAL_LAUNCH_ARGS) & accepted
