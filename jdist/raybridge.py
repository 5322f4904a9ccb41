"""What crosses between the kernel's ``jdist.ray.fit`` and a Ray Train run's processes.

``jdist.ray.fit`` (:mod:`jdist.kernel.raytrain`) adds two callbacks to the trainer's
``RunConfig`` and creates one Ray queue (an actor) for the run. Both callbacks are pickled into
Ray's processes, so they live here, importing neither the kernel nor the rank runtime:

- :class:`WorkerHooks` runs on Ray Train's controller (it puts the controller's handle on the
  queue, so an interrupt in the notebook can abort the run) and on every training worker (it opens
  a jdist rank session whose records go to the queue, so ``jdist.log`` in ``train_func`` reaches
  the dashboard, and says at which of its steps the worker reports;
  :mod:`jdist.rank.integrations.ray`);
- :class:`Reports` runs on the controller after every ``ray.train.report``: each worker's
  reported numbers go to the queue too.

Queue items are tuples: ``("data", rank, payload)`` with ``payload`` a
:func:`jdist.codec.encode_data` message; ``("at", rank, step)``: a worker reports now, after its
``jdist.log`` step ``step`` (None: none yet); ``("report", index, time, [metrics of rank 0, 1...])``;
``("controller", handle)``.

Example: the third report; worker 1 reported a step, worker 0 had logged step 29 with ``jdist.log``:
    >>> first, second = report_records(2, 10.0, [{"loss": 0.5, "note": "x"}, {"loss": 0.7, "step": 40}], [29, None])
    >>> first
    {'rank': 0, 'cell': 1000000, 'seq': 2, 'step': 29, 'time': 10.0, 'loss': 0.5}
    >>> second["rank"], second["step"], second["loss"]
    (1, 40, 0.7)
    >>> report_records(2, 10.0, [{"epoch": 1, "loss": 0.5}])[0]["step"]    # no jdist.log steps: the epoch
    1
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterator, Sequence
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
    those steps); else at its ``epoch``; else at ``index``."""
    out = []
    for rank, values in enumerate(metrics):
        logged = at[rank] if rank < len(at) else None
        step = values["step"] if type(values.get("step")) is int else (
            logged if logged is not None else values["epoch"] if type(values.get("epoch")) is int else index)
        rec: dict[str, Any] = {"rank": rank, "cell": REPORT_CELL, "seq": index, "step": step, "time": when}
        rec.update((k, v) for k, v in values.items()
                   if k not in rec and k != "epoch" and type(v) in (int, float) and not isinstance(v, bool))
        out.append(rec)
    return out


class WorkerHooks(_callbacks.WorkerCallback, _callbacks.ControllerCallback, _callbacks.TrainContextCallback):
    """The controller's handle to the queue; a jdist session on each worker, and the step at which
    it reports."""

    def __init__(self, queue: Any):
        self.queue = queue

    def after_controller_start(self, train_run_context: Any) -> None:
        import ray

        self.queue.put(("controller", ray.get_runtime_context().current_actor))

    def after_init_train_context(self) -> None:
        importlib.import_module(WORKER_SIDE).open_session(self.queue)

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


__all__ = ["REPORT_CELL", "Reports", "WorkerHooks", "report_records"]
