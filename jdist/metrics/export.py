"""A run's records in TensorBoard or MLflow: after the fact (``run.to_tensorboard(logdir)``,
``run.to_mlflow()``) or live while the cell runs (``%%distributed --tensorboard DIR`` /
``--mlflow [URI]``, the kernel's sinks in :mod:`jdist.kernel.sinks`).

Every logged scalar and every automatic metric (:data:`jdist.metrics.AUTO_METRICS`) is
written per rank and as the mean across ranks, at its step, with the record's wall time:

* TensorBoard: one event-file folder per series under ``<logdir>/<run_id>/``: ``mean``,
  ``rank0``, ``rank1``... with the metric names as tags, so TensorBoard draws the ranks and
  their mean in one chart; the run's parameters go to the HParams and Text tabs (``mean``).
* MLflow: one MLflow run (named after the jdist run) in the experiment ``jdist`` (or the one
  given): the mean under the metric's own name, each rank under ``rank<k>/<metric>``; the
  run's parameters as MLflow params, its cell code as the run's description.

The mean of a step is written once every rank has logged it (at the end: with the ranks that did).
The ranks need no tracker: all of this runs where the records arrive (the notebook kernel). That
is also why the TensorBoard side uses tensorboard's own record writer and summary protos, not
``torch.utils.tensorboard.SummaryWriter``: the kernel never imports torch (``tests/test_architecture.py``
checks it). It writes each event file as a plain local file (:class:`EventFile`): tensorboard's
``EventFileWriter`` opens it through ``tensorboard.compat.tf``, which imports TensorFlow where it is installed
(3.5 s in the kernel, and TensorFlow's log lines in the cell).
Needs ``pip install 'jdist[tracking]'`` (tensorboard; mlflow-skinny with SQLAlchemy for the
``sqlite:`` stores).

Example:
    >>> import tempfile
    >>> from jdist.metrics import Run
    >>> run = Run("r1", world_size=2)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "time": 1.0, "loss": 1.0},
    ...              {"rank": 1, "seq": 0, "step": 0, "time": 1.0, "loss": 3.0}])
    >>> path = run.to_tensorboard(tempfile.mkdtemp())                    # doctest: +SKIP
    >>> sorted(p.name for p in path.iterdir())                          # doctest: +SKIP
    ['mean', 'rank0', 'rank1']
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from jdist.errors import need
from jdist.protocol import RECORD_KEYS, Record

from .stats import is_number, mean_min_max

if TYPE_CHECKING:
    from .records import Run


def params(run: Run) -> dict[str, str | int | float | bool]:
    """The run's parameters, as trackers store them (values given only).

    >>> from jdist.metrics import Run
    >>> params(Run("r1", 2, backend="ddp"))
    {'run_id': 'r1', 'world_size': 2, 'backend': 'ddp', 'device_kind': 'cpu'}
    """
    meta = run.meta()
    keys = ("run_id", "world_size", "backend", "device_kind", "total_steps", "cluster_id")
    return {k: meta[k] for k in keys if meta.get(k) not in (None, "")}  # type: ignore[literal-required]


class Means:
    """Cross-rank means of each (metric, step), released once every rank has given its value.

    >>> m = Means(world_size=2)
    >>> m.add({"rank": 0, "step": 3, "time": 1.0, "loss": 1.0})
    []
    >>> m.add({"rank": 1, "step": 3, "time": 2.0, "loss": 3.0})
    [('loss', 3, 2.0, 2.0)]
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.pending: dict[tuple[str, Any], tuple[dict[int, float], float]] = {}

    def add(self, rec: Record) -> list[tuple[str, Any, float, float]]:
        """``(metric, step, mean, wall time)`` of the steps this record completes."""
        done = []
        for name, value in scalar_items(rec):
            key = (name, rec.get("step"))
            values, wall = self.pending.setdefault(key, ({}, 0.0))
            values[rec["rank"]] = value
            wall = max(wall, float(rec.get("time") or 0.0))
            self.pending[key] = (values, wall)
            if len(values) >= self.world_size:
                del self.pending[key]
                done.append((name, key[1], mean_min_max(values.values())[0], wall))
        return done

    def rest(self) -> list[tuple[str, Any, float, float]]:
        """The means of the steps some rank never logged (the end of the run)."""
        out = [(name, step, mean_min_max(v.values())[0], wall) for (name, step), (v, wall) in self.pending.items()]
        self.pending.clear()
        return out


def scalar_items(rec: Record) -> Iterable[tuple[str, float]]:
    """The record's finite numeric metrics (logged and automatic), as floats."""
    for name, value in rec.items():
        if name not in RECORD_KEYS and is_number(value):
            yield name, float(value)


def _step(step: Any) -> int:
    return int(step) if isinstance(step, (int, float)) else 0


class EventFile:
    """One TensorBoard event file in ``folder``, written as a plain file with tensorboard's record writer (its
    framing and checksums), so that TensorFlow is never imported (see the module doc). Events are written as they
    come; :meth:`flush` makes them visible to a TensorBoard that reads the folder."""

    _serial = itertools.count()

    def __init__(self, folder: Path):
        from tensorboard.compat.proto.event_pb2 import Event, SourceMetadata
        from tensorboard.summary.writer.record_writer import RecordWriter

        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(self._serial)}"
        self._records = RecordWriter(open(folder / name, "wb"))  # noqa: SIM115 (closed by close())
        self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2",
                             source_metadata=SourceMetadata(writer="jdist")))

    def add_event(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


class TensorBoardWriter:
    """Writes a run to ``<logdir>/<run_id>/{mean,rank0,...}`` as TensorBoard event files."""

    def __init__(self, logdir: str | Path, run: Run):
        need("tensorboard", "TensorBoard export", "tracking")
        self.path = Path(logdir).expanduser() / run.run_id
        self.run = run
        self.means = Means(run.world_size)
        self.writers: dict[str, Any] = {}
        self._params_written = False

    def _writer(self, series: str) -> Any:
        w = self.writers.get(series)
        if w is None:
            (self.path / series).mkdir(parents=True, exist_ok=True)
            w = self.writers[series] = EventFile(self.path / series)
        return w

    def _scalar(self, series: str, tag: str, value: float, step: Any, wall: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        self._writer(series).add_event(Event(wall_time=wall or time.time(), step=_step(step), summary=summary))

    def _params(self) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb
        from tensorboard.plugins.text.summary_v2 import text_pb

        self._params_written = True
        w = self._writer("mean")
        w.add_event(Event(wall_time=self.run.started, step=0, summary=hparams_pb(params(self.run))))
        if self.run.code:
            w.add_event(Event(wall_time=self.run.started, step=0,
                              summary=text_pb("cell", "```python\n" + self.run.code + "\n```")))

    def add(self, records: Iterable[Record]) -> None:
        if not self._params_written:
            self._params()
        for rec in records:
            wall = float(rec.get("time") or 0.0)
            for name, value in scalar_items(rec):
                self._scalar(f"rank{rec['rank']}", name, value, rec.get("step"), wall)
            for name, step, mean, at in self.means.add(rec):
                self._scalar("mean", name, mean, step, at)

    def flush(self) -> None:
        for w in self.writers.values():
            w.flush()

    def close(self) -> None:
        if not self._params_written:
            self._params()
        for name, step, mean, at in self.means.rest():
            self._scalar("mean", name, mean, step, at)
        for w in self.writers.values():
            w.close()


class MLflowWriter:
    """Writes a run to one MLflow run (``tracking_uri``: MLflow's default when None)."""

    #: MLflow takes at most 1000 metrics per ``log_batch``.
    BATCH = 1000

    def __init__(self, run: Run, tracking_uri: str | None = None, experiment: str = "jdist",
                 run_name: str | None = None):
        need("mlflow", "MLflow export", "tracking")
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.run = run
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        tags = {"jdist.run_id": run.run_id}
        if run.code:
            tags["mlflow.note.content"] = f"```python\n{run.code}\n```"
        created = self.client.create_run(experiment_id, run_name=run_name or run.run_id, tags=tags,
                                         start_time=int(run.started * 1000))
        self.run_id: str = created.info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in params(run).items()],
                              tags=[RunTag("jdist.backend", run.backend or "")])
        self.means = Means(run.world_size)
        self.pending: list[Any] = []

    def _metric(self, key: str, value: float, step: Any, wall: float) -> None:
        from mlflow.entities import Metric

        self.pending.append(Metric(key, value, int((wall or time.time()) * 1000), _step(step)))

    def add(self, records: Iterable[Record]) -> None:
        for rec in records:
            wall = float(rec.get("time") or 0.0)
            for name, value in scalar_items(rec):
                self._metric(f"rank{rec['rank']}/{name}", value, rec.get("step"), wall)
            for name, step, mean, at in self.means.add(rec):
                self._metric(name, mean, step, at)

    def flush(self) -> None:
        while self.pending:
            batch, self.pending = self.pending[:self.BATCH], self.pending[self.BATCH:]
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        for name, step, mean, at in self.means.rest():
            self._metric(name, mean, step, at)
        self.flush()
        status = {"finished": "FINISHED", "interrupted": "KILLED", "running": "RUNNING"}.get(self.run.status, "FAILED")
        self.client.set_terminated(self.run_id, status=status,
                                   end_time=int(self.run.ended * 1000) if self.run.ended else None)


def to_tensorboard(run: Run, logdir: str | Path) -> Path:
    """Write ``run`` as TensorBoard event files under ``<logdir>/<run_id>/``; returns that folder.

    >>> jdist.last_run().to_tensorboard("tb")   # doctest: +SKIP
    PosixPath('tb/20261123-101500-3f9a1c')
    """
    writer = TensorBoardWriter(logdir, run)
    writer.add(run.records)
    writer.close()
    return writer.path


def to_mlflow(run: Run, tracking_uri: str | None = None, experiment: str = "jdist", run_name: str | None = None) -> str:
    """Write ``run`` as an MLflow run; returns the MLflow run id. ``tracking_uri``: e.g.
    ``"sqlite:///mlflow.db"`` or an MLflow server's URL (default: MLflow's own default).

    >>> jdist.last_run().to_mlflow("sqlite:///mlflow.db")   # doctest: +SKIP
    '4f1c...'
    """
    writer = MLflowWriter(run, tracking_uri, experiment, run_name)
    writer.add(run.records)
    writer.close()
    return writer.run_id
