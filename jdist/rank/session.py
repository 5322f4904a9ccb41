"""The rank session: everything jdist holds on one rank, in one object.

:func:`jdist.rank.rpc.setup` builds a :class:`RankSession` on every rank when the cluster
starts; every rank-side function reaches it through :func:`session`, which says what to do
when it is called outside a ``%%distributed`` cell. It owns:

* ``ctx``: where this rank is (:class:`~jdist.rank.backends.RankContext`: rank, device, MPI comm);
* ``backend`` and ``spec``: the training backend and its metadata (:class:`jdist.plugins.BackendSpec`);
* ``channel``: where messages to the kernel go (:mod:`jdist.rank.channel`);
* ``stream``: the cell's records, batched and numbered (:mod:`jdist.rank.stream`);
* ``sources``: what adds the automatic metrics to the records (:mod:`jdist.rank.sources`);
* ``train``: the training state of :mod:`jdist.rank.training` (precision, accumulation, what was prepared);
* ``log_hooks``: called with every logged record (automatic checkpoints register one);
* ``guard``: stack dumps and the release of blocked collectives (:mod:`jdist.rank.guard`).

Nothing here imports torch. The dependencies run one way: ``api``, ``training``, ``checkpoint``
and ``rpc`` use the session; the session uses none of them.

Example (a session of one process, without MPI or a kernel, as unit tests use it):
    >>> from jdist.rank.channel import ListChannel
    >>> with local_session() as s:
    ...     import jdist
    ...     jdist.log(step=0, loss=0.5)
    ...     s.end_cell()["count"]
    1
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from jdist.plugins import BackendSpec
from jdist.protocol import CellEndMessage, Record

from .backends.base import Backend, CommTimer, RankContext
from .channel import KernelChannel, ListChannel
from .sources import MetricSource, default_sources
from .stream import RecordStream


@dataclass
class TrainState:
    """What :mod:`jdist.rank.training` keeps between cells (torch objects are held, not imported)."""

    precision: str = "fp32"
    grad_accum: int = 1
    micro: int = 0  # training forwards so far (modulo grad_accum: the micro-step)
    forwards: int = 0  # training forwards of prepared models, ever (samples/s counts batches by it)
    sync: bool = True  # the current micro-step synchronises gradients and steps
    backwards: int = 0  # jdist.backward calls so far
    scaler: Any = None
    # prepared objects, weakly: re-running a cell must not keep old models alive
    optimizers: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    models: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)


@dataclass
class RankSession:
    """One rank's jdist runtime (see the module doc)."""

    ctx: RankContext
    backend: Backend | None
    spec: BackendSpec | None
    channel: KernelChannel
    timer: CommTimer = field(default_factory=CommTimer)
    stream: RecordStream = field(default_factory=RecordStream)
    sources: list[MetricSource] = field(default_factory=default_sources)
    train: TrainState = field(default_factory=TrainState)
    log_hooks: dict[str, Callable[[Record], None]] = field(default_factory=dict)
    guard: Any = None  # jdist.rank.guard.Guard
    batch_size: int | None = None
    #: Step of the checkpoint restored last (jdist.restored_step()).
    restored_step: int = 0

    @property
    def backend_name(self) -> str:
        return self.spec.name if self.spec is not None else ""

    def begin_cell(self) -> None:
        """A cell starts (IPython ``pre_run_cell``): new cell id, step clock and sources reset."""
        now = time.perf_counter()
        self.stream.begin_cell(now)
        for source in self.sources:
            source.begin_cell(self, now)

    def end_cell(self) -> CellEndMessage:
        """A cell ended (``post_run_cell``): the rest of its records and their count go to the kernel."""
        self._complete(self.stream.pending, time.perf_counter(), final=True)
        message = self.stream.end_cell()
        self.channel.publish(message)
        return message

    def log(self, rec: Record) -> None:
        """Add the per-step metrics to ``rec``, queue it for the kernel and run the log hooks.

        The hot path: clock reads and counters only. What needs a device or system query is
        filled in once per batch, when a batch is due (:meth:`RecordStream.add`).
        """
        now = time.perf_counter()
        for source in self.sources:
            source.sample(self, rec, now)
        if self.stream.add(rec, now):
            self.stream.flush(now, self.channel, self._complete(self.stream.pending, now, final=False))
        for hook in list(self.log_hooks.values()):
            hook(rec)

    def _complete(self, batch: list[Record], now: float, final: bool) -> int:
        """Let every source fill in ``batch``; how many of its first records are complete."""
        ready = len(batch)
        for source in self.sources:
            ready = min(ready, source.publish(self, batch, now, final))
        return ready

    def publish(self, message: Any) -> None:
        self.channel.publish(message)


_current: RankSession | None = None

NOT_SET_UP = (
    "jdist is not set up in this process. jdist.prepare/jdist.log run on the ranks: "
    "call them inside a %%distributed cell (after %load_ext jdist)."
)


def session() -> RankSession:
    """This rank's session; RuntimeError saying where to call jdist outside a cluster."""
    if _current is None:
        raise RuntimeError(NOT_SET_UP)
    return _current


def current() -> RankSession | None:
    """This rank's session, or None before set-up."""
    return _current


def activate(new: RankSession | None) -> RankSession | None:
    """Make ``new`` this process's session (None: none); returns the previous one."""
    global _current
    previous, _current = _current, new
    return previous


@contextlib.contextmanager
def local_session(channel: KernelChannel | None = None, backend: Backend | None = None) -> Iterator[RankSession]:
    """A session for this process alone (rank 0 of 1, CPU, no MPI, messages kept in a
    :class:`~jdist.rank.channel.ListChannel`), active inside the ``with`` block, one cell begun."""
    import types

    device = types.SimpleNamespace(type="cpu", index=None)  # torch.device("cpu") without importing torch
    ctx = RankContext(rank=0, world_size=1, local_rank=0, local_world_size=1, hostname=socket.gethostname(),
                      device=device, master_addr="127.0.0.1", timeout_s=60.0)
    s = RankSession(ctx=ctx, backend=backend, spec=None, channel=channel if channel is not None else ListChannel())
    previous = activate(s)
    try:
        s.begin_cell()
        yield s
    finally:
        activate(previous)


def describe_rank(s: RankSession) -> dict[str, Any]:
    """The :class:`jdist.protocol.RankInfo` of this rank."""
    from jdist import __version__
    from jdist.protocol import PROTOCOL_VERSION, RankInfo

    ctx = s.ctx
    return RankInfo(rank=ctx.rank, world_size=ctx.world_size, local_rank=ctx.local_rank,
                    local_world_size=ctx.local_world_size, host=ctx.hostname, pid=os.getpid(),
                    device=str(ctx.device), backend=s.backend_name, main_thread=threading.main_thread().ident or 0,
                    protocol=PROTOCOL_VERSION, jdist=__version__)
