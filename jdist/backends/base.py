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

import contextlib
import datetime
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


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
    work_dir: str | None = None  # private folder of the cluster (0700): process-group store, stacks
    port: int | None = None  # fixed TCP rendezvous port (--port); None: a file store in work_dir
    generation: int = 0  # how many times the process group was re-created

    @property
    def single_host(self) -> bool:
        return self.master_addr == "127.0.0.1"

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
    """One distributed training backend. Subclasses register with :func:`register_backend`.

    The training helpers (:mod:`jdist.training`) and checkpoints (:mod:`jdist.checkpoint`)
    are written once against this interface: a backend says how to wrap, how to skip
    gradient sync on accumulation micro-steps, how to clip, which GradScaler to use and
    whether its checkpoints are one file written by rank 0 or sharded.
    """

    name: str = ""
    #: ``"file"``: rank 0 writes one ``torch.save`` file (replicated state);
    #: ``"sharded"``: every rank writes its shard (torch.distributed.checkpoint).
    checkpoint_kind: str = "file"
    #: Options of ``jdist.prepare`` meant for the optimizer wrapper (the rest go to the model's).
    optimizer_options: tuple[str, ...] = ()
    #: Gradients are averaged by the prepared optimizer (Horovod), not by the model wrapper.
    averages_in_optimizer: bool = False
    #: Set by :meth:`setup`.
    ctx: RankContext | None = None

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this backend cannot run in this environment (with the fix), or None.

        Checked in the kernel before any rank starts."""
        return None

    @abstractmethod
    def setup(self, ctx: RankContext, timer: CommTimer) -> None:
        """Create the communication group on this rank.

        The backend reports every communication it times (gradient all-reduce...)
        to ``timer``; the rank runtime reads it once per logged step.
        """

    @abstractmethod
    def prepare_model(self, model: Any, **options: Any) -> Any:
        """Move ``model`` to the rank's device and wrap it for this backend."""

    def prepare_optimizer(self, optimizer: Any, model: Any = None, **options: Any) -> Any:
        """Wrap the optimizer if the backend needs it (default: unchanged).

        ``model`` is the prepared model the optimizer trains (None if none was given).
        """
        return optimizer

    def set_gradient_sync(self, model: Any, sync: bool) -> None:
        """Whether the next backward pass of ``model`` synchronises gradients (accumulation)."""

    def unwrap(self, model: Any) -> Any:
        """The user's module inside the backend's wrapper (what a checkpoint stores)."""
        return model

    def synchronize(self, optimizer: Any) -> None:
        """Finish the gradient reduction now (before clipping or unscaling); default: nothing to do."""

    def step_context(self, optimizer: Any) -> Any:
        """Context for ``optimizer.step()`` after :meth:`synchronize` (default: none)."""
        return contextlib.nullcontext()

    def clip_grad_norm_(self, model: Any, max_norm: float, norm_type: float = 2.0) -> float:
        """Clip the global gradient norm across ranks; returns the norm before clipping."""
        import torch

        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type))

    def grad_scaler(self) -> Any:
        """A GradScaler for fp16 training on this backend."""
        import torch

        assert self.ctx is not None
        return torch.amp.GradScaler(self.ctx.device.type)

    @abstractmethod
    def teardown(self) -> None:
        """Release the communication group; safe to call twice."""


_REGISTRY: dict[str, type[Backend]] = {}


def register_backend(name: str, factory: type[Backend]) -> None:
    """Make ``factory`` available as ``--backend name``."""
    _REGISTRY[name] = factory


def available_backends() -> list[str]:
    """Names accepted by ``--backend``, sorted."""
    return sorted(_REGISTRY)


def get_backend(name: str) -> type[Backend]:
    """The factory registered as ``name``; a ValueError naming the choices otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"Unknown backend {name!r}. Use --backend with one of: {', '.join(available_backends())}."
        ) from None
