"""A rank's part of naming a hang (``gputui.core.hang``): count every collective it issues in
its row of the node's ledger, as it enters and leaves it, and dump the backend's own trace
when the host asks.

:func:`install` wraps the collective functions of ``torch.distributed`` in this process, so
one place counts what every parallelism issues through them: DDP's gradient all-reduces (its
comm hook calls ``dist.all_reduce``), FSDP2's all-gathers and reduce-scatters
(``fully_shard`` calls ``dist.all_gather_single``/``reduce_scatter_single``, or the
``*_tensor`` forms in older torch), pipeline sends and receives (``dist.isend``/``irecv``,
through ``P2POp``), and gputui's own (the agreed stop, the rows gathered at the log interval,
the evaluation's broadcast). What it cannot count: tensor parallelism's collectives inside
DTensor (functional collectives, ``torch.ops._c10d_functional``, which bypass these
functions: a tp step counts its gputui collectives only), and what C++ issues by itself
(DDP's broadcast of the parameters at start-up). An async collective is left when its work's
future completes. A few float stores per collective; no lock crosses processes.

torch's flight recorder (``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_TRACE_BUFFER_SIZE`` in
older torch, set before the process group is made) keeps the last collectives of each rank in
torch itself: NCCL's, and gloo's in newer torch (2.13 here). When the host asks
(``Ledger.ask_dump``), :func:`dump_trace` writes it to ``ranks/fr-trace-<rank>.pkl`` through
``_dump_fr_trace``, or ``_dump_nccl_trace`` where only that exists.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from gputui.core.hang import KINDS, Ledger

# torch._C._distributed_c10d's dump of the flight recorder, newest name first, and the
# environment variable that sizes the recorder in the torch that has it
DUMPERS = (("_dump_fr_trace", "TORCH_FR_BUFFER_SIZE"),
           ("_dump_nccl_trace", "TORCH_NCCL_TRACE_BUFFER_SIZE"))
TRACE_ENTRIES = "2000"  # collectives the flight recorder keeps per rank
DUMP_POLL_S = 0.25
SHARE_S = 1.0  # how often a rank of a multi-node job publishes its row to the other nodes
SHARE_KEY = "gputui/ledger"  # the store key of a rank's row: SHARE_KEY/<rank>

# torch.distributed's functions -> the kind counted (a name this torch lacks is skipped)
WRAPPED = {"all_reduce": "all-reduce", "all_gather": "all-gather",
           "all_gather_into_tensor": "all-gather", "all_gather_single": "all-gather",
           "all_gather_object": "all-gather", "reduce_scatter": "reduce-scatter",
           "reduce_scatter_tensor": "reduce-scatter", "reduce_scatter_single": "reduce-scatter",
           "broadcast": "broadcast", "broadcast_object_list": "broadcast", "barrier": "barrier",
           "send": "send", "recv": "recv", "isend": "send", "irecv": "recv",
           "all_to_all": "all-to-all", "all_to_all_single": "all-to-all", "gather": "gather",
           "gather_object": "gather", "scatter": "scatter", "reduce": "reduce"}
# also replaced inside distributed_c10d: P2POp and batch_isend_irecv check an op against them
P2P = ("isend", "irecv")


class Counter:
    """This rank's row: enter, leave, the step. Thread-safe within the process (an async
    collective is left from the backend's thread)."""

    def __init__(self, ledger: Ledger, row: int):
        self.ledger, self.row = ledger, row
        self._lock = threading.Lock()
        self._inner = threading.local()  # a counted function calling another: counted once
        self.entered = self.left = 0

    def step(self, n: int) -> None:
        self.ledger.set(self.row, "step", n)
        self.ledger.set(self.row, "t_step", time.time())

    def enter(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self.entered += 1
            led, row = self.ledger, self.row
            led.set(row, "kind", KINDS.index(kind))
            led.set(row, "bytes", nbytes)
            led.set(row, "t_enter", time.time())
            led.set(row, "entered", self.entered)

    def leave(self, *_: Any) -> None:
        with self._lock:
            self.left += 1
            self.ledger.set(self.row, "t_left", time.time())
            self.ledger.set(self.row, "left", self.left)

    def wrap(self, fn: Callable, kind: str) -> Callable:
        """``fn`` counted as ``kind``: entered at the call, left at its return (sync) or when
        its work completes (``async_op=True``, or a work returned)."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._inner, "depth", 0):
                return fn(*args, **kwargs)
            self.enter(kind, _nbytes(args))
            self._inner.depth = 1
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                self.leave()
                raise
            finally:
                self._inner.depth = 0
            return self._left_when_done(out, kind in ("send", "recv"))

        counted.__wrapped__ = fn  # type: ignore[attr-defined]
        counted.__name__ = getattr(fn, "__name__", kind)
        return counted

    def _left_when_done(self, out: Any, p2p: bool) -> Any:
        """``out``, with the collective left now (a sync call), when its work's future
        completes, or (a send or receive whose work has no future, gloo's) when the caller's
        ``wait()`` on it returns."""
        works = out if isinstance(out, list) else [out]
        futures = []
        for work in works:
            get = getattr(work, "get_future", None)
            if get is None:
                continue
            try:
                futures.append(get())
            except Exception:  # noqa: BLE001 - a backend without futures for this work
                continue
        if futures:
            futures[-1].then(self.leave)
            return out
        if p2p and callable(getattr(out, "wait", None)):
            return _Waited(out, self.leave)
        self.leave()  # a sync call, or a work that cannot tell: left at its return
        return out


class _Waited:
    """A send's or receive's work whose backend gives no future: left when ``wait()``
    returns (what the pipeline's schedules call), everything else is the work's own."""

    def __init__(self, work: Any, leave: Callable[[], None]):
        self._work, self._leave, self._done = work, leave, False

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            if not self._done:
                self._done = True
                self._leave()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _nbytes(args: tuple) -> int:
    """The bytes of the tensors among a call's first arguments (a list of them too)."""
    total = 0
    for arg in args[:2]:
        for t in arg if isinstance(arg, (list, tuple)) else [arg]:
            numel = getattr(t, "numel", None)
            size = getattr(t, "element_size", None)
            if callable(numel) and callable(size):
                total += int(numel()) * int(size())
    return total


_COUNTER: Counter | None = None


def install(ledger: Ledger, rank: int, run_dir: str | Path, local_rank: int = 0,
            nodes: int = 1) -> Counter:
    """Count this process's collectives in its row (``rank``'s) of ``ledger`` (once per
    process), and watch for the host's request for the backend's trace; on several
    ``nodes``, share the rows with the other nodes (:func:`_share`)."""
    global _COUNTER
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    row = rank

    env = trace_env(_c10d_module())
    if env:  # read when a process group is made; a size the user set is kept
        os.environ.setdefault(env, TRACE_ENTRIES)
    ledger.join(row, rank, os.getpid())
    counter = _COUNTER = Counter(ledger, row)
    for name, kind in WRAPPED.items():
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        counted = counter.wrap(fn, kind)
        setattr(dist, name, counted)
        if name in P2P:
            setattr(c10d, name, counted)
    threading.Thread(target=_watch_dump, args=(ledger, row, rank, Path(run_dir)),
                     name="gputui-trace-dump", daemon=True).start()
    if nodes > 1:
        threading.Thread(target=_share, args=(ledger, rank, local_rank == 0),
                         name="gputui-ledger-share", daemon=True).start()
    return counter


def _share(ledger: Ledger, rank: int, gather: bool) -> None:
    """Every SHARE_S: publish this rank's row through the job's c10d store (the rendezvous
    store every rank already talks to; its client is thread-safe); with ``gather`` (a node's
    first rank), copy the other nodes' rows into this node's ledger. Ends at the first
    error: the job is ending, and its store may be gone."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    while not dist.is_initialized():
        time.sleep(0.05)  # its first report as soon as it can: a rank may freeze early
    try:
        store = _get_default_store()
        while dist.is_initialized():
            ledger.beat(rank)  # alive, even when its counts stand still (waiting)
            store.set(f"{SHARE_KEY}/{rank}", " ".join(repr(v) for v in ledger.row(rank)))
            if gather:
                for other in range(ledger.rows):
                    key = f"{SHARE_KEY}/{other}"
                    if ledger.get(other, "local") != 1.0 and store.check([key]):
                        text = store.get(key).decode()
                        ledger.put_remote(other, [float(v) for v in text.split()])
            time.sleep(SHARE_S)
    except Exception:  # noqa: BLE001 - a store gone at the job's end: nothing more to share
        return


def at_step(n: int) -> None:
    """The loop is about to run global step ``n`` (nothing when no ledger is installed)."""
    if _COUNTER is not None:
        _COUNTER.step(n)


def _c10d_module() -> Any:
    try:
        import torch._C._distributed_c10d as c10d_c
    except ImportError:
        return None
    return c10d_c


def trace_env(module: Any) -> str:
    """The variable sizing the flight recorder of the torch whose c10d is ``module`` ("" where
    it has none)."""
    return next((env for name, env in DUMPERS if hasattr(module, name)), "")


def _watch_dump(ledger: Ledger, row: int, rank: int, run_dir: Path) -> None:
    while ledger.get(row, "dump") != 1.0:
        time.sleep(DUMP_POLL_S)
    written = dump_trace(_c10d_module(), run_dir / "ranks" / f"fr-trace-{rank}.pkl")
    ledger.set(row, "dump", 2.0 if written else -1.0)


def dump_trace(module: Any, path: Path) -> bool:
    """Write torch's flight recorder (``module._dump_fr_trace()``, or ``_dump_nccl_trace()``
    in a torch without it: pickled bytes) to ``path``; False where this torch has none, or
    it has nothing to give (no process group in this process)."""
    dump = next((getattr(module, name) for name, _ in DUMPERS if hasattr(module, name)), None)
    if dump is None:
        return False
    try:
        data = dump()
    except Exception:  # noqa: BLE001 - no NCCL process group here, or a dump that failed
        return False
    if not data:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError:
        return False
    return True
