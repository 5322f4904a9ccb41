"""What crosses between the kernel's ``jdist.ray.fit`` and a Ray Train run's processes.

``jdist.ray.fit`` (:mod:`jdist.kernel.raytrain`) adds two callbacks to the trainer's
``RunConfig`` and creates one Ray queue (an actor) for the run. Both callbacks are pickled into
Ray's processes, so they live here, importing neither the kernel nor the rank runtime:

- :class:`WorkerHooks` runs on Ray Train's controller (it puts the controller's handle on the
  queue, so an interrupt in the notebook can abort the run) and on every training worker (it opens
  a jdist rank session whose records go to the queue, so ``jdist.log`` in ``train_func`` reaches
  the dashboard; :mod:`jdist.rank.integrations.ray`);
- :class:`Reports` runs on the controller after every ``ray.train.report``: each worker's
  reported numbers go to the queue too.

Queue items are tuples: ``("data", rank, payload)`` with ``payload`` a
:func:`jdist.codec.encode_data` message; ``("report", index, time, [metrics of rank 0, 1...])``;
``("controller", handle)``.

Example:
    >>> first, second = report_records(2, 10.0, [{"loss": 0.5, "note": "x"}, {"loss": 0.7, "step": 40}])
    >>> first
    {'rank': 0, 'cell': 1000000, 'seq': 2, 'step': 2, 'time': 10.0, 'loss': 0.5}
    >>> second["rank"], second["step"], second["loss"]
    (1, 40, 0.7)
"""

from __future__ import annotations

import importlib
import time
from typing import Any

from jdist.errors import need

#: The record ``cell`` of values from ``ray.train.report``: one no worker session reaches (its own
#: cells count from 1), so reports and ``jdist.log`` records never take each other's place.
REPORT_CELL = 1_000_000
#: The worker side of the session (imported on the workers only).
WORKER_SIDE = "jdist.rank.integrations.ray"

_callbacks = need("ray.train.v2._internal.execution.callback", "jdist.ray", "ray")
_api = need("ray.train.v2.api.callback", "jdist.ray", "ray")


def report_records(index: int, when: float, metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per worker from the ``index``-th ``ray.train.report``: its numbers, at its own
    ``step`` (or ``epoch``) where it reported one, else at ``index``."""
    out = []
    for rank, values in enumerate(metrics):
        step = next((values[k] for k in ("step", "epoch") if type(values.get(k)) is int), index)
        rec: dict[str, Any] = {"rank": rank, "cell": REPORT_CELL, "seq": index, "step": step, "time": when}
        rec.update((k, v) for k, v in values.items()
                   if k not in rec and k != "epoch" and type(v) in (int, float) and not isinstance(v, bool))
        out.append(rec)
    return out


class WorkerHooks(_callbacks.WorkerCallback, _callbacks.ControllerCallback):
    """The controller's handle to the queue; a jdist session on each worker."""

    def __init__(self, queue: Any):
        self.queue = queue

    def after_controller_start(self, train_run_context: Any) -> None:
        import ray

        self.queue.put(("controller", ray.get_runtime_context().current_actor))

    def after_init_train_context(self) -> None:
        importlib.import_module(WORKER_SIDE).open_session(self.queue)

    def before_worker_shutdown(self) -> None:
        importlib.import_module(WORKER_SIDE).close_session()


class Reports(_api.UserCallback):
    """Every ``ray.train.report``'s numbers, one dict per worker, to the queue."""

    def __init__(self, queue: Any):
        self.queue = queue
        self.count = 0

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        self.queue.put(("report", self.count, time.time(), [dict(m) for m in metrics]))
        self.count += 1


__all__ = ["REPORT_CELL", "Reports", "WorkerHooks", "report_records"]
