"""The automatic metrics: each :class:`MetricSource` adds its fields to the logged records.

A source works at two moments. :meth:`MetricSource.sample` runs on every ``jdist.log`` (the
hot path) and may only read clocks and counters. :meth:`MetricSource.publish` runs once per
batch of records on its way to the kernel (at most every 0.1 s, and at the cell's end): device
and system queries belong there (CUDA memory statistics, CUDA timing events, ``/proc``).

:func:`default_sources` gives one source per group of :data:`jdist.metrics.AUTO_METRICS`
(a test checks that together they produce exactly those names). An automatic metric is
one entry in ``AUTO_METRICS`` (its name and meaning) plus the source that measures it here.

Example:
    >>> from jdist.rank.session import local_session
    >>> with local_session() as s:
    ...     rec = {"rank": 0, "seq": 0, "step": 0}
    ...     s.log(rec)
    ...     _ = s.end_cell()
    >>> sorted(k for k in rec if k.endswith("_s"))
    ['comm_time_s', 'compute_time_s', 'samples_per_s', 'step_time_s']
"""

from __future__ import annotations

import os
import resource
import time
from typing import TYPE_CHECKING, Any, Protocol

from .backends.base import events_seconds

if TYPE_CHECKING:
    from jdist.protocol import Record

    from .session import RankSession

_PAGE = os.sysconf("SC_PAGE_SIZE")


class MetricSource(Protocol):
    #: The record fields this source sets.
    names: tuple[str, ...]

    def begin_cell(self, s: RankSession, now: float) -> None:
        """A cell starts (``now``: ``time.perf_counter()``)."""

    def sample(self, s: RankSession, rec: dict[str, Any], now: float) -> None:
        """On every log: set the fields known now in ``rec`` (clocks and counters only)."""

    def publish(self, s: RankSession, batch: list[Record], now: float, final: bool) -> int:
        """Before ``batch`` goes to the kernel: fill in the rest. Returns how many of its first
        records are complete (the others wait for the next batch); ``final``: the cell ended,
        complete them all."""


class StepTiming:
    """Wall time since the previous log, and how much of it the backend communicated.

    CPU ranks: the union of the communication intervals, at each log. GPU ranks: CUDA timing
    events, read when the batch is published, once they completed, so that no step waits
    for the GPU; a record whose events have not completed goes out with the next batch.
    """

    names = ("step_time_s", "comm_time_s", "compute_time_s")

    def __init__(self) -> None:
        self.t_last = time.perf_counter()
        self.waiting: dict[int, tuple[float, list[tuple[Any, Any]]]] = {}  # seq -> (CPU comm s, CUDA events)

    def begin_cell(self, s: RankSession, now: float) -> None:
        s.timer.take()
        s.timer.take_events()
        self.waiting = {}
        self.t_last = now

    def sample(self, s: RankSession, rec: dict[str, Any], now: float) -> None:
        step_time = now - self.t_last
        self.t_last = now
        comm, events = s.timer.take(), s.timer.take_events()
        rec["step_time_s"] = step_time
        if events:
            self.waiting[rec["seq"]] = (comm, events)
            rec["comm_time_s"] = rec["compute_time_s"] = None
        else:
            _set_comm(rec, comm)

    def publish(self, s: RankSession, batch: list[Record], now: float, final: bool) -> int:
        if not self.waiting:
            return len(batch)
        for i, rec in enumerate(batch):
            entry = self.waiting.get(rec["seq"])
            if entry is None:
                continue
            seconds = events_seconds(entry[1], wait=final)
            if seconds is None:
                return i  # CUDA events complete in order: this record and the later ones wait
            del self.waiting[rec["seq"]]
            _set_comm(rec, entry[0] + seconds)
        return len(batch)


def _set_comm(rec: dict[str, Any], comm: float) -> None:
    step_time = rec["step_time_s"]
    rec["comm_time_s"] = comm = min(comm, step_time)
    rec["compute_time_s"] = step_time - comm


class Memory:
    """CUDA memory allocated (now and peak since the cell started) on GPU ranks; RSS on CPU
    ranks. Read once per published batch (one ``torch.cuda.memory_stats`` call, or one read
    of ``/proc/self/statm``), the same value for every record of the batch."""

    names = ("mem_bytes", "mem_peak_bytes")

    def __init__(self) -> None:
        self._statm: int | None = None

    def begin_cell(self, s: RankSession, now: float) -> None:
        if s.ctx.device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(s.ctx.device)

    def sample(self, s: RankSession, rec: dict[str, Any], now: float) -> None:
        pass

    def publish(self, s: RankSession, batch: list[Record], now: float, final: bool) -> int:
        if batch:
            mem, peak = self.read(s)
            for rec in batch:
                rec["mem_bytes"], rec["mem_peak_bytes"] = mem, peak
        return len(batch)

    def read(self, s: RankSession) -> tuple[int, int]:
        device = s.ctx.device
        if device.type == "cuda":
            import torch

            stats = torch.cuda.memory_stats(device)
            return stats.get("allocated_bytes.all.current", 0), stats.get("allocated_bytes.all.peak", 0)
        if self._statm is None:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        rss = int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE
        return rss, max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


class Throughput:
    """Samples/s: batch size x batches since the previous log (training forwards of prepared
    models, at least 1) / step time, when a batch size is known."""

    names = ("samples_per_s",)

    def __init__(self) -> None:
        self.forwards_seen = 0

    def begin_cell(self, s: RankSession, now: float) -> None:
        self.forwards_seen = s.train.forwards

    def sample(self, s: RankSession, rec: dict[str, Any], now: float) -> None:
        forwards = s.train.forwards
        batches = max(1, forwards - self.forwards_seen)
        self.forwards_seen = forwards
        step_time = rec.get("step_time_s") or 0.0
        rec["samples_per_s"] = s.batch_size * batches / step_time if s.batch_size and step_time > 0 else None

    def publish(self, s: RankSession, batch: list[Record], now: float, final: bool) -> int:
        return len(batch)


def _local_bytes(t: Any) -> int:
    if hasattr(t, "to_local"):  # DTensor: this rank's shard
        t = t.to_local()
    return t.numel() * t.element_size()


def state_bytes(s: RankSession) -> int | None:
    """Bytes this rank holds of prepared models' parameters + gradients and prepared optimizers'
    state (local shards under FSDP); None before anything was prepared. Walks every tensor."""
    models, optimizers = list(s.train.models), list(s.train.optimizers)
    if not models and not optimizers:
        return None
    seen: set[int] = set()
    total = 0
    for model in models:
        for p in model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += _local_bytes(p) + (_local_bytes(p.grad) if p.grad is not None else 0)
    for opt in optimizers:
        for st in opt.state.values():
            for v in st.values():
                if hasattr(v, "element_size") and hasattr(v, "numel") and id(v) not in seen:
                    seen.add(id(v))
                    total += _local_bytes(v)
    return total


class ModelState:
    """:func:`state_bytes`, recounted at most every ``max_age_s`` seconds when a batch is
    published (it walks every tensor)."""

    names = ("state_bytes",)

    def __init__(self, max_age_s: float = 1.0) -> None:
        self.max_age_s = max_age_s
        self.value: int | None = None
        self.at = -1e9

    def begin_cell(self, s: RankSession, now: float) -> None:
        pass

    def invalidate(self) -> None:
        """Recount at the next publish (something was prepared)."""
        self.at = -1e9

    def sample(self, s: RankSession, rec: dict[str, Any], now: float) -> None:
        pass

    def publish(self, s: RankSession, batch: list[Record], now: float, final: bool) -> int:
        if batch and now - self.at >= self.max_age_s:
            self.value, self.at = state_bytes(s), now
        for rec in batch:
            rec["state_bytes"] = self.value
        return len(batch)


def default_sources() -> list[MetricSource]:
    """One of each source, in the order of :data:`jdist.metrics.AUTO_METRICS`."""
    return [StepTiming(), Memory(), Throughput(), ModelState()]
