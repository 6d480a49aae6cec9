"""Before a launch: can model_parallel or pp cut the user's model into its stages?

A built-in model's blocks are known without building it (``gputui.core.mp_plan``), so
``plan.validate`` checks its split. A ``model.factory`` model is known only once built, which
runs the user's code: never in this process. :func:`cut_problem` builds it in a short-lived
spawned check child (``gputui.train.cutcheck``), with the strategies' own cut, so a model that
cannot be cut is refused in one line before a run folder exists, not seconds into a run with a
failed record. Asked only for those strategies with a factory; each answer is kept for the
same config (the app asks off its UI thread while the form changes, then at Start). A child
that cannot tell (the model or its data fails to build, it outlasts ``TIMEOUT_S``, it dies)
answers nothing, and the run then reports what happened, with its record. Torch-free.
"""

from __future__ import annotations

import os

from gputui.core.config import RunConfig
from gputui.core.devices import Device, requested_count
from gputui.core.proctree import ask_children
from gputui.core.usercode import parse

CUT_STRATEGIES = ("model_parallel", "pp")
# the keys a cut is decided by: what a refusal is blamed on
CUT_KEYS = ("strategy.name", "devices.spec", "model.factory", "strategy.split_points")
TIMEOUT_S = 120.0  # torch's import and the model's build, on a loaded machine
_ANSWERS: dict[tuple, str | None] = {}


def needs_check(cfg: RunConfig) -> bool:
    """A strategy that cuts the model into stages, and a model only a build can show."""
    if cfg.strategy.name not in CUT_STRATEGIES or not cfg.model.factory:
        return False
    try:
        return parse(cfg.model.factory).kind != "imagefolder"
    except ValueError:  # a malformed spec is check_files' to refuse
        return False


def stages(cfg: RunConfig, devices: list[Device] | None) -> int:
    """How many stages the run cuts the model into: one per device (pp: on every node)."""
    n = len(devices) if devices else max(1, requested_count(cfg.devices.spec))
    return n * cfg.dist.nnodes if cfg.strategy.name == "pp" else n


def cut_problem(cfg: RunConfig, devices: list[Device] | None = None) -> str | None:
    """Why the run's strategy cannot cut its ``model.factory`` model into one stage per
    device (one line), or None (it can, it need not be asked, or the check cannot tell)."""
    if not needs_check(cfg):
        return None
    n = stages(cfg, devices)
    key = (cfg.to_toml(), n, _source_stamp(cfg.model.factory))
    if key not in _ANSWERS:
        answer = _ask_child(cfg, n)
        if answer is not _UNKNOWN:
            _ANSWERS[key] = answer
        return answer if isinstance(answer, str) else None
    return _ANSWERS[key]


_UNKNOWN = object()


def _source_stamp(spec: str) -> tuple:
    """The factory file's size and time (a file edited since is asked again)."""
    f = parse(spec)
    if f.kind != "file":
        return ()
    try:
        st = os.stat(os.path.expanduser(f.target))
    except OSError:
        return ()
    return (st.st_size, st.st_mtime_ns)


def _ask_child(cfg: RunConfig, n: int):
    """The check child's answer: a reason, None (it cuts), or _UNKNOWN. The child and
    anything it started are gone when this returns, whatever happens (Ctrl-C included): it
    runs the user's code, so it is killed as soon as it has answered."""
    from gputui.train.cutcheck import check_main  # torch-free: the spawn target

    answer = ask_children([(check_main, (cfg, n, os.getpid()))], "gputui-cutcheck", TIMEOUT_S,
                          stoppable=False, grace_s=0)
    if not answer.complete:  # no answer in time, or the child died (a model that exits)
        return _UNKNOWN
    kind, text = answer.messages[0]
    return text if kind == "cut" else None if kind == "ok" else _UNKNOWN
