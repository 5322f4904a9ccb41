"""The backend interface and registry.

A backend turns a set of MPI-launched ranks into a training setup: it creates the
communication group on every rank (:meth:`Backend.setup`), wraps what the user
passes to ``jdist.prepare`` (:meth:`Backend.prepare_model`,
:meth:`Backend.prepare_optimizer`) and releases everything (:meth:`Backend.teardown`).
Backends run on the ranks only; the notebook kernel never imports torch for them.

Example (on a rank):
    >>> from jdist.backends import get_backend   # doctest: +SKIP
    >>> backend = get_backend("ddp")()            # doctest: +SKIP
    >>> backend.setup(ctx); model = backend.prepare_model(model)  # doctest: +SKIP
"""

from __future__ import annotations

import datetime
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class RankContext:
    """Everything a backend needs to know about the rank it runs on."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    hostname: str
    device: Any  # torch.device
    master_addr: str
    timeout_s: float
    comm: Any = None  # mpi4py.MPI.Comm over all ranks

    @property
    def device_kind(self) -> str:
        return self.device.type

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)


class CommTimer:
    """Collects communication intervals and turns them into time per step.

    CPU: wall-clock intervals (``time.perf_counter``), merged so overlapping
    buckets are not counted twice. CUDA: pairs of timing events, summed once
    they completed (read lazily, so the hot path never synchronises).

    >>> t = CommTimer(); t.record(1.0, 1.5); t.record(1.25, 2.0)
    >>> t.take()
    1.0
    """

    def __init__(self) -> None:
        self._intervals: list[tuple[float, float]] = []
        self._events: list[tuple[Any, Any]] = []

    def record(self, start: float, end: float) -> None:
        """One wall-clock interval (seconds, perf_counter). Thread-safe (list.append)."""
        self._intervals.append((start, end))

    def record_cuda(self, start_event: Any, end_event: Any) -> None:
        """One pair of ``torch.cuda.Event(enable_timing=True)`` around a collective."""
        self._events.append((start_event, end_event))

    def take(self) -> float:
        """Seconds of communication recorded since the last call, then reset."""
        intervals, self._intervals = self._intervals, []
        events, self._events = self._events, []
        total = 0.0
        end_so_far = float("-inf")
        for start, end in sorted(intervals):
            start = max(start, end_so_far)
            if end > start:
                total += end - start
                end_so_far = end
        for start_ev, end_ev in events:
            end_ev.synchronize()
            total += start_ev.elapsed_time(end_ev) / 1e3
        return total


class Backend(ABC):
    """One distributed training backend. Subclasses register with :func:`register_backend`."""

    name: str = ""

    @abstractmethod
    def setup(self, ctx: RankContext, timer: CommTimer) -> None:
        """Create the communication group on this rank.

        The backend reports every communication it times (gradient all-reduce...)
        to ``timer``; the rank runtime reads it once per logged step.
        """

    @abstractmethod
    def prepare_model(self, model: Any, **options: Any) -> Any:
        """Move ``model`` to the rank's device and wrap it for this backend."""

    def prepare_optimizer(self, optimizer: Any, **options: Any) -> Any:
        """Wrap the optimizer if the backend needs it (default: unchanged)."""
        return optimizer

    @abstractmethod
    def teardown(self) -> None:
        """Release the communication group; safe to call twice."""


_REGISTRY: dict[str, Callable[[], Backend]] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Make ``factory`` available as ``--backend name``."""
    _REGISTRY[name] = factory


def available_backends() -> list[str]:
    """Names accepted by ``--backend``, sorted."""
    return sorted(_REGISTRY)


def get_backend(name: str) -> Callable[[], Backend]:
    """The factory registered as ``name``; a ValueError naming the choices otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"Unknown backend {name!r}. Use --backend with one of: {', '.join(available_backends())}."
        ) from None
