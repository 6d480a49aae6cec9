"""A node that went away mid-run, as the surviving node's host says it (train/peerloss.py):
which node, when, the last checkpoint and the command that resumes it, instead of gloo's raw
line (kept in the detail). The namespace test (test_multinode_faults.py) does it for real."""

from __future__ import annotations

import torch

from gputui.core.config import load_preset
from gputui.core.events import RunFailed, StepMetrics
from gputui.core.presets import resolve_preset
from gputui.train.peerloss import explain, peer_address

GLOO = ("rank 0: RuntimeError: Got the following error when running the callback: "
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] "
        "Read error [10.77.0.2]:24271: Connection reset by peer")


def _cfg(**sets):
    return load_preset(resolve_preset("lenet-ddp-2nodes"),
                       [("--set", k, v) for k, v in sets.items()])


def _step(epoch, step):
    return StepMetrics(epoch=epoch, step=step, global_step=step, steps_per_epoch=8, loss=1.0,
                       samples_per_s=1.0, step_time_s=1.0, lr=0.1)


def test_a_lost_peer_is_the_node_that_went_away(tmp_path):
    torch.save({"position": {"epoch": 1, "step": 8, "epoch_done": True}},
               tmp_path / "checkpoint.pt")
    end = explain(RunFailed(reason=GLOO, detail="Traceback ..."), _cfg(), tmp_path, "run-7",
                  [_step(1, 8), _step(2, 2)])
    assert end.reason == (
        f"node 1 (10.77.0.2) went away at epoch 2 after step 2; the last checkpoint is "
        f"{tmp_path / 'checkpoint.pt'} (end of epoch 1); once every node is back, resume with "
        f"`gputui resume run-7` here and `gputui resume` of its own run on each other node")
    assert end.detail == f"{GLOO}\nTraceback ..."


def test_node_names_and_what_is_left_alone(tmp_path):
    lost = RunFailed(reason="rank 2: DistBackendError: NCCL error: remote process exited or "
                            "there was a network error, Last error: socketProgress: Connection "
                            "closed by remote peer 10.0.0.9<43111>")
    end = explain(lost, _cfg(**{"dist.nnodes": 3, "dist.node_rank": 2}), tmp_path, "r", [])
    assert end.reason == ("a node (10.0.0.9) went away before the first step was recorded; no "
                          "checkpoint was written yet: start the job again on every node")
    assert explain(RunFailed(reason=GLOO), _cfg(**{"dist.node_rank": 1}), tmp_path, "r",
                   []).reason.startswith("node 0 (10.77.0.2) went away")
    other = RunFailed(reason="rank 0: ValueError: bad batch")  # not a lost peer: as it was
    assert explain(other, _cfg(), tmp_path, "r", []) is other
    single = _cfg(**{"dist.nnodes": 1, "dist.rdzv_endpoint": ""})
    assert explain(RunFailed(reason=GLOO), single, tmp_path, "r", []).reason == GLOO
    assert peer_address("Connection closed by peer [fe80::2]:4000") == "fe80::2"
    local = RunFailed(reason=GLOO.replace("10.77.0.2", "127.0.0.1"))  # a rank of this node
    assert explain(local, _cfg(), tmp_path, "r", []) is local
