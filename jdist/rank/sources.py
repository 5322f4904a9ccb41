"""The automatic metrics: each :class:`MetricSource` adds its fields to the logged records.

``jdist.log`` (the hot path) computes none of them: it queues the record with a clock reading,
the communication intervals and CUDA events recorded since the previous log and the
training-forward count (:data:`jdist.rank.stream.Entry`). The session's publisher thread later
takes the leading entries whose GPU work has completed (:func:`ready`, which never waits during
a cell) and lets every source fill them in with :meth:`MetricSource.fill`, once per batch (at
most every 0.25 s, and at the cell's end): device and system queries happen there (CUDA memory
statistics, CUDA timing events, ``/proc``), off the training thread. A source that must measure
on the training thread itself (:class:`ModelState`) also has ``at_log``, which ``jdist.log``
calls with the record; ``prepared`` tells a source that ``jdist.prepare`` ran.

:func:`default_sources` gives one source per group of :data:`jdist.metrics.AUTO_METRICS`
(a test checks that together they produce exactly those names), jdist's own first, then those
of installed metric plugins (:class:`jdist.plugins.MetricSpec`, entry point group ``jdist.metrics``).

Example:
    >>> from jdist.rank.session import local_session
    >>> with local_session() as s:
    ...     import jdist
    ...     jdist.log(step=0, loss=0.5)
    ...     rec = s.end_cell()["records"][0]
    >>> sorted(k for k in rec if k.endswith("_s"))
    ['comm_time_s', 'compute_time_s', 'cpu_wait_s', 'data_time_s', 'samples_per_s', 'step_time_s']
"""

from __future__ import annotations

import os
import resource
import sys
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from .backends.base import StateBytes, merged_seconds, seconds_by_dim
from .mesh.dims import DIMS
from .stream import COMM, DEFERRED, EVENTS, FORWARDS, REC, UNSAMPLED, Entry, T

if TYPE_CHECKING:
    from .session import RankSession

_PAGE = os.sysconf("SC_PAGE_SIZE")


class MetricSource(Protocol):
    """What adds automatic metrics to the records. Optional hooks, called only when a source has
    them: ``at_log(s, rec, now)`` on the training thread by every ``jdist.log`` (keep it to a
    comparison and a dict write: it is the hot path), ``prepared(s)`` after ``jdist.prepare``."""

    #: The record fields this source sets.
    names: tuple[str, ...]

    def begin_cell(self, s: RankSession, now: float) -> None:
        """A cell starts (``now``: ``time.perf_counter()``)."""

    def fill(self, s: RankSession, entries: Sequence[Entry], now: float, final: bool) -> None:
        """Set this source's fields in the records of ``entries`` (in log order, all complete);
        ``final``: these are the cell's last."""


def ready(entries: Sequence[Entry], final: bool) -> int:
    """How many leading entries have all their GPU work done (CUDA timing events, values logged
    as CUDA tensors). During a cell nothing waits: the first unfinished entry and the ones after
    it wait for the next batch. ``final`` (the cell ended): wait for them. Values kept on the device
    (:data:`ON_DEVICE`) are first copied to the host, all of them at once (:func:`copy_to_host`)."""
    copy_to_host(entries)
    for i, entry in enumerate(entries):
        pairs, deferred = entry[EVENTS], entry[DEFERRED]
        events = [end for _, end in pairs] if pairs else []
        if deferred:  # (every record of a CPU rank has its loss here, with no event)
            events.extend(event for _, _, event in deferred if event is not None)
        for event in events:
            if not event.query():
                if not final:
                    return i
                event.synchronize()
    return len(entries)


#: The event of a deferred value that is still a CUDA tensor on its device's default stream, kept by reference
#: (:func:`defer_device_value`): nothing was copied or recorded on the training thread; :func:`copy_to_host` copies
#: every such value of a batch at once.
ON_DEVICE = object()

_DEFAULT_STREAMS: dict[int, int] = {}  # device index -> its default CUDA stream (the raw handle)
_COPY_STREAMS: dict[Any, Any] = {}  # device -> the stream copy_to_host copies on


def on_default_stream(tensor: Any) -> bool:
    """Whether ``tensor`` is a plain CUDA tensor and its device's current stream is the default one (a
    handle compared: well under a µs), so that work on the default stream recorded later covers it."""
    import torch

    if type(tensor) is not torch.Tensor:  # (a DTensor, a subclass: copied on its own)
        return False
    index = tensor.device.index
    default = _DEFAULT_STREAMS.get(index)
    if default is None:
        default = _DEFAULT_STREAMS[index] = torch.cuda.default_stream(index).cuda_stream
    return torch._C._cuda_getCurrentRawStream(index) == default


def copy_to_host(entries: Sequence[Entry]) -> None:
    """Start copying the values the entries keep on the device (:data:`ON_DEVICE`) to the host, off the
    training thread (the publisher's, or the cell's end): per device and dtype one event on the device's
    default stream (after everything the training thread queued there so far, these values included),
    one concatenation and one non-blocking copy on a stream of jdist's own that waits for that event, one
    event after it (the entries' event from now on). Nothing is synchronised; the training stream gets no
    work. A value becomes ``(name, host tensor, event)``, a list of ``(tensor, factor)`` the same list on
    the host."""
    todo: dict[tuple[Any, Any], list[tuple[list[Any], int, int]]] = {}  # (device, dtype) -> (deferred, index, n)
    tensors: dict[tuple[Any, Any], list[Any]] = {}
    for entry in entries:
        deferred = entry[DEFERRED]
        if not deferred:
            continue
        for k, (_, value, event) in enumerate(deferred):
            if event is not ON_DEVICE:
                continue
            parts = [t for t, _ in value] if type(value) is list else [value]  # (on one device)
            key = (parts[0].device, parts[0].dtype)
            if any(t.dtype != key[1] for t in parts):  # (concatenated with the promoted dtype)
                key = (parts[0].device, None)
            todo.setdefault(key, []).append((deferred, k, len(parts)))
            tensors.setdefault(key, []).extend(parts)
    for key, items in todo.items():
        try:
            host, done = _start_copy(key[0], tensors[key])
        except Exception as exc:  # (a CUDA error): the records go out without these values, with one line
            print(f"jdist: copying {len(tensors[key])} logged CUDA value(s) to the host failed, their records have "
                  f"none: {exc!r}", file=sys.__stderr__)
            for deferred, k, _ in items:
                deferred[k] = (deferred[k][0], None, None)
            continue
        j = 0
        for deferred, k, n in items:
            name, value, _ = deferred[k]
            if type(value) is list:
                deferred[k] = (name, [(host[j + i], factor) for i, (_, factor) in enumerate(value)], done)
            else:
                deferred[k] = (name, host[j], done)
            j += n


def _start_copy(device: Any, tensors: list[Any]) -> tuple[Any, Any]:
    """(host tensor of the ``tensors``' values, in order; CUDA event after the copy) (:func:`copy_to_host`)."""
    import torch

    fence = torch.cuda.Event()
    fence.record(torch.cuda.default_stream(device))
    stream = _COPY_STREAMS.get(device)
    if stream is None:
        stream = _COPY_STREAMS[device] = torch.cuda.Stream(device)
    stream.wait_event(fence)
    with torch.cuda.stream(stream):
        flat = torch.cat([t.detach().reshape(1) for t in tensors])  # (mixed dtypes: promoted)
        host = flat.to("cpu", non_blocking=True)  # into pinned memory: asynchronous
        done = torch.cuda.Event()
        done.record(stream)
    for t in tensors:  # made on the default stream, read on this one: not reused before the copy ran
        t.record_stream(stream)
    return host, done


def resolve_deferred(entries: Sequence[Entry]) -> None:
    """Put the values logged as device tensors into their records (their copies have arrived). A value
    may be a list of ``(tensor, factor)``: their sum (an automatic step's loss, :mod:`jdist.rank.auto_metrics`)."""
    for entry in entries:
        if entry[DEFERRED]:
            rec = entry[REC]
            for name, host_copy, _ in entry[DEFERRED]:
                if type(host_copy) is list:
                    rec[name] = _sum_of(host_copy)
                else:
                    rec[name] = None if host_copy is None else host_copy.item()  # (None: its copy failed)


def _sum_of(parts: list[tuple[Any, float]]) -> float | None:
    try:
        if len(parts) == 1:  # (one backward a step: the usual case)
            return parts[0][0].item() * parts[0][1]
        return sum(t.item() * factor for t, factor in parts)
    except (RuntimeError, ValueError, TypeError):  # not a plain one-element tensor (a DTensor...)
        return None


def defer_device_value(value: Any) -> tuple[Any, Any]:
    """Defer reading a one-element CUDA tensor without waiting for the GPU: ``(value, event)``. On the
    device's default stream (as usual) nothing is done here: ``(the tensor, ON_DEVICE)``, copied with the
    batch's other values by the publisher (:func:`copy_to_host`). On another stream: a non-blocking copy
    into pinned memory and an event after it on that stream; the value is read once the event completed
    (:func:`ready`)."""
    if on_default_stream(value):
        return value.detach(), ON_DEVICE  # (a tensor with a graph would keep the graph until then)
    import torch

    host = value.detach().to("cpu", non_blocking=True)  # into pinned memory: asynchronous
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(value.device))
    return host, event


class StepTiming:
    """Wall time since the previous log, and how much of it the backend communicated.

    CPU ranks: the union of the communication intervals recorded between the two logs. GPU
    ranks: CUDA timing events, read when the batch is published, once they completed, so that
    no step waits for the GPU. ``comm_bytes``: what the step's collectives carried, counted as they ran
    (:meth:`~jdist.rank.backends.base.CommTimer.sent`; on every step, also those whose time was not sampled). With device meshes (:mod:`jdist.rank.mesh.dims`), ``comm_time_<dim>_s`` per
    dimension (the part of ``comm_time_s`` on that dimension's groups). A session whose communication nothing times
    (:attr:`~jdist.rank.session.RankSession.comm_timed`: torchrun's or Ray Train's process group) has
    step time only.
    """

    names = ("step_time_s", "comm_time_s", "compute_time_s", "comm_bytes", "data_time_s")

    def __init__(self) -> None:
        self.t_last = 0.0

    def begin_cell(self, s: RankSession, now: float) -> None:
        s.timer.take_all()
        s.timer.take_sent()
        self.t_last = now

    def fill(self, s: RankSession, entries: Sequence[Entry], now: float, final: bool) -> None:
        t_last = self.t_last
        if not s.comm_timed:
            for entry in entries:
                entry[REC]["step_time_s"] = entry[T] - t_last
                entry[REC]["comm_bytes"] = None
                entry[REC].setdefault("data_time_s", None)
                t_last = entry[T]
            self.t_last = t_last
            return
        for entry in entries:
            rec, t = entry[REC], entry[T]
            step_time = t - t_last
            t_last = t
            rec["step_time_s"] = step_time
            rec.setdefault("comm_bytes", 0)  # (counted at the step, every step: sampled or not)
            rec.setdefault("data_time_s", None)
            dims = DIMS.order
            if rec.get("comm_time_s") is UNSAMPLED:  # a step whose communication was not timed: None, as a
                rec["comm_time_s"] = rec["compute_time_s"] = None  # missing field is (same fields: the fast batch)
                for dim in dims:
                    rec[f"comm_time_{dim}_s"] = None
                continue
            comm = merged_seconds(entry[COMM]) if entry[COMM] else 0.0
            by_dim = seconds_by_dim(entry[COMM]) if dims and entry[COMM] else None
            if entry[EVENTS]:
                comm += sum(ev[0].elapsed_time(ev[1]) for ev in entry[EVENTS]) / 1e3
                if dims:
                    by_dim = by_dim or {}
                    for ev in entry[EVENTS]:
                        if len(ev) > 2:
                            by_dim[ev[2]] = by_dim.get(ev[2], 0.0) + ev[0].elapsed_time(ev[1]) / 1e3
            rec["comm_time_s"] = comm = min(comm, step_time)
            rec["compute_time_s"] = step_time - comm
            for dim in dims:  # every dimension of the meshes the code built, 0 where it did not communicate
                rec[f"comm_time_{dim}_s"] = min(by_dim.get(dim, 0.0), comm) if by_dim else 0.0
        self.t_last = t_last


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

    def fill(self, s: RankSession, entries: Sequence[Entry], now: float, final: bool) -> None:
        if entries:
            mem, peak = self.read(s)
            for entry in entries:
                rec = entry[REC]
                rec["mem_bytes"], rec["mem_peak_bytes"] = mem, peak

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


class CpuWait:
    """How long the rank's main thread (the one that trains) waited for a CPU: runnable, but another process or
    thread had its core (the second field of ``/proc/self/schedstat``, the kernel's run-queue delay). Read once
    per published batch on the publisher thread (one ``pread``), the batch's wait split evenly over its records:
    the windows of :mod:`jdist.metrics.stragglers` sum it, and a rank that waits much longer than the others is
    starved by its host's load (other processes, CPU steal), not slower at the same work. None where the kernel
    keeps no such count (not Linux)."""

    names = ("cpu_wait_s",)

    def __init__(self) -> None:
        self._fd: int | None = None
        self._last: int | None = None

    def _read(self) -> int | None:
        try:
            if self._fd is None:
                self._fd = os.open("/proc/self/schedstat", os.O_RDONLY)
            return int(os.pread(self._fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def begin_cell(self, s: RankSession, now: float) -> None:
        self._last = self._read()

    def fill(self, s: RankSession, entries: Sequence[Entry], now: float, final: bool) -> None:
        if not entries:
            return
        ns = self._read()
        each = None if ns is None or self._last is None else (ns - self._last) / 1e9 / len(entries)
        self._last = ns
        for entry in entries:
            entry[REC]["cpu_wait_s"] = each


class Throughput:
    """Samples/s: batch size x batches since the previous log (training forwards of prepared
    models, at least 1) / step time, when a batch size is known. (Runs after :class:`StepTiming`.)"""

    names = ("samples_per_s",)

    def __init__(self) -> None:
        self.forwards_seen = 0

    def begin_cell(self, s: RankSession, now: float) -> None:
        self.forwards_seen = s.train.forwards

    def fill(self, s: RankSession, entries: Sequence[Entry], now: float, final: bool) -> None:
        batch_size = s.batch_size
        for entry in entries:
            rec, forwards = entry[REC], entry[FORWARDS]
            batches = max(1, forwards - self.forwards_seen)
            self.forwards_seen = forwards
            step_time = rec.get("step_time_s") or 0.0
            rec["samples_per_s"] = batch_size * batches / step_time if batch_size and step_time > 0 else None


def state_bytes(s: RankSession) -> StateBytes | None:
    """Bytes this rank holds of prepared models' parameters and gradients and prepared optimizers'
    state, as its backend counts them (:meth:`jdist.rank.backends.Backend.local_state_bytes`:
    local shards under FSDP and ZeRO); None before anything was prepared. Walks every tensor."""
    from .backends.base import count_state_bytes

    models, optimizers = list(s.train.models), list(s.train.optimizers)
    if not models and not optimizers:
        return None
    if s.backend is not None:
        return s.backend.local_state_bytes(models, optimizers)
    return count_state_bytes(models, optimizers)


class ModelState:
    """:func:`state_bytes`, counted by ``jdist.log`` on the training thread (:meth:`at_log`) at
    most every ``max_age_s`` seconds (it walks every tensor) and put into the records by the publisher
    thread (:meth:`fill`: nothing per record on the training thread). Not counted by the publisher thread:
    autograd sets a parameter's ``.grad`` without holding the GIL, and reading it from another
    thread at that moment crashes the process."""

    names = ("state_bytes", "param_bytes", "grad_bytes", "optim_bytes")

    def __init__(self, max_age_s: float = 1.0) -> None:
        self.max_age_s = max_age_s
        self.value: StateBytes | None = None
        self.due = -1e9  # perf_counter time of the next count

    def begin_cell(self, s: RankSession, now: float) -> None:
        pass

    def prepared(self, s: RankSession) -> None:
        """Recount at the next log (something was prepared)."""
        self.due = -1e9

    def at_log(self, s: RankSession, rec: dict[str, Any], now: float) -> None:
        if now >= self.due:  # count now; the next count is due max_age_s later
            self.value, self.due = state_bytes(s), now + self.max_age_s

    def fill(self, s: RankSession, entries: Sequence[Entry], now: float, final: bool) -> None:
        """The newest count into every record of the batch (a count made at a log of this batch also goes
        into the records logged before it, at most one publish interval earlier)."""
        v = self.value
        values = dict(zip(self.names, (v.total, *v) if v is not None else (None,) * len(self.names)))
        for entry in entries:
            entry[REC].update(values)


def default_sources() -> list[MetricSource]:
    """One of each source, in the order of :data:`jdist.metrics.AUTO_METRICS`: jdist's own, then
    the installed metric plugins' (each :class:`jdist.plugins.MetricSpec` names its source class)."""
    from jdist.plugins import metric_specs

    return [StepTiming(), Memory(), CpuWait(), Throughput(), ModelState(),
            *(spec.load()() for spec in metric_specs())]
