"""Records without ``jdist.log``: each optimizer step of an unchanged script is one record, with its loss.

``--auto-metrics on`` (the default; :data:`jdist.options.ClusterConfig.auto_metrics`) gives every rank an
:class:`AutoSteps` and the hooks its backend installs (:meth:`jdist.rank.backends.Backend.auto_metric_hooks`):

* **a step** ends at the first optimizer step after at least one backward pass: torch's global
  ``register_optimizer_step_post_hook`` (every ``torch.optim.Optimizer`` the script builds, Horovod's
  ``DistributedOptimizer`` included), ``GradScaler.step`` (also a step it skips for inf/nan), and a
  backend's engine step (DeepSpeed: ``engine.step()`` on an accumulation boundary). Several backwards
  before one step (gradient accumulation) are one step; a second optimizer stepped after the same
  backwards adds nothing (nor do optimizers nested in another's step);
* **the loss** is the sum, over the backwards of the step, of the value of each scalar tensor
  ``.backward()`` was called on (``torch.autograd.backward`` without explicit gradients):
  ``loss.backward()``, ``scaler.scale(loss).backward()`` (the loss before scaling),
  ``engine.backward(loss)`` (DeepSpeed: ``loss / gradient_accumulation_steps``). With one backward a
  step that is its loss; with accumulation of ``loss / K`` (the usual way) the mean loss of the K
  micro-batches. The tensors are kept, not read: the record of step N is queued at step N+1 (or at the
  cell's end), and its values are read by the session's publisher thread (CPU), or copied to the host by
  that thread, a batch at once (GPU, :func:`jdist.rank.sources.copy_to_host`): the step never waits for the
  device and makes no CUDA call for its loss;
* **communication time**: the intervals of the collectives the rank starts, from the comm timer
  (:class:`~jdist.rank.backends.base.CommTimer`): see :func:`torch_hooks` for what is timed and what is missed;
  and the bytes they carried (``comm_bytes``: a DDP timed by its reducer, the gradients of each synced backward,
  noted at its forward; the timed collectives' inputs);
* step time, memory and the rest come from the sources (:mod:`jdist.rank.sources`), as for ``jdist.log``.

A cell (or script) that calls ``jdist.log`` itself gets its records from those calls only: at its first
``jdist.log`` the automatic records stop for the rest of the cell, and the step held back (not yet sent)
is dropped, its communication intervals handed to that log's record; so one loss series, the explicit
one, and nothing doubled. ``--auto-metrics off`` installs none of these hooks (and removes them from a
running cluster).

The hot path: per backward one wrapper call (a comparison and a list append), per optimizer step one post hook
(a clock reading, a small dict and tuple: the record held back; on CPU ranks, per DDP its reducer's own
statistics, read on a sample of short steps: :data:`READ_EVERY_S`), per DDP forward a wrapper call that notes
the step and the bytes its backward will all-reduce (an append), per collective a timing wrapper (two clock
readings, its input's size). On GPU ranks, per step a check that the loss
is on the default stream (a stream handle compared; the publisher copies it), and per DDP gradient bucket a CUDA
event recorded in jdist's communication hook, whose future has one Python callback (taking the reduced tensor
out of the all-reduce's result, as torch's own ``allreduce_hook`` does; the bucket's interval ends with the
backward pass, so there is no second callback for timing). A Python comm hook and its callback take the GIL on
the autograd thread: about 100 µs a step at 2 CPU ranks on 2 cores, which is why CPU ranks use DDP's own clock
instead, and 80 to 300 µs at launch-bound ~1.7 ms steps on one H200 (``benchmarks/gpu_hooks.py``), where DDP's
own clock is read by synchronising with its CUDA events. Nothing is read from a device, nothing is locked.

Example (a session of one process; the hooks are torch's):
    >>> import torch
    >>> from jdist.rank.session import local_session
    >>> with local_session() as s:
    ...     steps = enable(s)
    ...     w = torch.nn.Parameter(torch.ones(1)); opt = torch.optim.SGD([w], lr=0.1)
    ...     for i in range(3):
    ...         loss = (w * 2).sum(); loss.backward(); opt.step(); opt.zero_grad()
    ...     records = s.end_cell()["records"]
    ...     disable(s)
    >>> [(r["step"], round(r["loss"], 3)) for r in records]
    [(0, 2.0), (1, 1.6), (2, 1.2)]
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from .backends.base import TIMING, CommTimer
from .collectives import check_group
from .mesh.dims import DIMS
from .mesh.pipeline import install as install_pipeline
from .mesh.timing import group_position
from .mesh.timing import install as install_functional
from .sources import ON_DEVICE, on_default_stream
from .stream import UNSAMPLED, Entry

if TYPE_CHECKING:
    from .session import RankSession

#: The collectives of ``torch.distributed`` that are timed (the names this torch has).
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_single",
               "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "reduce",
               "all_to_all", "all_to_all_single")


#: The argument of each collective whose tensor (or tensors) it sends: (position, keyword); the others, the first.
SENDS = {"all_gather": (1, "tensor"), "all_gather_into_tensor": (1, "input_tensor"),
         "all_gather_single": (1, "input_tensor"), "reduce_scatter": (1, "input_list"),
         "reduce_scatter_tensor": (1, "input"), "reduce_scatter_single": (1, "input"),
         "all_to_all": (1, "input_tensor_list"), "all_to_all_single": (1, "input"),
         "all_reduce_coalesced": (0, "tensors")}


def sent_bytes(tensors: Any) -> int:
    """The bytes of a tensor or a list of them (0 for anything else).

    >>> import torch
    >>> sent_bytes(torch.ones(3)), sent_bytes([torch.ones(2, dtype=torch.float16)] * 2), sent_bytes(None)
    (12, 8, 0)
    """
    if isinstance(tensors, (list, tuple)):
        return sum(sent_bytes(t) for t in tensors)
    try:
        return tensors.numel() * tensors.element_size()
    except AttributeError:
        return 0


#: A DDP timed by its reducer is read about this often (seconds): every step of steps this long or longer, every
#: n-th step of shorter ones (n <= :data:`READ_EVERY_MAX`), its reducer then also keeping statistics of those
#: steps only. A read costs 30-50 µs (the reducer's logging data, copied out of C++), the statistics 10-15 µs.
READ_EVERY_S = 0.01
READ_EVERY_MAX = 10  # (at least two timed steps in the panels' 20 recent ones)


def grad_bytes(ddp: Any) -> int:
    """The bytes of the gradients a ``DistributedDataParallel`` all-reduces each synced backward (its buckets:
    the parameters that require a gradient, but those it was told to ignore)."""
    module = getattr(ddp, "module", None)
    if module is None:
        return 0
    ignored = getattr(ddp, "parameters_to_ignore", ()) or ()
    return sum(p.numel() * p.element_size() for name, p in module.named_parameters()
               if p.requires_grad and name not in ignored)


class _Reduced:
    """A DDP whose all-reduce its reducer times (:meth:`AutoSteps.time_by_reducer`)."""

    __slots__ = ("ref", "end", "timed", "used", "every", "next_read", "read_at", "read_step", "per_step", "nbytes")

    def __init__(self, ddp: Any) -> None:
        self.ref = weakref.ref(ddp)
        self.nbytes = grad_bytes(ddp)  # what its all-reduce carries a synced backward (DDP's buckets, no hook)
        self.end = 0  # the end (epoch ns) of the last interval read
        self.timed = (-1, -1)  # the steps (AutoSteps.steps) of the last two intervals read
        self.used = (-1, -1)  # the last two steps whose forwards it ran (DistributedDataParallel.forward's wrapper)
        self.every = 1  # the reducer keeps statistics of every n-th iteration
        self.next_read = 0  # the step (AutoSteps.steps) at which it holds a new one
        self.read_at: float | None = None  # (perf_counter, step) of the last read that found one
        self.read_step = 0
        self.per_step: float | None = None  # seconds a step, smoothed over the reads


class AutoSteps:
    """One rank's automatic step records (see the module doc). The hooks call :meth:`backward` /
    :meth:`root` and :meth:`stepped`; the session calls :meth:`begin_cell`, :meth:`explicit_log`
    (a ``jdist.log`` of the script's) and :meth:`flush` (the cell's end)."""

    def __init__(self, session: RankSession) -> None:
        self.session = session
        self.uninstall: list[Callable[[], None]] = []  # what the hooks' installers return
        self.mute = 0  # > 0 inside an engine's backward that reported its loss itself
        self.backward_depth = 0  # > 0 inside torch.autograd.backward (its wrapper)
        self.comm_starts: list[tuple[Any, str | None]] = []  # DDP buckets in flight (start, mesh dimension):
        # their ends are the backward's end
        self.kind = session.ctx.device_kind
        self.integration = False  # a framework integration logs on this rank (logs_itself): for every cell
        self.reduced: list[_Reduced] = []  # DDPs their reducer times
        self.next_read = 0  # the first step at which one of them may have a new interval (min of their next_read)
        self.steps = 0  # training steps on this rank, every cell
        self.begin_cell()

    def begin_cell(self) -> None:
        self.backwards = 0  # backward passes since the last step
        self.roots: list[tuple[Any, float]] = []  # (scalar tensor .backward() was called on, factor)
        self.count = 0  # steps recorded in this cell
        self.held: Entry | None = None  # the newest step's entry, queued at the next step or the cell's end
        self.explicit = self.integration  # the cell called jdist.log: its records are those
        self.clock = time.time() - time.perf_counter()  # the reducer's timestamps (epoch ns) to perf_counter

    # -- the hooks ---------------------------------------------------------------------------
    def root(self, tensor: Any, factor: float = 1.0) -> None:
        """A backward pass from the scalar ``tensor`` (its value x ``factor`` is this backward's loss)."""
        self.backwards += 1
        self.roots.append((tensor, factor))

    def backward(self) -> None:
        """A backward pass whose root is not a loss (explicit gradients)."""
        self.backwards += 1

    def comm_ended(self) -> None:
        """A backward pass returned: the DDP buckets it all-reduced are done (DDP waited for them)."""
        starts, self.comm_starts = self.comm_starts, []
        timer = self.session.timer
        if self.kind == "cuda":
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            for start, dim in starts:
                timer.record_cuda(start, end, dim)
        else:
            end = time.perf_counter()
            for start, dim in starts:
                timer.record(start, end, dim)

    def time_by_reducer(self, ddp: Any) -> None:
        """Time a CPU ``DistributedDataParallel``'s all-reduce with its reducer's own clock (DDP's runtime
        statistics: a few clock readings in C++) instead of a Python comm hook, whose future's callback costs a
        GIL hand-over per bucket (about 100 µs a step at 2 ranks on 2 cores). Steps shorter than
        :data:`READ_EVERY_S` are timed on a sample: every n-th one; the others' records have no comm time."""
        ddp._set_ddp_runtime_logging_sample_rate(1)
        ddp._jdist_reduced = r = _Reduced(ddp)
        self.reduced.append(r)
        self.next_read = 0

    def missing(self, step: int) -> bool:
        """Whether a DDP that ran in ``step`` has no interval read for it."""
        for r in self.reduced:  # (a loop, not any(), and `in` on the pairs: every step calls it)
            if step in r.used and step not in r.timed:
                return True
        return False

    def _reduced(self, now: bool) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], bool]:
        """The communication intervals of the backward passes DDP's reducers timed that were not read yet:
        ``(the held step's, this step's, whether the held step's are all there)`` (not: a DDP that ran in it was
        not read at this step, or its reducer did not time that iteration, or its interval was overwritten).

        DDP notes a backward's interval in its logging data at its next forward: the held step's last one,
        or (accumulation that syncs every backward) one of this step's own, told apart by their end. ``now``:
        note this step's at once (``set_runtime_stats_and_log``, C++, a few µs); all are this step's then. Only
        the integers are read (the whole logging data, strings too, as
        ``DistributedDataParallel._get_ddp_logging_data`` gives it, costs about 10 µs more)."""
        held_ends = self.held[0]["time"] if self.held is not None and not now else None  # (the wall clock)
        late: list[tuple[Any, ...]] = []  # (start, end, mesh dimension or None)
        own: list[tuple[Any, ...]] = []
        for r in list(self.reduced):
            ddp = r.ref()
            if ddp is None:
                self.reduced.remove(r)
                continue
            if self.steps not in r.used and (now or self.steps - 1 not in r.used):  # it did not run: nothing new
                continue
            if not now and self.steps < r.next_read:
                continue
            try:
                if now:
                    ddp.logger.set_runtime_stats_and_log()
                data = ddp.logger._get_ddp_logging_data().ints_map
            except (AttributeError, RuntimeError):  # no logger, or no interval to note (no_sync passes only)
                continue
            end = data.get("backward_comm_time_end", 0)
            if not end or end == r.end:  # none new: the iteration was not timed (or did not sync); next step
                r.next_read = self.steps + 1
            else:
                held = held_ends is not None and end * 1e-9 <= held_ends
                step = self.steps - 1 if held else self.steps
                r.end = end
                if held and (r.used[1] if r.used[0] == self.steps else r.used[0]) != step:
                    pass  # the DDP's last iteration before a pause, noted when it ran again: its step went out
                else:
                    r.timed = (step, r.timed[0]) if step != r.timed[0] else r.timed
                    interval: tuple[Any, ...] = (data["backward_comm_time_start"] * 1e-9 - self.clock,
                                                 end * 1e-9 - self.clock)
                    dim = DIMS.of(ddp.process_group) if DIMS.order else None
                    (late if held else own).append(interval if dim is None else (*interval, dim))
                self._pace(r, ddp, data.get("iteration", 0), now)
        step = self.steps  # the next read: of the DDPs running now (one that resumes lowers it at its forward)
        self.next_read = min((r.next_read for r in self.reduced if step in r.used or step - 1 in r.used),
                             default=step + 1)
        return late, own, not self.missing(step - 1)

    def _pace(self, r: _Reduced, ddp: Any, iteration: int, now: bool) -> None:
        """After a read: how often the DDP's reducer times its iterations (about every :data:`READ_EVERY_S`,
        every one while the code logs itself or a step has several backwards, which are read at once), and at
        which step the next one is read: the DDP notes iteration ``i`` at the forward of ``i + 1``, and one step
        is one iteration (else a read finds nothing new and the next step reads again)."""
        t = time.perf_counter()
        if self.explicit or now:
            every = 1
        elif r.read_at is not None and self.steps > r.read_step:
            per_step = (t - r.read_at) / (self.steps - r.read_step)
            r.per_step = per_step if r.per_step is None else 0.75 * r.per_step + 0.25 * per_step  # (smoothed)
            ideal = max(1, min(READ_EVERY_MAX, int(READ_EVERY_S / r.per_step))) if r.per_step > 0 else 1
            # changed only by a quarter or more: each change shifts the iterations the reducer times, so that the
            # next read finds nothing and the step after it reads again (with the steps' jitter, a read in five)
            every = ideal if ideal >= 1.25 * r.every or ideal * 1.25 <= r.every else r.every
        else:
            every = r.every
        if every != r.every:
            ddp._set_ddp_runtime_logging_sample_rate(every)
            r.every = every
        r.read_at, r.read_step = t, self.steps
        r.next_read = self.steps + (iteration // every + 1) * every - iteration

    def stepped(self, *_: Any) -> None:
        """An optimizer step ended: the first after a backward ends the training step (the arguments of torch's
        optimizer step post hook, ``(optimizer, args, kwargs)``, are not used).

        A step of one backward leaves its DDP interval to be read at the next step (the DDP notes it at that
        step's forward), and adds it to its record then, since the record is held back until the next step
        anyway; a step of several backwards (accumulation) reads its last one at once. (So a step of one backward
        right before a step that syncs every backward gets none: that step's forwards overwrite what the DDP
        noted before it is read.)"""
        if not self.backwards:
            return
        if self.comm_starts:  # (a backward outside torch.autograd.backward: torch.autograd.grad)
            self.comm_ended()
        self.steps = step = self.steps + 1
        s = self.session
        timer = s.timer
        late: list[tuple[Any, ...]] = []  # the held step's
        late_complete = own_complete = True
        explicit = self.explicit
        if self.reduced:
            if not explicit:
                if step < self.next_read:  # no DDP has a new interval yet: nothing to read (most short steps)
                    late_complete = not self.missing(step - 1)
                else:  # what the DDPs noted at this step's forwards
                    late, own, late_complete = self._reduced(now=False)
                    for interval in own:
                        timer.record(*interval)
            if explicit or self.backwards > 1:  # this step's own, for its record or jdist.log
                _, own, _ = self._reduced(now=True)
                for interval in own:
                    timer.record(*interval)
                own_complete = not self.missing(step)
        now = time.perf_counter()
        roots, self.roots, self.backwards = self.roots, [], 0
        if explicit:
            return
        rec = {"rank": s.ctx.rank, "cell": s.stream.cell, "seq": 0, "step": self.count, "time": time.time()}
        pipeline = s.pipeline
        if pipeline is not None:  # a pipeline schedule's stage: pp_stage, bubble_frac, its actions
            pipeline.close_step(rec)
        if not own_complete:
            rec["comm_time_s"] = UNSAMPLED
        intervals, events = timer.take_all()
        rec["comm_bytes"] = timer.take_sent()
        rec["data_time_s"] = s.take_data_time()
        entry = (rec, now, intervals, events, s.train.forwards, roots)
        self.count += 1
        held, self.held = self.held, entry
        if held is not None:
            self._queue(held, late, late_complete)

    # -- the session's ---------------------------------------------------------------------------
    def explicit_log(self) -> None:
        """The cell called ``jdist.log``: no automatic records from now on in this cell; the step held
        back is dropped and its communication goes to that log's record."""
        self.explicit = True
        for r in self.reduced:  # each of the code's records gets all of its steps' communication
            ddp = r.ref()
            if ddp is not None and r.every != 1:
                ddp._set_ddp_runtime_logging_sample_rate(1)
                r.every = 1
        held, self.held = self.held, None
        if held is not None:
            own = self._reduced(now=True)[1] if self.reduced else None
            timer = self.session.timer
            timer.give_back((held[2] or []) + (own or []) or None, held[3])
            timer.sent(held[0].get("comm_bytes") or 0)
            if held[0].get("data_time_s") is not None:  # (the data it waited for goes to that log's record too)
                self.session.data_s = (self.session.data_s or 0.0) + held[0]["data_time_s"]

    def flush(self) -> None:
        """The cell ends: queue the step held back."""
        held, self.held = self.held, None
        if held is not None:
            own = self._reduced(now=True)[1] if self.reduced else []
            self._queue(held, own, not self.missing(self.steps))

    def _queue(self, entry: Entry, late: list[tuple[Any, ...]] | None = None, complete: bool = True) -> None:
        """Hand a held step to the session; ``late``: its DDP intervals, read after it was held (``complete``:
        every DDP's; else the record has no comm time)."""
        rec, now, intervals, events, forwards, roots = entry
        if late:
            intervals = (intervals or []) + late
        if not complete:
            rec["comm_time_s"] = UNSAMPLED
        self.session.add_entry(rec, now, intervals, events, forwards, loss_values(roots, self.session))


def loss_values(roots: list[tuple[Any, float]], s: RankSession) -> list[tuple[str, Any, Any]] | None:
    """The deferred ``loss`` of a step (:data:`jdist.rank.stream.Entry`'s last field): CPU tensors are read
    by the publisher thread; CUDA ones on the default stream are kept as they are and copied to the host by
    the publisher, a batch at once (:func:`jdist.rank.sources.copy_to_host`): the step makes no CUDA call
    for its loss. (On another stream: each copied without waiting, one event after the copies.)"""
    if not roots:
        return None
    if s.ctx.device_kind != "cuda" or not any(t.device.type == "cuda" for t, _ in roots):
        return [("loss", roots, None)]
    device = roots[0][0].device
    if all(t.device == device and on_default_stream(t) for t, _ in roots):
        return [("loss", [(t.detach(), f) for t, f in roots], ON_DEVICE)]  # (a graph kept would hold memory)
    import torch

    copies = [(t.detach().to("cpu", non_blocking=True) if t.device.type == "cuda" else t, f) for t, f in roots]
    event = torch.cuda.Event()
    event.record()
    return [("loss", copies, event)]


def logs_itself() -> None:
    """A framework integration that calls ``jdist.log`` on its own schedule (every logging step, not
    every optimizer step) starts: no automatic records on this rank from now on, in this cell (as at a first
    ``jdist.log``) and the next ones (an Accelerate tracker made in one cell logs the training of a later
    one; on the ranks it does not log from, Accelerate's main process being rank 0, nothing is recorded,
    rather than a second, automatic series beside rank 0's)."""
    from .session import current

    s = current()
    if s is not None and s.auto is not None:
        s.auto.integration = True
        if not s.auto.explicit:
            s.auto.explicit_log()


def enable(s: RankSession) -> AutoSteps:
    """Install the automatic step records on this rank (idempotent): the session's :class:`AutoSteps`
    and its backend's hooks (torch's when there is no backend)."""
    if s.auto is not None:
        return s.auto
    steps = AutoSteps(s)
    if s.backend is not None:
        steps.uninstall = list(s.backend.auto_metric_hooks(steps))
    else:
        steps.uninstall = torch_hooks(steps, s.timer, s.ctx.device_kind)
    s.auto = steps
    return steps


def disable(s: RankSession) -> None:
    """Remove every hook :func:`enable` installed (``--auto-metrics off``)."""
    steps, s.auto = s.auto, None
    if steps is not None:
        for undo in reversed(steps.uninstall):
            undo()
        steps.uninstall = []


def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    """Replace ``owner.name`` with ``make(original)``; returns what puts the original back."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, make(original))

    def undo() -> None:
        setattr(owner, name, original)

    return undo


def torch_hooks(steps: AutoSteps, timer: Any, kind: str) -> list[Callable[[], None]]:
    """The hooks of a torch rank; returns their removers.

    * steps: torch's global optimizer step post hook; ``GradScaler.step`` (a step it skips included);
    * the loss: ``torch.autograd.backward`` (``Tensor.backward`` calls it) notes each root that is a
      tensor without explicit gradients; ``GradScaler.scale`` maps a scaled loss to the loss;
    * communication (into ``timer``: wall-clock intervals on CPU ranks, CUDA event pairs on GPU ranks,
      :func:`~jdist.rank.backends.base.timed_call`): a ``DistributedDataParallel`` the script builds is timed,
      on CPU ranks by its reducer's own clock (DDP's runtime statistics, read at the next optimizer step, on a
      sample of short steps: :meth:`AutoSteps.time_by_reducer`; from the first bucket's all-reduce to the last one's
      end, as DDP measures it; the script's own comm hooks are left alone), on GPU ranks by jdist's timing
      communication hook around its all-reduce (:func:`timed_comm_hook`: each bucket from the start of its
      all-reduce to the end of the backward pass, an upper bound with several buckets; a hook the script
      registers later runs inside it: ``register_comm_hook`` and the built-in ones are routed there). A DDP
      whose constructor already registered a hook, as with ``mixed_precision=``, is not timed, and DDP's
      ``static_graph`` and fused-optimizer paths are not tried; and every call of the collectives in
      :data:`COLLECTIVES` through ``torch.distributed`` (the script's own ``dist.all_reduce``; FSDP2's
      all-gathers and reduce-scatters, which it issues through them; DeepSpeed's). A collective issued
      from C++ without passing through Python (DDP's built-in all-reduce, were the hook refused; NCCL
      work inside compiled graphs) and ``barrier`` are not timed. An asynchronous collective counts until its
      future completes. DTensor's functional collectives (tensor and sequence parallel) are timed from their
      issue to their wait (:mod:`jdist.rank.mesh.timing`); each interval names its mesh dimension
      (:data:`jdist.rank.mesh.dims.DIMS`) when the collective's group is one.
    """
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.amp.grad_scaler import GradScaler
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from .backends.base import timed_call

    undo: list[Callable[[], None]] = []
    handle = register_optimizer_step_post_hook(steps.stepped)
    undo.append(handle.remove)

    scaled: list[Any] = [None]  # (the scaled output, the loss) of the last GradScaler.scale
    Tensor = torch.Tensor

    def make_backward(real: Any) -> Any:
        def backward(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> Any:
            if not steps.mute:
                if grad_tensors is None and isinstance(tensors, Tensor):
                    last = scaled[0]
                    if last is not None and last[0] is tensors:
                        scaled[0] = None
                        tensors_ = last[1]
                    else:
                        tensors_ = tensors
                    steps.roots.append((tensors_, 1.0))
                steps.backwards += 1
            steps.backward_depth += 1
            try:
                return real(tensors, grad_tensors, *args, **kwargs)
            finally:
                steps.backward_depth -= 1
                if steps.comm_starts and not steps.backward_depth:
                    steps.comm_ended()

        backward.__wrapped__ = real  # type: ignore[attr-defined]
        return backward

    undo.append(patch(torch.autograd, "backward", make_backward))

    def make_scale(real: Any) -> Any:
        def scale(self: Any, outputs: Any) -> Any:
            out = real(self, outputs)
            if isinstance(outputs, Tensor):
                scaled[0] = (out, outputs)
            return out

        return scale

    def make_step(real: Any) -> Any:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = real(self, *args, **kwargs)
            steps.stepped()  # after the optimizer's own post hook, if it stepped: nothing more
            return out

        return step

    undo.append(patch(GradScaler, "scale", make_scale))
    undo.append(patch(GradScaler, "step", make_step))

    session = steps.session

    def make_collective(real: Any) -> Any:
        at = group_position(real)
        name = f"dist.{real.__name__}"
        sends = SENDS.get(real.__name__, (0, "tensor"))

        def collective(*args: Any, **kwargs: Any) -> Any:
            dim = None
            if DIMS.order:  # a device mesh was built: the collective's group is one of its dimensions?
                dim = DIMS.of(args[at] if at is not None and len(args) > at else kwargs.get("group"))
            if session.cell_ranks is not None:  # a cell on some ranks only: a group with others would hang
                check_group(name, args[at] if at is not None and len(args) > at else kwargs.get("group"),
                            session.cell_ranks)
            if not TIMING[0]:  # (inside a timed one: its bytes are the outer one's)
                timer.sent(sent_bytes(args[sends[0]] if len(args) > sends[0] else kwargs.get(sends[1])))
            return timed_call(timer, kind, lambda: real(*args, **kwargs), bool(kwargs.get("async_op")), dim)

        collective.__wrapped__ = real  # type: ignore[attr-defined]
        collective.__name__ = getattr(real, "__name__", "collective")
        return collective

    for name in COLLECTIVES:
        real = getattr(c10d, name, None)
        if real is None:
            continue
        timed = make_collective(real)
        for module in (dist, c10d):
            if getattr(module, name, None) is real:
                setattr(module, name, timed)
                undo.append(lambda module=module, name=name, real=real: setattr(module, name, real))

    def make_init(real: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if session.cell_ranks is not None:
                check_group("DistributedDataParallel (it broadcasts the parameters of one rank to the others)",
                            kwargs.get("process_group"), session.cell_ranks)
            real(self, *args, **kwargs)
            if not self._comm_hooks:  # none registered while it was built (mixed_precision= registers one)
                if kind == "cpu":
                    steps.time_by_reducer(self)
                    if self.process_group is dist.group.WORLD:  # on the default group: repaired after a release
                        steps.session.train.timed.add(self)
                    return
                time_ddp(self, timer, kind, steps)
                if self._jdist_comm.group is None:  # on the default group: repaired after a release
                    steps.session.train.timed.add(self)

        return __init__

    undo.append(patch(DistributedDataParallel, "__init__", make_init))
    undo.append(install_functional(timer, kind))  # DTensor's (tensor, sequence parallel): once it is imported
    undo.append(install_pipeline(steps.session, timer, kind))  # torch.distributed.pipelining's schedules

    grad_enabled = torch.is_grad_enabled

    def make_forward(real: Any) -> Any:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            r = self.__dict__.get("_jdist_reduced")
            if session.cell_ranks is not None and self.require_backward_grad_sync and grad_enabled():
                check_group("a DistributedDataParallel forward (its backward all-reduces the gradients)",
                            self.process_group, session.cell_ranks)
            if r is not None:
                step = steps.steps + 1  # the step being run (AutoSteps.steps counts those that ended)
                if r.used[0] != step:
                    r.used = (step, r.used[0])
                    if r.next_read < steps.next_read:  # (a DDP that did not run in the last steps)
                        steps.next_read = r.next_read
                if self.require_backward_grad_sync and not self._comm_hooks and grad_enabled():
                    timer.sent(r.nbytes)  # its backward will all-reduce every bucket (a hook counts its own)
            return real(self, *args, **kwargs)

        return forward

    if kind == "cpu":
        undo.append(patch(DistributedDataParallel, "forward", make_forward))
    undo.append(time_data(steps.session))
    return undo


def time_data(s: RankSession) -> Callable[[], None]:
    """Time every ``DataLoader`` iterator's ``__next__`` (a prepared loader's too: it iterates one) into
    ``s.data_s``, the records' ``data_time_s``: two clock readings a batch. Returns the remover."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    clock = time.perf_counter

    def make_next(real: Any) -> Any:
        def __next__(self: Any) -> Any:
            t = clock()
            try:
                return real(self)
            finally:
                if s.data_s is not None:
                    s.data_s += clock() - t

        return __next__

    undo = patch(_BaseDataLoaderIter, "__next__", make_next)
    s.data_s = 0.0

    def remove() -> None:
        undo()
        s.data_s = None

    return remove


class CommHookState:
    """The ``state`` of jdist's timing communication hook on a ``DistributedDataParallel``: its process
    group (None: the default group, looked up at each call, so a group jdist re-created after a release is
    used), the hook the script registered after it (``inner``: ``(state, hook)``), which runs inside the
    timing (None: DDP's all-reduce, the sum divided by the group's size), and ``steps``: with automatic
    metrics on, the :class:`AutoSteps` whose backward wrapper ends the buckets' intervals."""

    def __init__(self, group: Any = None, steps: AutoSteps | None = None) -> None:
        self.group = group
        self.steps = steps
        self.inner: tuple[Any, Callable[..., Any]] | None = None


def _first(fut: Any) -> Any:
    return fut.value()[0]


def timed_comm_hook(timer: CommTimer, kind: str) -> Callable[[Any, Any], Any]:
    """A DDP communication hook that all-reduces each gradient bucket (the process group's own
    ``allreduce``, the bucket multiplied by 1 / the group's size first, as DDP does without a hook, so the
    gradients are the same to the bit) or runs the
    hook in its :class:`CommHookState`, and reports to ``timer`` how long it was in flight: from the start
    of the bucket's all-reduce (CPU: ``time.perf_counter``; GPU: a CUDA timing event, read lazily, so the
    hook never synchronises) to

    * with automatic metrics on (``state.steps``): the end of the backward pass (DDP waits there for every
      bucket), noted by the ``torch.autograd.backward`` wrapper: no callback of jdist's on the future (a
      Python callback is a thread switch with the GIL per bucket); an upper bound where a bucket's
      all-reduce ends before the backward's last gradients are computed (several buckets);
    * otherwise (a prepared model with ``--auto-metrics off``): the completion of the bucket's future, in
      a callback on it."""
    import torch
    import torch.distributed as dist

    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    cuda = kind == "cuda"

    def start_allreduce(state: Any, bucket: Any) -> Any:
        inner = state.inner if state is not None else None
        if inner is not None:
            TIMING[0] += 1  # the collectives it calls are this hook's, counted once
            try:
                return inner[1](inner[0], bucket)
            finally:
                TIMING[0] -= 1
        group = state.group if state is not None and state.group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        timer.sent(tensor.numel() * tensor.element_size())
        tensor.mul_(1.0 / group.size())  # DDP's own scaling (by 1 / world, then the sum): the same bits
        return group.allreduce([tensor], opts).get_future()

    def hook(state, bucket):  # no annotations: DDP checks them at run time
        if cuda:
            start: Any = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            start = time.perf_counter()
        fut = start_allreduce(state, bucket)
        direct = state is None or state.inner is None
        steps = state.steps if state is not None else None
        dim = DIMS.of(state.group if state is not None else None) if DIMS.order else None
        if steps is not None and steps.backward_depth:  # ended by the backward wrapper
            steps.comm_starts.append((start, dim))
            return fut.then(_first) if direct else fut

        def done(f: Any) -> Any:
            if cuda:
                end = torch.cuda.Event(enable_timing=True)
                end.record()  # on the stream the result is ready on
                timer.record_cuda(start, end, dim)
            else:
                timer.record(start, time.perf_counter(), dim)
            return f.value()[0] if direct else f.value()

        return fut.then(done)

    return hook


def time_ddp(ddp: Any, timer: CommTimer, kind: str, steps: AutoSteps | None = None) -> None:
    """Register :func:`timed_comm_hook` on a ``DistributedDataParallel`` (``ddp._jdist_comm``: its state),
    on the DDP's own process group; a hook registered on it later (``register_comm_hook``, or a built-in
    one: its Python equivalent) runs inside the timing hook instead of being refused by DDP."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    group = getattr(ddp, "process_group", None)
    state = CommHookState(None if group is None or group is dist.group.WORLD else group, steps)
    ddp.register_comm_hook(state, timed_comm_hook(timer, kind))
    ddp._jdist_comm = state

    def register_comm_hook(hook_state: Any, hook: Callable[..., Any]) -> None:
        state.inner = (hook_state, hook)

    builtin = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
               dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}

    def register_builtin_comm_hook(comm_hook_type: Any) -> None:
        state.inner = (state.group, builtin[comm_hook_type])

    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = register_builtin_comm_hook


__all__ = ["COLLECTIVES", "SENDS", "AutoSteps", "CommHookState", "disable", "enable", "grad_bytes", "logs_itself",
           "loss_values", "patch", "sent_bytes", "time_data", "time_ddp", "timed_comm_hook", "torch_hooks"]
