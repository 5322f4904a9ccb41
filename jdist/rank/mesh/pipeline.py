"""Pipeline parallel without code: ``torch.distributed.pipelining``'s schedules timed on each stage.

Once the code imports ``torch.distributed.pipelining`` (jdist does not import it: 0.7 s), :func:`install`
wraps, on this rank:

* ``PipelineScheduleSingle.step`` and ``PipelineScheduleMulti.step`` (GPipe, 1F1B, Interleaved 1F1B, the
  zero-bubble ones...): each call's span;
* the stage's ``forward_one_chunk`` (action ``F``), ``backward_one_chunk`` (``B``; the input-gradient half in
  the split schedules) and ``backward_weight_one_chunk`` (``W``): which micro-batch, when;
* the schedules' ``_batch_p2p`` / ``_wait_batch_p2p``: each send and receive from its issue to the end of
  its wait, as communication on the ``pp`` dimension (the mesh dimension of the stage's group, or ``pp``
  for the world group and groups no mesh named); a receive counts the wait for the stage before it;
* ``_update_losses``: the last stage's per-micro-batch losses, whose mean is the step's ``loss``.

Each record of the rank (an optimizer step with ``--auto-metrics``, or a ``jdist.log``) then has ``pp_stage``
(the lowest stage index the rank runs) and ``bubble_frac``: the share of the time since its previous record
(the cell's first: since its first schedule step) in which the rank ran no action
(:meth:`PipelineRecorder.close_step`). In the steady state every stage steps at the pipeline's period, so a
GPipe of ``p`` equal stages and ``m`` micro-batches idles ``(p - 1) / (m + p - 1)`` of it on every rank,
the optimizer step's own time added (tests/test_mesh.py measures it). The actions go to
the kernel as ``pipeline`` messages (:class:`jdist.protocol.PipelineMessage`) and become the run's
timeline, :attr:`jdist.metrics.Run.pipeline`. On GPU ranks an action's ends are host clock readings
(``F``/``B`` calls return when their kernels are queued, not done): the timeline is the host's view.

Example (one process: a pipeline of one stage, two micro-batches, automatic records):
    >>> import torch, torch.distributed as dist
    >>> from jdist.rank.auto_metrics import disable, enable
    >>> from jdist.rank.session import local_session
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> with local_session() as s:
    ...     steps = enable(s)
    ...     from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    ...     model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ...     stage = PipelineStage(model, 0, 1, torch.device("cpu"))
    ...     schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, y: (out - y).pow(2).mean())
    ...     losses = []
    ...     out = schedule.step(torch.ones(4, 4), target=torch.zeros(4, 1), losses=losses); opt.step()
    ...     records = s.end_cell()["records"]
    ...     disable(s)
    >>> rec = records[0]
    >>> rec["pp_stage"], 0 <= rec["bubble_frac"] < 1, rec["loss"] == sum(l.item() for l in losses) / 2
    (0, True, True)
    >>> [row[4] for m in s.channel.messages if m["kind"] == "pipeline" for row in m["rows"]]
    ['F', 'F', 'B', 'B']
    >>> dist.destroy_process_group()
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from jdist.protocol import PROTOCOL_VERSION

from jdist.common.stacks import WAITING_FOR

from ..backends.base import merged_seconds
from ..imports import after_import
from .dims import DIMS

if TYPE_CHECKING:
    from ..session import RankSession

#: The package whose import installs the hooks.
PACKAGE = "torch.distributed.pipelining"
#: Issued sends/receives whose wait was not seen yet, at most.
PENDING_MAX = 1024
#: Actions kept until a record takes them, at most (schedules stepped with no optimizer step, ``eval`` in a
#: loop: the oldest half goes).
ACTIONS_MAX = 100_000
#: Timeline rows kept on the rank until the publisher sends them (past it the oldest go: a kernel that
#: does not read must not grow the rank).
ROWS_MAX = 100_000


class PipelineRecorder:
    """One rank's pipeline actions since its previous record (see the module doc)."""

    def __init__(self, session: RankSession) -> None:
        self.session = session
        self.depth = 0  # > 0 inside a schedule's step()
        self.actions: list[tuple[int, int, str, float, float]] = []  # (stage, microbatch, action, start, end)
        self.window_start: float | None = None  # the previous record's close (or the cell's first schedule step)
        self.stages: set[int] = set()
        self.running: set[int] = set()  # the stages of the schedule stepping now (its waits name their peers')
        self.losses: list[tuple[Any, float]] = []  # the last stage's (loss, 1 / micro-batches), for AutoSteps
        #: rows for the kernel: [step, rank, stage, microbatch, action, start, end] (unix seconds)
        self.rows: deque[list[Any]] = deque(maxlen=ROWS_MAX)
        self.offset = time.time() - time.perf_counter()  # perf_counter -> unix time

    def close_step(self, rec: dict[str, Any]) -> None:
        """Stamp a record with this rank's pipeline fields and queue its actions as timeline rows (a record
        with no schedule step since the previous one is left alone)."""
        actions = self.actions
        if not actions or self.window_start is None:
            return
        now = time.perf_counter()
        span, self.window_start = now - self.window_start, now
        busy = merged_seconds([(a[3], a[4]) for a in actions])
        rec["pp_stage"] = min(self.stages)
        rec["bubble_frac"] = max(0.0, 1.0 - busy / span) if span > 0 else None
        step, rank, offset = rec.get("step"), self.session.ctx.rank, self.offset
        self.rows.extend([step, rank, a[0], a[1], a[2], a[3] + offset, a[4] + offset] for a in actions)
        self.actions, self.stages = [], set()

    def begin_cell(self) -> None:
        """A cell starts: its first step is timed from its first schedule step (not from the last cell)."""
        self.window_start = None
        self.actions, self.stages = [], set()

    def message(self, cell: int) -> dict[str, Any] | None:
        """The rows not sent yet, as a ``pipeline`` message (None: none)."""
        rows = self.rows
        if not rows:
            return None
        out = []
        try:
            while True:
                out.append(rows.popleft())
        except IndexError:
            pass
        return {"v": PROTOCOL_VERSION, "kind": "pipeline", "cell": cell, "rank": self.session.ctx.rank, "rows": out}


def what_it_waits_for(ops: Any, desc: str | None, own: set[int]) -> str | None:
    """What a stage's wait on a batch of sends and receives is, as the hang and release messages say it:
    "to receive activations from stage 1 (rank 1)" (the peer's stage: this rank's one stage -1 for
    activations, +1 for gradients; unsaid where the rank runs several stages).

    >>> class Op: pass
    >>> op = Op(); op.peer = 1; op.op = None
    >>> what_it_waits_for([op], "fwd_recv", {2}), what_it_waits_for([op], "bwd_send", {0, 2})
    ('to receive activations from stage 1 (rank 1)', 'to send gradients to rank 1')
    """
    try:
        peer = ops[0].peer
    except (AttributeError, IndexError, TypeError):
        return None
    stage = next(iter(own)) if len(own) == 1 else None
    text = desc or ""
    if "bwd_recv" in text:
        what, other = "to receive gradients from", None if stage is None else stage + 1
    elif "fwd_recv" in text:
        what, other = "to receive activations from", None if stage is None else stage - 1
    elif "fwd_send" in text:
        what, other = "to send activations to", None if stage is None else stage + 1
    elif "bwd_send" in text:
        what, other = "to send gradients to", None if stage is None else stage - 1
    else:
        import torch.distributed as dist

        what, other = ("to receive from" if getattr(ops[0], "op", None) is dist.irecv else "to send to"), None
    return f"{what} stage {other} (rank {peer})" if other is not None and other >= 0 else f"{what} rank {peer}"


def install(s: RankSession, timer: Any, kind: str) -> Callable[[], None]:
    """Install the hooks now if ``torch.distributed.pipelining`` is imported, else when it is; returns the
    remover."""
    undo: list[Callable[[], None]] = []
    waiting = after_import(PACKAGE, lambda module: undo.extend(_patch(s, timer, kind)))

    def remove() -> None:
        waiting()
        for u in reversed(undo):
            u()
        undo.clear()
        s.pipeline = None

    return remove


def _patch(s: RankSession, timer: Any, kind: str) -> list[Callable[[], None]]:
    import torch.distributed.pipelining.schedules as schedules
    import torch.distributed.pipelining.stage as stage_mod

    rec = s.pipeline = PipelineRecorder(s)
    cuda = kind == "cuda"
    clock = time.perf_counter
    undo: list[Callable[[], None]] = []

    def swap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        real = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, make(real))
        undo.append(lambda: setattr(owner, name, real))

    def make_step(real: Any) -> Any:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            if rec.depth:
                return real(self, *args, **kwargs)
            rec.depth += 1
            stages = getattr(self, "_stages", None) or [getattr(self, "_stage", None)]
            rec.running = {st.stage_index for st in stages if st is not None}
            if rec.window_start is None:
                rec.window_start = clock()
            try:
                return real(self, *args, **kwargs)
            finally:
                rec.depth -= 1
                if rec.losses:
                    auto = s.auto
                    if auto is not None:
                        auto.roots.extend(rec.losses)  # the step's loss (the last stage: their mean)
                    rec.losses = []

        step.__wrapped__ = real  # type: ignore[attr-defined]
        return step

    def make_action(real: Any, action: str) -> Any:
        def run(self: Any, chunk: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.depth:
                return real(self, chunk, *args, **kwargs)
            start = clock()
            try:
                return real(self, chunk, *args, **kwargs)
            finally:
                actions = rec.actions
                if len(actions) >= ACTIONS_MAX:
                    del actions[: ACTIONS_MAX // 2]
                actions.append((self.stage_index, chunk, action, start, clock()))
                rec.stages.add(self.stage_index)

        run.__wrapped__ = real  # type: ignore[attr-defined]
        return run

    def make_losses(real: Any) -> Any:
        def _update_losses(self: Any, stages: Any, losses: Any) -> Any:
            internal = getattr(self, "_internal_losses", None)
            if internal:
                n = len(internal)
                rec.losses = [(loss.detach(), 1.0 / n) for loss in internal]
            return real(self, stages, losses)

        return _update_losses

    pending: dict[int, tuple[Any, str, str | None]] = {}  # id(works) -> (start, dimension, what the wait is)

    def world() -> Any:
        import torch.distributed as dist

        return dist.group.WORLD

    def now() -> Any:
        if cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return clock()

    def make_batch(real: Any) -> Any:
        def _batch_p2p(p2p_ops: Any, *args: Any, **kwargs: Any) -> Any:
            start = now()
            works = real(p2p_ops, *args, **kwargs)
            if works:
                group = getattr(p2p_ops[0], "group", None)
                # a stage group of a mesh (mesh["pp"].get_group()) is its dimension; the world group (the
                # pipeline over every rank) or one no mesh named: pp
                dim = DIMS.of(group) if DIMS.order and group is not None and group is not world() else None
                if dim is None:
                    dim = "pp"
                    if "pp" not in DIMS.order:
                        DIMS.order.append("pp")
                if len(pending) >= PENDING_MAX:
                    pending.clear()
                pending[id(works)] = (start, dim, (p2p_ops, args[0] if args else kwargs.get("desc")))
            return works

        return _batch_p2p

    def make_wait(real: Any) -> Any:
        def _wait_batch_p2p(work: Any) -> Any:
            issued = pending.pop(id(work), None)
            if issued is None:
                return real(work)
            # (said only if the guard looks: the text is made then)
            WAITING_FOR[0] = partial(what_it_waits_for, issued[2][0], issued[2][1], rec.running)
            try:
                out = real(work)
            finally:
                WAITING_FOR[0] = None
            if cuda:
                timer.record_cuda(issued[0], now(), issued[1])
            else:
                timer.record(issued[0], clock(), issued[1])
            return out

        return _wait_batch_p2p

    swap(schedules.PipelineScheduleSingle, "step", make_step)
    swap(schedules.PipelineScheduleMulti, "step", make_step)
    swap(schedules._PipelineSchedule, "_update_losses", make_losses)
    base = stage_mod._PipelineStageBase
    swap(base, "forward_one_chunk", lambda real: make_action(real, "F"))
    swap(base, "backward_one_chunk", lambda real: make_action(real, "B"))
    swap(base, "backward_weight_one_chunk", lambda real: make_action(real, "W"))
    swap(schedules, "_batch_p2p", make_batch)
    swap(schedules, "_wait_batch_p2p", make_wait)
    return undo


__all__ = ["PipelineRecorder", "install"]
