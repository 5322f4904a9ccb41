"""The backend interface.

A backend turns a set of MPI-launched ranks into a training setup. Its hooks, all on
:class:`Backend` (the defaults fit a backend that replicates state and averages gradients in
the model wrapper, like DDP):

* the group: :meth:`~Backend.setup` (create it on every rank), :meth:`~Backend.recreate_group`
  (after a release broke it), :meth:`~Backend.teardown`;
* ``jdist.prepare``: :meth:`~Backend.prepare` sees the models and optimizers of one call together
  and may return other objects for them (an engine); by default it calls
  :meth:`~Backend.prepare_model` then :meth:`~Backend.prepare_optimizer` with the model each
  optimizer trains, found by :meth:`~Backend.param_ids`;
* a step: :meth:`~Backend.backward`, :meth:`~Backend.synchronize`, :meth:`~Backend.step_context`,
  :meth:`~Backend.optimizer_step`, :meth:`~Backend.clip_grad_norm_`, :meth:`~Backend.grad_scaler`,
  :meth:`~Backend.set_gradient_sync`;
* what a rank holds: :meth:`~Backend.local_state_bytes` (the memory breakdown, from
  :meth:`~Backend.tensor_bytes` of each tensor); checkpoints: :meth:`~Backend.save_state`,
  :meth:`~Backend.load_state`, :meth:`~Backend.unwrap`;
* after a release: :meth:`~Backend.reattach` each model to the new group, and
  :meth:`~Backend.describe_rebuild` says what was kept (the kernel prints it as it is).

A backend whose engine owns gradient accumulation sets :attr:`~Backend.owns_accumulation`
(jdist then calls :meth:`~Backend.backward` and :meth:`~Backend.optimizer_step` on every
micro-step, without dividing the loss or skipping steps); one that applies ``--precision``
itself sets :attr:`~Backend.owns_precision` (no autocast, no GradScaler from jdist).
:class:`jdist.rank.backends.TorchBackend` is the base over torch.distributed's default group.

Backends run on the ranks only. The kernel knows a backend by its
:class:`jdist.plugins.BackendSpec` (entry point group ``jdist.backends``): its name, its own
options and their checks, and the class here that the ranks import. The values of the
backend's own options reach it as ``ctx.options``.

Example (on a rank):
    >>> from jdist.plugins import backend_spec          # doctest: +SKIP
    >>> backend = backend_spec("ddp").load()()           # doctest: +SKIP
    >>> backend.setup(ctx, timer); model = backend.prepare_model(model)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import datetime
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Sequence


@dataclass(frozen=True)
class PlainDevice:
    """A rank's device where torch is not imported (``--framework tf``): the part of ``torch.device``
    that jdist reads.

    >>> str(PlainDevice()), PlainDevice().type
    ('cpu', 'cpu')
    """

    type: str = "cpu"
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


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
    store_tag: str = ""  # names the group's file store apart from others' (a sweep's slots: jdist.rank.tune)
    #: The rank's guard (:class:`jdist.rank.guard.Guard`): a backend that opens a process group
    #: registers its sockets there (``guard.note_group_sockets``) so a blocked collective can be released.
    guard: Any = None
    #: The values of the backend's own options (its :class:`jdist.plugins.BackendSpec`'s), by name.
    options: dict[str, Any] = field(default_factory=dict)
    #: What the last re-creation of the group did for the groups beyond it (a device mesh's):
    #: :class:`jdist.rank.mesh.groups.RestoreReport`, None before any.
    remade: Any = None

    @property
    def single_host(self) -> bool:
        return self.master_addr == "127.0.0.1"

    @property
    def device_kind(self) -> str:
        return self.device.type

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)


def merged_seconds(intervals: Sequence[tuple[Any, ...]]) -> float:
    """Seconds covered by wall-clock intervals ``(start, end)`` or ``(start, end, dim)``, overlaps counted once.

    >>> merged_seconds([(1.0, 1.5), (1.25, 2.0, "tp"), (3.0, 3.5)])
    1.5
    """
    total = 0.0
    end_so_far = float("-inf")
    for start, end, *_ in sorted(intervals, key=_start_end):
        start = max(start, end_so_far)
        if end > start:
            total += end - start
            end_so_far = end
    return total


def _start_end(interval: tuple[Any, ...]) -> tuple[float, float]:
    return interval[0], interval[1]


def seconds_by_dim(intervals: Sequence[tuple[Any, ...]]) -> dict[str, float] | None:
    """The seconds of the intervals that name a mesh dimension, per dimension (overlaps within one counted once);
    None when none names one.

    >>> seconds_by_dim([(1.0, 1.5, "tp"), (1.25, 2.0, "tp"), (3.0, 3.5, "dp"), (4.0, 5.0)])
    {'tp': 1.0, 'dp': 0.5}
    >>> seconds_by_dim([(1.0, 2.0)]) is None
    True
    """
    by: dict[str, list[tuple[Any, ...]]] = {}
    for interval in intervals:
        if len(interval) > 2:
            by.setdefault(interval[2], []).append(interval)
    return {dim: merged_seconds(group) for dim, group in by.items()} if by else None


class CommTimer:
    """Collects communication intervals; ``jdist.log`` hands them over unread, once per step.

    CPU: wall-clock intervals (``time.perf_counter``), summed with overlaps counted once when
    the records are completed (:func:`merged_seconds`). CUDA: pairs of timing
    events, read once they completed, at publish time, so no step ever waits for the GPU. An interval of a
    collective on a device mesh's dimension carries the dimension's name as a third item (``comm_time_<dim>_s``).

    Beside the intervals, the bytes the collectives carried (:meth:`sent`: DDP's gradient buckets as its
    all-reduce or a compression hook sends them, the inputs of the ``torch.distributed`` collectives timed),
    taken with each record as its ``comm_bytes``.

    >>> t = CommTimer(); t.record(1.0, 1.5)
    >>> t.take_intervals(), t.take_intervals()
    ([(1.0, 1.5)], None)
    >>> t.sent(400); t.sent(200); t.take_sent(), t.take_sent()
    (600, 0)
    """

    def __init__(self) -> None:
        self._intervals: list[tuple[float, float]] = []
        self._events: list[tuple[Any, Any]] = []
        self._sent: list[int] = []

    def sent(self, nbytes: int) -> None:
        """``nbytes`` more carried by this step's collectives (from comm-hook threads too: an append)."""
        self._sent.append(nbytes)

    def take_sent(self) -> int:
        """The bytes carried since the last call."""
        sent = self._sent
        if not sent:
            return 0
        self._sent = []
        return sum(sent)

    def record(self, start: float, end: float, dim: str | None = None) -> None:
        """One wall-clock interval (seconds, perf_counter), on mesh dimension ``dim`` if given. Called from
        comm-hook threads too: ``list.append`` is atomic, and :meth:`take_intervals` swaps the list before anyone
        reads it."""
        self._intervals.append((start, end) if dim is None else (start, end, dim))

    def record_cuda(self, start_event: Any, end_event: Any, dim: str | None = None) -> None:
        """One pair of ``torch.cuda.Event(enable_timing=True)`` around a collective (on mesh dimension ``dim``)."""
        self._events.append((start_event, end_event) if dim is None else (start_event, end_event, dim))

    def take_intervals(self) -> list[tuple[Any, ...]] | None:
        """The wall-clock intervals recorded since the last call (None: none), unread."""
        intervals = self._intervals
        if not intervals:
            return None
        self._intervals = []
        return intervals

    def take(self) -> float:
        """Seconds of wall-clock communication since the last call, overlaps counted once (reads them).

        >>> t = CommTimer(); t.record(1.0, 1.5); t.record(1.25, 2.0); t.take()
        1.0
        """
        return merged_seconds(self.take_intervals() or ())

    def take_all(self) -> tuple[list[tuple[float, float]] | None, list[tuple[Any, Any]] | None]:
        """The wall-clock intervals and the CUDA event pairs recorded since the last call (None: none), unread.

        >>> t = CommTimer(); t.record(1.0, 1.5)
        >>> t.take_all(), t.take_all()
        (([(1.0, 1.5)], None), (None, None))
        """
        intervals, events = self._intervals or None, self._events or None
        if intervals is not None:
            self._intervals = []
        if events is not None:
            self._events = []
        return intervals, events

    def give_back(self, intervals: list[tuple[float, float]] | None, events: list[tuple[Any, Any]] | None) -> None:
        """Put intervals and event pairs taken earlier back, before those recorded since (the next take
        gets them all): a record that was dropped (:mod:`jdist.rank.auto_metrics`) hands its own on."""
        if intervals:
            self._intervals = intervals + self._intervals
        if events:
            self._events = events + self._events


@dataclass
class Preparation:
    """What one ``jdist.prepare`` call gives :meth:`Backend.prepare`.

    ``models``: the modules, in the order given (a model prepared by an earlier call may be
    among them). ``optimizers``: each optimizer with the model it trains (one of ``models``,
    a model prepared earlier, or None when none holds its parameters). ``model_options`` go to
    the model wrapper, ``optimizer_options`` (the names in :attr:`Backend.optimizer_options`) to
    the optimizer's; ``grad_accum``: micro-batches per optimizer step.
    """

    models: list[Any]
    optimizers: list[tuple[Any, Any]]
    model_options: dict[str, Any] = field(default_factory=dict)
    optimizer_options: dict[str, Any] = field(default_factory=dict)
    grad_accum: int = 1


class StateBytes(NamedTuple):
    """Bytes of training state one rank holds: parameters, gradients, optimizer state (the
    ``param_bytes``/``grad_bytes``/``optim_bytes`` metrics; ``total`` is ``state_bytes``)."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def tensor_state(models: Iterable[Any], optimizers: Iterable[Any]) -> Iterable[tuple[str, Any]]:
    """``(kind, tensor)`` for every tensor the models' parameters (``"params"``) and gradients
    (``"grads"``) and the optimizers' state (``"optimizer"``) hold, each tensor once."""
    seen: set[int] = set()
    for model in models:
        for p in model.parameters():
            for kind, t in (("params", p), ("grads", p.grad)):
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    yield kind, t
    for opt in optimizers:
        for st in opt.state.values():
            for v in st.values():
                if hasattr(v, "element_size") and hasattr(v, "numel") and id(v) not in seen:
                    seen.add(id(v))
                    yield "optimizer", v


def plain_bytes(tensor: Any) -> int:
    """The bytes of a tensor's own storage (what :meth:`Backend.tensor_bytes` counts by default)."""
    return tensor.numel() * tensor.element_size()


def count_state_bytes(models: Iterable[Any], optimizers: Iterable[Any], bytes_of: Any = plain_bytes) -> StateBytes:
    """``bytes_of`` each tensor of :func:`tensor_state` (each once), summed by kind."""
    sums = {"params": 0, "grads": 0, "optimizer": 0}
    for kind, t in tensor_state(models, optimizers):
        sums[kind] += bytes_of(t)
    return StateBytes(**sums)


#: > 0 while :func:`timed_call` (or a timing communication hook) runs a collective: a timed collective
#: that calls another (FSDP's timed all-gather calls ``dist.all_gather_single``, timed too with automatic
#: metrics on) is counted once, by the outermost.
TIMING = [0]


def timed_call(timer: CommTimer | None, kind: str, call: Callable[[], Any], async_op: bool,
               dim: str | None = None) -> Any:
    """Run one collective (``call``) and report its interval to ``timer``: wall clock on CPU
    ranks (an async one: until its future completes), a pair of CUDA events on GPU ranks; ``dim``: the mesh
    dimension of its group. Inside another timed collective (:data:`TIMING`) it only runs it."""
    if timer is None or TIMING[0]:
        return call()
    TIMING[0] += 1
    try:
        return _timed_call(timer, kind, call, async_op, dim)
    finally:
        TIMING[0] -= 1


def _timed_call(timer: CommTimer, kind: str, call: Callable[[], Any], async_op: bool, dim: str | None) -> Any:
    if kind == "cuda":
        import torch

        start_ev = torch.cuda.Event(enable_timing=True)
        start_ev.record()
        work = call()
        if work is not None and async_op:

            def done(fut: Any) -> Any:
                end_ev = torch.cuda.Event(enable_timing=True)
                end_ev.record()
                timer.record_cuda(start_ev, end_ev, dim)
                return fut.value()

            work.get_future().then(done)
        else:
            end_ev = torch.cuda.Event(enable_timing=True)
            end_ev.record()
            timer.record_cuda(start_ev, end_ev, dim)
        return work
    start = time.perf_counter()
    work = call()
    if work is not None and async_op and hasattr(work, "get_future"):
        work.get_future().then(lambda fut: timer.record(start, time.perf_counter(), dim))
    else:
        timer.record(start, time.perf_counter(), dim)
    return work


class Backend(ABC):
    """One distributed training backend (see the module doc for the hooks and their defaults)."""

    name: str = ""
    #: ``"file"``: a checkpoint is one file (the default :meth:`save_state`: rank 0 writes the
    #: replicated state); ``"dir"``: a folder (FSDP: every rank writes its shards).
    checkpoint_layout: str = "file"
    #: Options of ``jdist.prepare`` meant for the optimizer wrapper (the rest go to the model's).
    optimizer_options: tuple[str, ...] = ()
    #: Gradients are averaged by the prepared optimizer (Horovod), not by the model wrapper.
    averages_in_optimizer: bool = False
    #: The backend's engine divides the loss by the accumulation count and skips the optimizer
    #: step on micro-steps itself: jdist calls backward and step on every micro-step as they are.
    owns_accumulation: bool = False
    #: The backend's engine runs the forward in ``--precision`` and scales fp16 losses itself:
    #: jdist adds no autocast and no GradScaler (it tells the engine with :meth:`set_precision`).
    owns_precision: bool = False
    #: jdist's own rank-side options (``--threads``, ``--precision``) that this backend applies itself
    #: (:meth:`apply_option`, and in ``ctx.options`` at :meth:`setup`) instead of jdist's torch code.
    own_rank_options: tuple[str, ...] = ()
    #: The backend reports its communication to the comm timer (records get a comm/compute split).
    times_comm: bool = True
    #: Set by :meth:`setup`.
    ctx: RankContext | None = None

    @classmethod
    def pin_device(cls, world: Any, gpus: bool) -> Any:
        """The device this rank computes on, chosen before the backend is set up (``world``: the rank's
        ``rank``, ``local_rank``, ``size`` and ``hostname``). Default: :class:`PlainDevice` (a framework of its
        own places its work); :class:`~jdist.rank.backends.TorchBackend` pins ``cuda:<local rank>`` with ``--gpus``."""
        return PlainDevice()

    def auto_metric_hooks(self, steps: Any) -> list[Callable[[], None]]:
        """``--auto-metrics on``: install what tells ``steps`` (a :class:`jdist.rank.auto_metrics.AutoSteps`)
        about this framework's backward passes and optimizer steps, and times its communication into the
        comm timer; return the removers (``--auto-metrics off`` calls them). Default: nothing (a framework
        of its own, ``--framework tf``, has its callbacks); :class:`~jdist.rank.backends.TorchBackend`:
        torch's (:func:`jdist.rank.auto_metrics.torch_hooks`); a backend adds its engine's."""
        return []

    def environment(self, ctx: RankContext, cluster_id: str) -> None:
        """After :meth:`setup`: the process environment that code written for the framework expects (default:
        none; torch's backends: torchrun's, :mod:`jdist.rank.torchrun`)."""

    @abstractmethod
    def setup(self, ctx: RankContext, timer: CommTimer) -> None:
        """Create the communication group on this rank.

        The backend reports every communication it times (gradient all-reduce...)
        to ``timer``; the rank runtime reads it once per logged step.
        """

    def prepare(self, p: Preparation) -> tuple[list[Any], list[Any]]:
        """The prepared models and optimizers of one ``jdist.prepare`` call, in the order given.

        Default: each model through :meth:`prepare_model`, then each optimizer through
        :meth:`prepare_optimizer` with the prepared model it trains. An engine that needs both
        at once (DeepSpeed's ``initialize``) overrides this and may return its own objects:
        jdist hands them to the user and calls the step hooks with them.
        """
        prepared = {id(m): self.prepare_model(m, **p.model_options) for m in p.models}
        models = [prepared[id(m)] for m in p.models]
        optimizers = [self.prepare_optimizer(opt, prepared.get(id(m), m) if m is not None else None,
                                             grad_accum=p.grad_accum, **p.optimizer_options)
                      for opt, m in p.optimizers]
        return models, optimizers

    @abstractmethod
    def prepare_model(self, model: Any, **options: Any) -> Any:
        """Move ``model`` to the rank's device and wrap it for this backend."""

    def prepare_optimizer(self, optimizer: Any, model: Any = None, **options: Any) -> Any:
        """Wrap the optimizer if the backend needs it (default: unchanged).

        ``model`` is the prepared model the optimizer trains (None if none was given).
        """
        return optimizer

    def param_ids(self, model: Any) -> set[int]:
        """Ids of the parameters an optimizer of ``model`` (prepared or not) may hold: how jdist
        finds the model an optimizer trains. Default: its parameters now; a backend that
        replaces parameters (FSDP's shards) adds those they replaced."""
        return {id(p) for p in model.parameters()}

    def set_gradient_sync(self, model: Any, sync: bool) -> None:
        """Whether the next backward pass of ``model`` synchronises gradients (accumulation)."""

    def cell_ended(self, error: BaseException | None) -> None:
        """A cell ended on this rank, with ``error`` if it raised (``--framework tf`` notes a failed
        collective there). Default: nothing."""

    def unusable(self) -> str | None:
        """Why this rank's communication cannot be used again in this process (the kernel then restarts
        the ranks), or None. Default: None (a broken group is re-created by :meth:`recreate_group`)."""
        return None

    def namespace(self) -> dict[str, Any]:
        """Names the backend adds to the cells' namespace (``--framework tf``: ``strategy``, ``tf``)."""
        return {}

    def apply_option(self, name: str, value: Any) -> None:
        """One of the backend's own options changed on the running cluster (a live option of its
        :class:`~jdist.plugins.BackendSpec`). Default: the new value is in ``ctx.options``."""
        assert self.ctx is not None
        self.ctx.options[name] = value

    def set_precision(self, precision: str) -> None:
        """``--precision`` changed (at start, or live). Only a backend that :attr:`owns_precision`
        needs it; jdist's autocast handles the others."""

    def unwrap(self, model: Any) -> Any:
        """The user's module inside the backend's wrapper (what a checkpoint stores)."""
        return model

    def backward(self, loss: Any, **kwargs: Any) -> None:
        """Back-propagate ``loss`` (already divided for accumulation and scaled under fp16)."""
        loss.backward(**kwargs)

    def optimizer_step(self, optimizer: Any, closure: Any = None) -> Any:
        """One optimizer step, inside :meth:`step_context`."""
        return optimizer.step(closure) if closure is not None else optimizer.step()

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

    def local_state_bytes(self, models: Sequence[Any], optimizers: Sequence[Any]) -> StateBytes:
        """Bytes this rank holds of ``models``' parameters and gradients and ``optimizers``' state
        (the memory breakdown: ``param_bytes``, ``grad_bytes``, ``optim_bytes``): :meth:`tensor_bytes`
        of each tensor, counted once. Runs on the training thread, at most once a second."""
        return count_state_bytes(models, optimizers, self.tensor_bytes)

    def tensor_bytes(self, tensor: Any) -> int:
        """The bytes of ``tensor`` this rank holds (a sharded tensor: its local shard)."""
        return plain_bytes(tensor)

    def save_state(self, path: Path, model: Any, optimizer: Any, meta: dict[str, Any]) -> None:
        """Write a checkpoint at ``path`` (a temporary name; jdist renames it when every rank is done).

        ``meta``: what jdist stores besides model and optimizer (step, RNG states, scheduler,
        loader...). Collective: called on every rank. Default (replicated state): rank 0 writes
        one ``torch.save`` file with ``meta`` and the unwrapped model's and the optimizer's state dicts.
        """
        import torch

        assert self.ctx is not None
        if self.ctx.rank != 0:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({**meta,
                    "model": self.unwrap(model).state_dict() if model is not None else None,
                    "optimizer": optimizer.state_dict() if optimizer is not None else None}, path)

    def load_state(self, path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
        """Load what :meth:`save_state` wrote into ``model`` and ``optimizer`` (either may be None);
        return the ``meta`` it was given. Collective: called on every rank."""
        import torch

        assert self.ctx is not None
        meta = torch.load(path, map_location=self.ctx.device, weights_only=False)
        if model is not None:
            if meta.get("model") is None:
                raise ValueError(f"{path} holds no model state; load it without model=.")
            self.unwrap(model).load_state_dict(meta["model"])
        if optimizer is not None:
            if meta.get("optimizer") is None:
                raise ValueError(f"{path} holds no optimizer state; load it without optimizer=.")
            optimizer.load_state_dict(meta["optimizer"])
        return meta

    def recreate_group(self) -> Any:
        """A release broke the communication group (the guard closed its sockets): make a new one
        on every rank (collective over MPI, not over the broken group) and return it; each
        prepared model is then :meth:`reattach` ed. Default: no group of its own (None)."""
        return None

    def reattach(self, model: Any, group: Any) -> bool | None:
        """After the process group was re-created (a release broke it): point ``model`` at
        ``group``. True: re-attached; False: it holds the old group and must be prepared
        again; None: nothing to do (default: the model does not hold a group)."""
        return None

    def describe_rebuild(self, reattached: Sequence[str], stale: Sequence[str]) -> tuple[str | None, str | None]:
        """What the kernel says about the models after the group was re-created: ``(kept, lost)``,
        e.g. ``("DDP model(s) model now use the new group", None)``; None: nothing to say.
        ``reattached``/``stale``: the variable names of the models :meth:`reattach` answered
        True/False for."""
        kind = self.name.upper() or "prepared"
        kept = f"{kind} model(s) {', '.join(reattached)} now use the new group" if reattached else None
        lost = (f"{kind} model(s) {', '.join(stale)} hold the old group; prepare them again (e.g. from "
                "jdist.latest_checkpoint), or %dist restart" if stale else None)
        return kept, lost

    def collectives_started(self) -> str | None:
        """A marker that changes whenever this rank starts a collective (the hang watchdog:
        an unchanged marker on a rank sitting in a collective means it is not getting
        anywhere). Called from the guard's thread; must not block. Default: the default
        process group's sequence number, ``"t<n>"``."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        try:
            return f"t{dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()}"
        except RuntimeError:  # a group without sequence numbers
            return None

    @abstractmethod
    def teardown(self) -> None:
        """Release the communication group; safe to call twice."""
