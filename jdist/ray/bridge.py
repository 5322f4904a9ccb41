"""What crosses between the kernel's ``jdist.ray.fit`` and a Ray Train run's processes.

``jdist.ray.fit`` (:mod:`jdist.kernel.raytrain`) adds two callbacks to the trainer's
``RunConfig`` and creates one Ray queue (an actor) for the run. Both callbacks are pickled into
Ray's processes, so they live here, importing neither the kernel nor the rank runtime:

- :class:`WorkerHooks` runs on Ray Train's controller (it puts the controller's handle on the
  queue, so an interrupt in the notebook can abort the run) and on every training worker (it says
  at which of its steps the worker reports);
- :class:`Reports` runs on the controller after every ``ray.train.report``: each worker's
  reported numbers go to the queue too.

``fit`` also wraps the trainer's ``train_loop_per_worker`` (:func:`in_session`): the worker's jdist rank
session (:mod:`jdist.rank.integrations.ray`), whose records go to the queue, is open while the training
function runs, so ``jdist.log`` in ``train_func`` reaches the dashboard and step 0's step time starts
where a ``%%distributed`` cell's does, with the user's code.

Queue items are tuples: ``("data", rank, payload)`` with ``payload`` a
:func:`jdist.codec.encode_data` message; ``("at", rank, step)``: a worker reports now, after its
``jdist.log`` step ``step`` (None: none yet); ``("report", index, time, [metrics of rank 0, 1...])``;
``("controller", handle)``.

Example: the third report; worker 1 reported a step, worker 0 had logged step 29 with ``jdist.log``:
    >>> first, second = report_records(2, 10.0, [{"loss": 0.5, "note": "x"}, {"loss": 0.7, "step": 40}], [29, None])
    >>> first
    {'rank': 0, 'cell': 1000000, 'seq': 3, 'step': 29, 'time': 10.0, 'loss': 0.5}
    >>> second["rank"], second["step"], second["loss"]
    (1, 40, 0.7)
    >>> report_records(2, 10.0, [{"epoch": 1, "loss": 0.5}], [29])[0]["epoch"]    # at the step: a field
    1
    >>> report_records(2, 10.0, [{"epoch": 1, "loss": 0.5}])[0]    # no jdist.log steps: the epoch is the step
    {'rank': 0, 'cell': 1000000, 'seq': 3, 'step': 1, 'time': 10.0, 'loss': 0.5}
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from jdist.errors import need

#: The record ``cell`` of values from ``ray.train.report``: one no worker session reaches (its own
#: cells count from 1), so reports and ``jdist.log`` records never take each other's place.
REPORT_CELL = 1_000_000
#: The worker side of the session (imported on the workers only).
WORKER_SIDE = "jdist.rank.integrations.ray"

_callbacks = need("ray.train.v2._internal.execution.callback", "jdist.ray", "ray")
_api = need("ray.train.v2.api.callback", "jdist.ray", "ray")


#: Ray Train's logger that warns each time it cannot reach Ray's State API (Ray's dashboard serves it).
CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def without_state_api() -> None:
    """Set-up hook of the processes of a local Ray that ``jdist.ray.fit`` starts without Ray's dashboard
    (``ray[train]`` has none): Ray Train's placement-group cleaner cannot query the State API there and
    would warn every few seconds in the notebook; its warnings are dropped (errors still show)."""
    import logging

    logging.getLogger(CLEANER_LOGGER).setLevel(logging.ERROR)


def report_records(index: int, when: float, metrics: list[dict[str, Any]],
                   at: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """One record per worker from the ``index``-th ``ray.train.report``: its numbers, at the ``step``
    it reported; else at the worker's newest ``jdist.log`` step then (``at[rank]``: the report sums up
    those steps); else at its ``epoch``; else at ``index``. A reported ``epoch`` is a field of the
    record unless it is the step.

    The records' ``seq`` counts from 1: a run takes each rank's ``seq`` 0 record, whatever its cell, for
    the first step, whose step time (its set-up) the dashboard leaves out; that is the worker's first
    ``jdist.log``, and a first report with ``seq`` 0 took its place (step 0's set-up then was charted)."""
    out = []
    for rank, values in enumerate(metrics):
        logged = at[rank] if rank < len(at) else None
        step = values["step"] if type(values.get("step")) is int else logged
        epoch_is_step = step is None and type(values.get("epoch")) is int
        if step is None:
            step = values["epoch"] if epoch_is_step else index
        rec: dict[str, Any] = {"rank": rank, "cell": REPORT_CELL, "seq": index + 1, "step": step, "time": when}
        rec.update((k, v) for k, v in values.items()
                   if k not in rec and not (epoch_is_step and k == "epoch")
                   and type(v) in (int, float) and not isinstance(v, bool))
        out.append(rec)
    return out


def in_session(train_loop: Callable[..., Any], queue: Any) -> Callable[..., Any]:
    """``train_loop`` (a trainer's ``train_loop_per_worker``) in the worker's jdist session, opened on its
    first line and closed on its return or error (the rest of the records and their count go out, as at
    a cell's end), with the same parameters (Ray Train counts them to pass ``config`` or not).

    The session's step clock starts when it opens: here, step 0's step time is the training
    function's own set-up, as a ``%%distributed`` cell's first step is the cell's. Opened when Ray's
    train context exists (``after_init_train_context``), it also timed Ray's set-up of the worker group
    that follows (its process group, the function's transfer): 0.4-0.6 s of step 0 on the 2-core
    machine. A failing worker's traceback then has this function's frame, which ``fit`` leaves out."""

    @functools.wraps(train_loop)
    def jdist_train_loop(*config: Any) -> Any:
        worker = importlib.import_module(WORKER_SIDE)
        worker.open_session(queue)
        try:
            result = train_loop(*config)
        except BaseException as exc:
            worker.close_session(exc)
            raise
        worker.close_session()
        return result

    return jdist_train_loop


class WorkerHooks(_callbacks.WorkerCallback, _callbacks.ControllerCallback, _callbacks.TrainContextCallback):
    """The controller's handle to the queue; on each worker, the step at which it reports, and the end
    of its jdist session where :func:`in_session` did not end it (the worker stopped in the function)."""

    def __init__(self, queue: Any):
        self.queue = queue

    def after_controller_start(self, train_run_context: Any) -> None:
        import ray

        self.queue.put(("controller", ray.get_runtime_context().current_actor))

    def before_worker_shutdown(self) -> None:
        importlib.import_module(WORKER_SIDE).close_session()

    @contextlib.contextmanager
    def on_report(self) -> Iterator[None]:
        importlib.import_module(WORKER_SIDE).note_report()
        yield


class Reports(_api.UserCallback):
    """Every ``ray.train.report``'s numbers, one dict per worker, to the queue."""

    def __init__(self, queue: Any):
        self.queue = queue
        self.count = 0

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        self.queue.put(("report", self.count, time.time(), [dict(m) for m in metrics]))
        self.count += 1


__all__ = ["REPORT_CELL", "Reports", "WorkerHooks", "in_session", "report_records"]
