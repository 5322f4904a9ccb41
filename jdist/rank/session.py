"""The rank session: everything jdist holds on one rank, in one object.

:func:`jdist.rank.rpc.setup` builds a :class:`RankSession` on every rank when the cluster
starts; every rank-side function reaches it through :func:`session`, which says what to do
when it is called outside a ``%%distributed`` cell. It owns:

* ``ctx``: where this rank is (:class:`~jdist.rank.backends.RankContext`: rank, device, MPI comm);
* ``backend`` and ``spec``: the training backend and its metadata (:class:`jdist.plugins.BackendSpec`);
* ``channel``: where messages to the kernel go (:mod:`jdist.rank.channel`);
* ``stream``: the cell's records, numbered and queued by ``jdist.log`` (:mod:`jdist.rank.stream`);
  ``publisher``: the thread that completes and sends them in batches (:class:`Publisher`);
* ``sources``: what adds the automatic metrics to the records (:mod:`jdist.rank.sources`);
* ``auto``: the records of unchanged code, one per optimizer step, with its loss (``--auto-metrics``,
  :mod:`jdist.rank.auto_metrics`), or None;
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

from .backends.base import TIMING, Backend, CommTimer, PlainDevice, RankContext
from .channel import KernelChannel, ListChannel
from .hostload import HostSampler
from .sources import MetricSource, default_sources, ready, resolve_deferred
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
    # DistributedDataParallel models the code built itself on the default group, timed by jdist (auto metrics)
    timed: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)


def repair_ddp(tr: TrainState) -> list[Any]:
    """Make the DDP models of ``tr`` usable again after a cell stopped in their backward pass (an exception or
    an interrupt between two gradient buckets leaves the reducer expecting the rest: the next backward fails
    with an internal assert of torch's) or after a release re-created the default group (the models the code
    built itself, :attr:`TrainState.timed`, are moved to the new one; prepared ones were re-attached by their
    backend). Called at each cell's start; returns the models it reset.

    >>> repair_ddp(TrainState())
    []
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return []
    world = dist.distributed_c10d._get_default_group()
    repaired = []
    for model, on_world in [*((m, False) for m in list(tr.models)), *((m, True) for m in list(tr.timed))]:
        reducer = getattr(model, "reducer", None)
        if reducer is None or not hasattr(model, "_update_process_group"):
            continue  # not a DistributedDataParallel
        group = world if on_world else model.process_group
        try:
            reducer._check_reducer_finalized()
            unfinished = False
        except RuntimeError:
            unfinished = True
        if unfinished or group is not model.process_group:
            model._update_process_group(group)  # resets the reducer (and points it at the group)
            repaired.append(model)
    return repaired


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
    #: ``jdist.scale_lr``'s (rule, base world size) when the code scaled a learning rate to this world's size: a
    #: resize scales the loaded rates to the new one (:mod:`jdist.rank.elastic`)
    lr_rule: tuple[str, int] | None = None
    #: Environment variables this rank reports to its launcher (``RankInfo.launcher``).
    report_env: tuple[str, ...] = ()
    #: Whether anything times this rank's communication (a jdist backend's comm timer). False in a
    #: process torchrun or Ray Train started: their process group is not jdist's, so records carry step
    #: time only, no communication/compute split.
    comm_timed: bool = True
    #: The automatic step records (``--auto-metrics on``: :class:`jdist.rank.auto_metrics.AutoSteps`), or None.
    auto: Any = None
    #: ``--mesh``'s ``DeviceMesh`` (``mesh`` in the cells: :func:`jdist.rank.mesh.api.set_mesh`), or None.
    mesh: Any = None
    #: The pipeline schedules' actions on this rank (:class:`jdist.rank.mesh.pipeline.PipelineRecorder`), None
    #: until the code imports ``torch.distributed.pipelining`` with ``--auto-metrics`` on.
    pipeline: Any = None
    #: Seconds in ``DataLoader`` iterators' ``__next__`` since the last record (``--auto-metrics``' hook times
    #: them: :func:`jdist.rank.auto_metrics.torch_hooks`; None while nothing does): the records' ``data_time_s``.
    data_s: float | None = None
    #: The ranks running this cell when it runs on some only (``--targets``; None: every rank), until its end:
    #: collectives with others in their group are refused (:mod:`jdist.rank.collectives`).
    cell_ranks: tuple[int, ...] | None = None

    @property
    def backend_name(self) -> str:
        return self.spec.name if self.spec is not None else ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # taken by the publisher thread and the cell's start and end, never by log
        self.publisher: Publisher | None = None
        #: the sources that measure on the training thread, called by every log
        self._at_log = tuple(src.at_log for src in self.sources if hasattr(src, "at_log"))

    def begin_cell(self) -> None:
        """A cell starts (IPython ``pre_run_cell``): new cell id, step clock and sources reset."""
        TIMING[0] = 0  # (a compression hook's future that never completed, in a cell stopped in its backward)
        with self._lock:
            now = time.perf_counter()
            self.stream.begin_cell()
            for source in self.sources:
                source.begin_cell(self, now)
            if self.auto is not None:
                self.auto.begin_cell()
            if self.data_s is not None:
                self.data_s = 0.0
            if self.pipeline is not None:
                self.pipeline.begin_cell()
        if self.train.models or self.train.timed:
            repair_ddp(self.train)

    def end_cell(self) -> CellEndMessage:
        """A cell ended (``post_run_cell``): the rest of its records and their count go to the kernel."""
        if self.auto is not None:
            self.auto.flush()  # the last step's record, held back until now
        with self._lock:
            pending = list(self.stream.pending)
            self._fill(pending, ready(pending, final=True), final=True)
            self.publish_pipeline()  # (before the cell's end: the kernel stops listening there)
            message = self.stream.end_cell()
            self.channel.publish(message)
        self.cell_ranks = None
        return message

    def log(self, rec: Record, deferred: list[tuple[str, Any, Any]] | None = None) -> None:
        """Queue ``rec`` for the kernel and run the log hooks: the hot path.

        Reads a clock and hands over what the comm timer collected since the previous log; no
        device query, no syscall, no lock (the sources' ``at_log`` hooks run here: about once a
        second the bytes of model and optimizer state are counted, which only this thread may
        do). The publisher thread fills in the other automatic metrics (:mod:`jdist.rank.sources`)
        and sends the records in batches.
        """
        now = time.perf_counter()
        auto = self.auto
        if auto is not None and not auto.explicit:
            auto.explicit_log()  # the cell logs itself: no automatic records (nothing doubled)
        for at_log in self._at_log:
            at_log(self, rec, now)
        pipeline = self.pipeline
        if pipeline is not None:
            pipeline.close_step(rec)
        intervals, events = self.timer.take_all()
        rec["comm_bytes"] = self.timer.take_sent()
        rec["data_time_s"] = self.take_data_time()
        self.stream.add((rec, now, intervals, events, self.train.forwards, deferred))
        if self.log_hooks:
            for hook in list(self.log_hooks.values()):
                hook(rec)

    def take_data_time(self) -> float | None:
        """The seconds this rank waited for data since the last record (None: not timed)."""
        data = self.data_s
        if data is not None:
            self.data_s = 0.0
        return data

    def add_entry(self, rec: Record, now: float, intervals: Any, events: Any, forwards: int, deferred: Any) -> None:
        """Queue an automatic step record (:mod:`jdist.rank.auto_metrics`) measured at ``now``: its sequence
        number, the sources' ``at_log``; not the log hooks (automatic checkpoints follow ``jdist.log``)."""
        rec["seq"] = self.stream.seq
        for at_log in self._at_log:
            at_log(self, rec, now)
        self.stream.add((rec, now, intervals, events, forwards, deferred))

    def prepared(self) -> None:
        """``jdist.prepare`` ran: the sources that count what was prepared recount."""
        for source in self.sources:
            hook = getattr(source, "prepared", None)
            if hook is not None:
                hook(self)

    def publish_due(self) -> int:
        """Complete and publish the pending records whose GPU work has finished (the publisher
        thread calls it every ``stream.flush_interval`` seconds); how many went out."""
        with self._lock:
            stream = self.stream
            if not stream.open or not stream.pending:
                return 0
            pending = list(stream.pending)  # a snapshot: log() may append meanwhile
            count = ready(pending, final=False)
            self._fill(pending, count, final=False)
            stream.flush(self.channel, count)
            return count

    def _fill(self, entries: list[Any], count: int, final: bool) -> None:
        """Let every source fill in the first ``count`` entries (their GPU work has finished)."""
        done = entries[:count]
        if not done:
            return
        resolve_deferred(done)
        now = time.perf_counter()
        for source in self.sources:
            source.fill(self, done, now, final)

    def start_publisher(self) -> None:
        """Publish records from a background thread while cells run (on real ranks; without it,
        records go out at the cell's end or with :meth:`publish_due`)."""
        if self.publisher is None:
            self.publisher = Publisher(self)

    def stop_publisher(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
            self.publisher = None

    def publish_pipeline(self) -> None:
        """Send the pipeline actions recorded since the last call (:mod:`jdist.rank.mesh.pipeline`)."""
        pipeline = self.pipeline
        if pipeline is not None and pipeline.rows:
            message = pipeline.message(self.stream.cell)
            if message is not None:
                self.channel.publish(message)

    def publish(self, message: Any) -> None:
        if message["kind"] in ("checkpoint_every", "checkpoint_saved"):
            self.stream.note_checkpoint(message)
        self.channel.publish(message)


class Publisher:
    """The thread that sends a session's records to the kernel every ``stream.flush_interval``
    seconds, so that the training thread never serializes, signals or waits for a socket; on a
    host's lowest rank also the host's load about once a second (:mod:`jdist.rank.hostload`)."""

    def __init__(self, session: RankSession):
        self.session = session
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="jdist-publish", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        s = self.session
        reported = False
        hosts = HostSampler() if s.ctx.local_rank == 0 else None  # the host's lowest rank samples its load
        while not self._stop.wait(s.stream.flush_interval):
            try:
                s.publish_due()
                s.publish_pipeline()
                if hosts is not None and s.stream.open and hosts.due(time.monotonic()):
                    s.channel.publish(hosts.sample(s.stream.cell))
            except Exception as exc:  # never let a bad batch end the thread: the cell's end repairs
                if not reported:  # once: the engine's log, not a line every 0.25 s
                    import sys

                    print(f"jdist: publishing records failed on rank {s.ctx.rank}: {exc!r}", file=sys.__stderr__)
                    reported = True

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


_current: RankSession | None = None

NOT_SET_UP = (
    "jdist is not set up in this process. jdist.prepare/jdist.log run on the ranks: "
    "call them inside a %%distributed cell (after %load_ext jdist) or a script started with jdist run "
    "(jdist.log also under torchrun, srun or mpiexec)."
)


def session() -> RankSession:
    """This rank's session; RuntimeError saying where to call jdist outside a cluster.

    In a process that another launcher started (torchrun, srun, mpiexec), the first call opens a
    session that writes the run log (:mod:`jdist.rank.filelog`)."""
    if _current is None:
        from .filelog import open_session

        opened = open_session(lambda ctx, channel: RankSession(ctx=ctx, backend=None, spec=None, channel=channel,
                                                                     comm_timed=False))
        if opened is None:
            raise RuntimeError(NOT_SET_UP)
        activate(opened)
        return opened
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
    ctx = RankContext(rank=0, world_size=1, local_rank=0, local_world_size=1, hostname=socket.gethostname(),
                      device=PlainDevice(), master_addr="127.0.0.1", timeout_s=60.0)
    s = RankSession(ctx=ctx, backend=backend, spec=None, channel=channel if channel is not None else ListChannel())
    previous = activate(s)
    try:
        s.begin_cell()
        yield s
    finally:
        activate(previous)


def describe_rank(s: RankSession) -> dict[str, Any]:
    """The :class:`jdist.protocol.RankInfo` of this rank (``launcher``: the environment variables
    its launcher asked for at set-up, :attr:`RankSession.report_env`)."""
    from jdist import __version__
    from jdist.protocol import PROTOCOL_VERSION, RankInfo

    ctx = s.ctx
    return RankInfo(rank=ctx.rank, world_size=ctx.world_size, local_rank=ctx.local_rank,
                    local_world_size=ctx.local_world_size, host=ctx.hostname, pid=os.getpid(),
                    device=str(ctx.device), backend=s.backend_name, main_thread=threading.main_thread().ident or 0,
                    protocol=PROTOCOL_VERSION, jdist=__version__,
                    launcher={name: os.environ.get(name) for name in s.report_env})
