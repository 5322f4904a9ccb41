"""Where a run's records go in the kernel: one :class:`RecordSink` interface, five kinds of sink.

The supervisor hands each new batch of records to every sink of the cell's run: :class:`KernelRuns`
(the kernel's runs: ``jdist.last_run()``, ``jdist.runs()``, within the memory budget of :func:`run_memory`), :class:`RunLogSink`
(the run folder on disk, which the Jupyter server's sidebar reads), :class:`StragglerSink` (names a rank
slower than the others in the cell's output) and :class:`DashboardSink`
(the live dashboard under the cell), and the sinks of installed sink plugins that the cell's
options turn on (:class:`jdist.plugins.SinkSpec`, entry point group ``jdist.sinks``). jdist's own
are :class:`TrackerSink` s: TensorBoard with ``--tensorboard DIR`` (:data:`TENSORBOARD`), MLflow
with ``--mlflow [URI]`` (:data:`MLFLOW`), written by :mod:`jdist.metrics.export`. Another
destination is one more :class:`~jdist.plugins.SinkSpec` with its cell option.

Example:
    >>> from jdist.metrics import Run
    >>> sink = KernelRuns()
    >>> sink.start(Run("r1", 1)); sink.finish(sink.run)
    >>> last_run().run_id
    'r1'
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Protocol

from jdist.metrics import Run, RunLog, budget
from jdist.metrics.stragglers import StragglerWatch, window_from_env
from jdist.options import CellOptions, Option, Scope
from jdist.plugins import SinkSpec, sink_specs
from jdist.protocol import HostMessage, PipelineMessage, Record

#: How many runs ``jdist.runs()`` lists. Their values are held within the run memory budget
#: (:func:`run_memory`): older runs leave memory and are read back from their run folders when asked for.
MAX_RUNS_LISTED = 1000

_runs: deque[Run] = deque(maxlen=MAX_RUNS_LISTED)


def last_run() -> Run | None:
    """The most recent run of this kernel (a :class:`jdist.metrics.Run`), or None.

    >>> jdist.last_run().history.head()   # doctest: +SKIP
    """
    return _runs[-1] if _runs else None


def runs() -> list[Run]:
    """This kernel's runs, oldest first (the last :data:`MAX_RUNS_LISTED`; every run is in the run
    log on disk: ``jdist.read_run(path)``, ``jdist.metrics.list_runs()``). A run whose values left
    memory under the budget (:func:`run_memory`) reads them back when asked for."""
    return list(_runs)


def run_memory(max_mb: float | None = None, keep: int | None = None) -> dict[str, Any]:
    """The memory the kernel's runs may hold: at most ``max_mb`` MiB of values and ``keep`` runs
    (``None``: unchanged; defaults 512 MiB, or ``$JDIST_RUN_MEMORY_MB``, and 10 runs). The least
    recently used runs that ended go over to disk first. Returns the limits and what is held.

    >>> jdist.run_memory(max_mb=256)   # doctest: +SKIP
    {'max_mb': 256.0, 'keep': 10, 'held_mb': 41.3, 'runs_in_memory': 3, 'runs_released': 12}
    """
    return budget.configure(max_mb, keep)


class RecordSink(Protocol):
    def start(self, run: Run) -> None:
        """The run began (its first record or progress message arrived)."""

    def add(self, records: list[Record]) -> None:
        """New records of the run (already added to it, duplicates dropped): a
        :class:`~jdist.metrics.store.RecordBatch`, a sequence of record dicts."""

    def tick(self) -> None:
        """Called on every poll while the cell runs (about 20 times a second)."""

    def finish(self, run: Run) -> None:
        """The cell ended: ``run.status``, ``run.error`` and ``run.ended`` are set."""


class KernelRuns:
    """Keeps the run among the kernel's runs, within the run memory budget (:mod:`jdist.metrics.budget`)."""

    def __init__(self) -> None:
        self.run: Run | None = None

    def start(self, run: Run) -> None:
        self.run = run
        _runs.append(run)
        budget.track(run)

    def add(self, records: list[Record]) -> None:
        pass

    def tick(self) -> None:
        pass

    def finish(self, run: Run) -> None:
        run.finished_adding()
        budget.BUDGET.enforce()


class RunLogSink:
    """Writes the run folder (``meta.json`` + ``metrics.jdc``) under ``root`` (default: the run dir)."""

    def __init__(self, root: str | None = None) -> None:
        self.root = root
        self.log: RunLog | None = None
        self._stragglers = 0  # (meta.json has those named so far: the sidebar reads them from it)

    def start(self, run: Run) -> None:
        self.log = RunLog(run, self.root)

    def add(self, records: list[Record]) -> None:
        assert self.log is not None
        self.log.append(records)

    def host(self, sample: HostMessage) -> None:
        """A host's load (:class:`jdist.protocol.HostMessage`): one line of ``hosts.jsonl``."""
        assert self.log is not None
        self.log.append_host(sample)

    def pipeline(self, message: PipelineMessage) -> None:
        """A rank's pipeline actions (:class:`jdist.protocol.PipelineMessage`): one line of ``pipeline.jsonl``."""
        assert self.log is not None
        self.log.append_pipeline(message)

    def tick(self) -> None:
        if self.log is not None and len(self.log.run.stragglers) != self._stragglers:
            self._stragglers = len(self.log.run.stragglers)
            self.log.write_meta()

    def finish(self, run: Run) -> None:
        if self.log is not None:
            self.log.close()


class DashboardSink:
    """The live dashboard under the cell (:class:`jdist.kernel.dashboard.Dashboard`), replaced by
    its static summary at the end."""

    def __init__(self) -> None:
        self.board: Any = None

    def start(self, run: Run) -> None:
        from .dashboard import Dashboard

        self.board = Dashboard(run)
        self.board.show()

    def add(self, records: list[Record]) -> None:
        self.board.feed(records)  # drawn on tick, throttled

    def tick(self) -> None:
        self.board.update()

    def paused(self, ranks: list[int]) -> None:
        """Ranks stopped in a debugger now: the header says so (:meth:`RecordCollector.paused`)."""
        self.board.paused = sorted(ranks)
        self.board.update(force=True)

    def finish(self, run: Run) -> None:
        self.board.finish()


class TrackerSink:
    """Writes the run to an experiment tracker while the cell runs (``--tensorboard``, ``--mlflow``).

    ``make(run)`` builds the writer (:class:`jdist.metrics.export.TensorBoardWriter` or
    ``MLflowWriter``). Its writes happen off the kernel's main thread, at most every
    ``flush_s`` seconds; a tracker that fails stops with one line on stderr and the cell goes
    on (its run log and dashboard have every record).
    """

    def __init__(self, label: str, make: Callable[[Run], Any], flush_s: float = 2.0) -> None:
        self.label, self.make, self.flush_s = label, make, flush_s
        self.writer: Any = None
        self.failed = False
        self._pending: list[Record] = []
        self._lock = threading.Lock()  # one write at a time: the writer is not thread-safe
        self._thread: threading.Thread | None = None
        self._last = 0.0

    def _guarded(self, what: str, fn: Callable[[], None]) -> None:
        if self.failed:
            return
        try:
            with self._lock:
                fn()
        except Exception as exc:  # a tracker must never stop training
            self.failed = True
            print(f"jdist: {self.label} logging stopped ({what}): {type(exc).__name__}: {exc}", file=sys.stderr)

    def start(self, run: Run) -> None:
        def make() -> None:
            self.writer = self.make(run)

        self._guarded("start", make)

    def add(self, records: list[Record]) -> None:
        self._pending.extend(records)

    def _write(self) -> None:
        batch, self._pending = self._pending, []
        self.writer.add(batch)
        self.writer.flush()

    def tick(self) -> None:
        now = time.monotonic()
        if self.failed or not self._pending or now - self._last < self.flush_s:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._last = now
        self._thread = threading.Thread(target=self._guarded, args=("write", self._write), daemon=True,
                                        name=f"jdist-{self.label}")
        self._thread.start()

    def finish(self, run: Run) -> None:
        if self._thread is not None:
            self._thread.join()

        def close() -> None:
            batch, self._pending = self._pending, []
            self.writer.add(batch)
            self.writer.close()

        self._guarded("finish", close)


TRACKING_HINT = "{flag} needs {module}: pip install 'jdist[tracking]' (then restart the kernel)."

#: ``--tensorboard DIR``: the run, each rank and their mean, as TensorBoard event files while it runs.
TENSORBOARD = SinkSpec(
    "tensorboard", "jdist.kernel.sinks:tensorboard_sink",
    options=(Option("tensorboard", ("--tensorboard",), "Also write this cell's run to TensorBoard while it runs, "
                    "under DIR/<run id> (each rank and their mean; needs jdist[tracking]).", Scope.CELL, type=str,
                    metavar="DIR"),),
    requires=("tensorboard",), install_hint=TRACKING_HINT.format(flag="--tensorboard", module="tensorboard"),
    help="TensorBoard event files")
#: ``--mlflow [URI]``: the run, each rank and their mean, as an MLflow run while it runs.
MLFLOW = SinkSpec(
    "mlflow", "jdist.kernel.sinks:mlflow_sink",
    options=(Option("mlflow", ("--mlflow",), "Also log this cell's run to MLflow while it runs: URI is a tracking "
                    "store or server (default: MLflow's own, $MLFLOW_TRACKING_URI or sqlite:///mlflow.db; needs "
                    "jdist[tracking]).", Scope.CELL, type=str, metavar="URI", const=True),),
    requires=("mlflow",), install_hint=TRACKING_HINT.format(flag="--mlflow", module="mlflow"),
    help="an MLflow run")


def tensorboard_sink(run: Run, opts: CellOptions) -> RecordSink:
    from jdist.metrics import export

    return TrackerSink("TensorBoard", lambda run: export.TensorBoardWriter(opts.tensorboard, run))


def mlflow_sink(run: Run, opts: CellOptions) -> RecordSink:
    from jdist.metrics import export

    uri = None if opts.mlflow is True else str(opts.mlflow)
    return TrackerSink("MLflow", lambda run: export.MLflowWriter(run, uri))


def unavailable(opts: CellOptions) -> str | None:
    """Why a sink this cell asks for cannot run here (the fix), checked before anything runs; or None."""
    for spec in sink_specs().values():
        if spec.wanted(opts):
            problem = spec.unavailable()
            if problem:
                return problem
    return None


class StragglerSink:
    """Names a straggler in the cell's output once it is one (:class:`jdist.metrics.stragglers.StragglerWatch`,
    windows of ``$JDIST_STRAGGLER_WINDOW_S``, 10 s by default); the run keeps them (``run.stragglers``), which the
    slowest-ranks table and the summary show."""

    def __init__(self) -> None:
        self.watch: StragglerWatch | None = None
        self.run: Run | None = None

    def start(self, run: Run) -> None:
        self.run = run
        self.watch = StragglerWatch(run.world_size, window_from_env(os.environ), hosts=run.hosts,
                                    flagged=run.stragglers)

    def add(self, records: list[Record]) -> None:
        if self.watch is not None:
            self.watch.add(records)

    def tick(self) -> None:
        if self.watch is not None:
            for straggler in self.watch.poll(time.monotonic()):
                print(f"jdist: {straggler.line()}", flush=True)

    def finish(self, run: Run) -> None:
        pass


def default_sinks(run: Run, opts: CellOptions) -> list[RecordSink]:
    """The sinks of a ``%%distributed`` cell's run: the kernel's runs, the run log, the straggler watch, the
    dashboard (unless ``--no-dashboard``), then each sink plugin's that the cell's options turn on."""
    sinks: list[RecordSink] = [KernelRuns(), RunLogSink(opts.run_dir), StragglerSink()]
    if not opts.no_dashboard:
        sinks.append(DashboardSink())
    return sinks + plugin_sinks(run, opts)


def plugin_sinks(run: Run, opts: CellOptions) -> list[RecordSink]:
    """The sinks of installed sink plugins that the options turn on (``--tensorboard``, ``--mlflow``...)."""
    sinks: list[RecordSink] = []
    for spec in sink_specs().values():
        if spec.wanted(opts):
            sink = spec.load()(run, opts)
            if sink is not None:
                sinks.append(sink)
    return sinks
