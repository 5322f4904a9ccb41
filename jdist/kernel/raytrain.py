"""``jdist.ray.fit``: a Ray Train run shown live on jdist's dashboard, driven from the notebook kernel.

No ``%%distributed`` cluster is involved: Ray starts its own workers (locally with ``ray.init``, or
on the Ray cluster at ``address``, e.g. KubeRay). ``fit`` adds two callbacks to the trainer
(:mod:`jdist.ray.bridge`) and one Ray queue per run, runs ``trainer.fit()`` on a thread of the kernel
and, on the kernel's main thread (widgets are drawn there), moves what the queue brings into the
run: every worker's ``jdist.log`` records and automatic metrics, and the numbers each worker passed
to ``ray.train.report``. The run goes to the kernel's runs (``jdist.last_run()``), the run log and
the JupyterLab sidebar, as a ``%%distributed`` cell's does.

- A worker that raises: :class:`jdist.errors.RankError` (each failed worker, the first one's whole
  traceback as the worker sent it through the queue), the run marked failed.
- Ray Train's controller that has not returned :data:`CONTROLLER_WAIT_S` after a worker failed or every
  worker ended: one line, the run aborted (the controller killed if it does not answer, its placement
  groups removed), and the workers' ``RankError`` raised.
- Interrupt (the kernel's stop button, Ctrl-C): the run is aborted through Ray Train's controller,
  marked interrupted, and ``KeyboardInterrupt`` raised once the workers are gone.
- ``ray.train.report`` blocks each worker until the controller polls it: Ray's default poll
  (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s) held each report 0.9-1.5 s here, so ``fit`` sets
  0.2 s unless the variable is already set.
- On the local Ray that ``fit`` starts itself, Ray Train's preemption watcher (an actor per run that
  polls for cloud nodes being drained) is off unless ``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER`` is set:
  one process less per run (about 5 CPU-seconds of its start on 2 cores).

Example (in the notebook)::

    import jdist.ray
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    result = jdist.ray.fit(TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2)))
    result.checkpoint, jdist.last_run().history
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import threading
import time
from typing import Any

from jdist.codec import decode_data
from jdist.errors import RankError, RankFailure, first_failure, need
from jdist.metrics import Run, new_run_id
from jdist.options import Frontend
from jdist.plugins import option_table

from .sinks import default_sinks
from .supervise.collect import RecordCollector
from .supervise.sigint import SigintCount

#: ``jdist.ray.fit`` as a front end (:class:`jdist.options.Frontend`): Ray starts and places its own workers,
#: so no cluster option applies; of the cell options, those of the run's sinks.
RAY = Frontend(
    "jdist.ray.fit",
    honours=frozenset({"no_dashboard", "run_dir"}),
    plugins=frozenset({"sink"}),
    refuses={
        **{name: "Ray starts and places its workers (ScalingConfig, RunConfig)" for name in (
            "n", "gpus", "backend", "launcher", "encrypt", "timeout", "port", "threads", "precision", "watchdog",
            "interrupt_grace", "auto_restart", "start_timeout", "cluster", "restart")},
        "targets": "every Ray worker runs train_loop_per_worker",
        "output": "Ray prints its workers' output itself (ray.init(log_to_driver=...))",
        "debug_ranks": "breakpoint() in Ray workers is Ray's own debugger (ray debug)",
        "auto_metrics": "Ray Train's workers report through ray.train.report (jdist.ray.fit records it) and "
                        "jdist.log; no optimizer hooks are installed in Ray's processes",
        "mesh": "each Ray worker builds its own device mesh (init_device_mesh in train_loop_per_worker)",
        "elastic": "Ray Train restarts its own workers after a failure (RunConfig(failure_config=FailureConfig(...)))",
    },
)

#: Seconds between two reads of the run's queue while the workers train.
POLL_S = 0.1
#: Ray Train's poll of its workers (``ray.train.report`` waits for it), unless the user set one.
HEALTH_CHECK_S = "0.2"
#: Seconds to wait, once ``trainer.fit()`` returned, for records still on their way from the workers.
DRAIN_S = 5.0
#: Seconds Ray Train's controller gets to return ``fit`` once a worker failed or every worker ended (it
#: polls them every 0.2 s; once, on a loaded 2-core machine, it never returned after a worker's error).
#: Past them ``fit`` says so in one line, aborts the run and reports the errors the workers sent.
CONTROLLER_WAIT_S = 60.0
#: Seconds the controller gets to abort the run before ``fit`` kills it (its workers go with it).
ABORT_S = 30.0
HEALTH_CHECK_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
PREEMPTION_WATCHER_VAR = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
#: What Ray raises when a local node's raylet did not register within its fixed 30 s (``ray/_private/node.py``).
#: It happened on a busy 2-core machine (CI, the suite's first Ray start beside another worker's ranks), and the
#: next start in the same process succeeded.
STARTUP_TIMED_OUT = "timed out during startup"


def fit(trainer: Any, *, address: str | None = None, **cell_options: Any) -> Any:
    """Run ``trainer.fit()`` (a Ray Train ``DataParallelTrainer``, e.g. ``TorchTrainer``) with the live
    dashboard; return its ``ray.train.Result`` (``.checkpoint``, ``.metrics``).

    ``address``: a running Ray cluster (``ray://host:10001``, ``auto``); default: the Ray this kernel
    already initialized, else a local one (``ray.init`` without Ray's own dashboard). ``cell_options``:
    those of ``%%distributed`` by name: ``no_dashboard=True``, ``run_dir=``, ``tensorboard=``, ``mlflow=``.
    """
    started = time.time()  # the run's start: Ray's own start and its workers' are part of the fit
    table = option_table()
    taken = [o.name for o in table.honoured(RAY)]
    unknown = sorted(set(cell_options) - {o.name for o in (*table.cluster, *table.cell)})
    if unknown:
        raise TypeError(f"jdist.ray.fit: no option {unknown[0]!r}; it takes: {', '.join(taken)}.")
    try:
        table.refuse_given(RAY, cell_options)
    except ValueError as exc:
        raise TypeError(f"{exc} It takes: {', '.join(taken)}.") from None
    opts = table.cell_options(cell_options)
    ray = need("ray", "jdist.ray", "ray")
    from ray.util.queue import Queue

    from jdist.ray.bridge import Reports, WorkerHooks, in_session

    os.environ.setdefault(HEALTH_CHECK_VAR, HEALTH_CHECK_S)  # read by the controller when fit starts
    if not ray.is_initialized():
        local = {} if address else {"runtime_env": {"worker_process_setup_hook": "jdist.ray.bridge.without_state_api"}}
        if not address and not os.environ.get("RAY_ADDRESS"):  # a local Ray on this machine: no cloud preemption
            os.environ.setdefault(PREEMPTION_WATCHER_VAR, "0")
        start_ray(ray, address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=True, **local)
    scaling = trainer.scaling_config
    world = int(scaling.num_workers or 1)
    run_id = new_run_id()
    queue = Queue(actor_options={"num_cpus": 0})
    config = trainer.run_config
    before = config.callbacks
    code = _code_of(trainer)
    train_loop = trainer.train_loop_per_worker
    config.callbacks = [*(before or []), WorkerHooks(queue), Reports(queue)]
    trainer.train_loop_per_worker = in_session(train_loop, queue)

    def make_run() -> Run:  # called with the first record
        return Run(run_id=run_id, world_size=world, backend="ray", device_kind="cuda" if scaling.use_gpu else "cpu",
                   code=code, started=started)

    collector = RecordCollector(None, code, lambda run: default_sinks(run, opts), make_run=make_run)
    driver = _Driver(trainer, queue, collector, world)
    try:
        return driver.run()
    finally:
        config.callbacks = before
        trainer.train_loop_per_worker = train_loop
        try:
            ray.kill(queue.actor)
        except Exception:
            pass


def start_ray(ray: Any, **init: Any) -> None:
    """``ray.init(**init)``; a local start that ran out of Ray's fixed 30 s for its raylet is tried once more,
    after one line on stderr (a busy machine; :data:`STARTUP_TIMED_OUT`). Other errors, and a second time out,
    are raised as Ray raised them."""
    try:
        ray.init(**init)
    except Exception as exc:
        if init.get("address") or STARTUP_TIMED_OUT not in str(exc):
            raise
        ray.shutdown()  # what the failed start left running
        print("jdist.ray: Ray's local start timed out (its raylet did not register within Ray's 30 s; the machine "
              "is busy); starting it once more.", file=sys.stderr, flush=True)
        ray.init(**init)


class _Driver:
    def __init__(self, trainer: Any, queue: Any, collector: RecordCollector, world: int):
        self.trainer = trainer
        self.queue = queue
        self.collector = collector
        self.world = world
        self.controller: Any = None
        self.ended: set[int] = set()  # workers whose session closed (their last records came)
        self.report_steps: dict[int, list[Any]] = {}  # per worker: its newest jdist.log step at each report
        self.placement_groups: set[str] = set()  # the worker groups' (ids), as the workers sent them
        self.failures: dict[int, RankFailure] = {}  # what the workers' training functions raised, as they sent it
        self.settled: float | None = None  # when a worker failed or every worker ended, or something came since
        failure_config = getattr(getattr(trainer, "run_config", None), "failure_config", None)
        self.retries = getattr(failure_config, "max_failures", 0) != 0
        self.outcome: dict[str, Any] = {}

    def _fit(self) -> None:
        try:
            self.outcome["result"] = self.trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self.outcome["error"] = exc

    def run(self) -> Any:
        thread = threading.Thread(target=self._fit, name="jdist-ray-fit", daemon=True)
        thread.start()
        try:
            with SigintCount() as sigints:  # a Ctrl-C that Python drops in a destructor is raised again
                while thread.is_alive() and not self._stalled():
                    sigints.check()
                    self._drain()
                    self.collector.tick()
                    thread.join(POLL_S)
        except KeyboardInterrupt:
            self._abort(thread)
            self._finish(thread, "interrupted", "interrupted")
            print("jdist.ray: interrupted: the Ray Train run was aborted.", file=sys.stderr)
            raise
        stalled = thread.is_alive()
        if stalled:
            what = "a worker failed" if self.failures else "every worker ended"
            print(f"jdist.ray: Ray Train's controller did not return within {CONTROLLER_WAIT_S:.0f} s after {what}: "
                  "aborting the run.", file=sys.stderr)
            self._abort(thread)
        error = self.outcome.get("error")
        if error is None and "result" in self.outcome:
            self._finish(thread, "finished", None)
            return self.outcome["result"]
        self._drain()
        failure = self._failure(error)
        if failure is None and (stalled or error is None):
            error = RuntimeError(f"Ray Train's controller did not return within {CONTROLLER_WAIT_S:.0f} s after "
                                 "every worker ended and was aborted; Ray's log has why")
        self._finish(thread, "failed", failure.headline if failure is not None else f"{type(error).__name__}: {error}")
        if failure is not None:
            raise failure from None
        raise error

    def _stalled(self) -> bool:
        """True once the controller had :data:`CONTROLLER_WAIT_S` after a failure or every worker's end with
        nothing more from the workers; never where Ray Train restarts failed worker groups (``FailureConfig``)."""
        if self.retries or (not self.failures and len(self.ended) < self.world):
            return False
        if self.settled is None:
            self.settled = time.monotonic()
        return time.monotonic() - self.settled > CONTROLLER_WAIT_S

    def _failure(self, error: BaseException | None) -> RankError | None:
        """The workers' failures: those Ray Train's error names (else those the workers sent), each with
        the traceback the worker sent where it came (whole; Ray's text of it is cut beyond 1000 characters)."""
        failed = dict(getattr(_rank_error(error, self.world), "failed", None) or self.failures)
        if not failed:
            return None
        failed.update({rank: self.failures[rank] for rank in failed if rank in self.failures})
        return RankError(failed, self.world, first_failure(failed))

    def _abort(self, thread: threading.Thread) -> None:
        """Abort the run through Ray Train's controller; one that does not answer within
        :data:`ABORT_S` is killed (its workers go with it) and its worker groups' placement groups,
        which would keep their CPUs and GPUs reserved, are removed."""
        import ray
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        deadline = time.monotonic() + 30
        while self.controller is None and thread.is_alive() and time.monotonic() < deadline:
            self._drain()
            thread.join(POLL_S)
        if self.controller is not None:
            try:
                ray.get(self.controller.abort.remote(), timeout=ABORT_S)
            except Exception:
                try:
                    ray.kill(self.controller, no_restart=True)
                except Exception:
                    pass
                self._drain()
                for group in self.placement_groups:
                    try:
                        remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(group)))
                    except Exception:
                        pass
        thread.join(ABORT_S)

    def _finish(self, thread: threading.Thread, status: str, error: str | None) -> None:
        deadline = time.monotonic() + DRAIN_S
        while len(self.ended) < self.world and time.monotonic() < deadline:
            self._drain()
            time.sleep(POLL_S / 2)
        self._drain()
        self.collector.finish(status, error)

    def _drain(self) -> None:
        try:
            size = self.queue.size()
            items = self.queue.get_nowait_batch(size) if size else []
        except Exception:  # the queue actor is gone (Ray shut down)
            return
        if items and self.settled is not None:
            self.settled = time.monotonic()
        for item in items:
            kind = item[0]
            if kind == "data":
                rank, message = item[1], decode_data(item[2])
                self.collector.handle(rank, message)
                if message["kind"] == "cell_end":
                    self.ended.add(rank)
            elif kind == "at":
                self.report_steps.setdefault(item[1], []).append(item[2])
            elif kind == "report":
                from jdist.ray.bridge import report_records

                index = item[1]
                at = [steps[index] if index < len(steps := self.report_steps.get(r, [])) else None
                      for r in range(len(item[3]))]
                self.collector.add(report_records(index, item[2], item[3], at))
            elif kind == "controller":
                self.controller = item[1]
            elif kind == "placement":
                if item[2]:
                    self.placement_groups.add(item[2])
            elif kind == "failed":
                rank, ename, evalue, text, when = item[1:]
                self.failures[rank] = RankFailure(rank, ename, evalue, _without_wrapper(text), when)
        self.collector.flush()


#: How Ray Train writes each failed worker's error into a ``WorkerGroupError``'s message (the errors it
#: keeps per worker have no traceback): per group of workers whose errors differ only in numbers,
#: ``[Rank 0,1 Error Snippet]:`` and then the first one's traceback, beyond 1000 characters its first and
#: last 500 (``ray/train/v2/_internal/execution/worker_group/poll.py``, Ray 2.60).
SNIPPET = re.compile(r"^\[Rank (\d+)[\d,]* Error Snippet\]:\n", re.M)
#: A frame of :func:`jdist.ray.bridge.in_session`, between Ray's and the user's in every worker's traceback.
WRAPPER_FRAME = re.compile(r'^  File ".*jdist/ray/bridge\.py", line \d+, in jdist_train_loop$')


def _rank_error(error: BaseException, world: int) -> RankError | None:
    """Ray Train's ``WorkerGroupError`` as jdist's :class:`RankError` (None: another error)."""
    failures = getattr(error, "worker_failures", None)
    if not failures:
        return None
    tracebacks = _tracebacks(str(error))
    failed = {}
    for rank, exc in failures.items():
        cause = getattr(exc, "cause", None) or exc  # Ray's wrapper of the worker's own exception
        lines = str(cause).strip().splitlines()
        failed[int(rank)] = RankFailure(int(rank), type(cause).__name__, lines[-1] if lines else "",
                                        tracebacks.get(int(rank)) or tuple(str(exc).splitlines()))
    return RankError(failed, world, first_failure(failed))  # (Ray gives no completion times: the lowest rank)


def _tracebacks(message: str) -> dict[int, tuple[str, ...]]:
    """The tracebacks in a ``WorkerGroupError``'s message, by the rank whose they are (:data:`SNIPPET`),
    without jdist's frame.

    >>> tb = ('Traceback (most recent call last):\\n  File "/x/jdist/ray/bridge.py", line 9, in jdist_train_loop\\n'
    ...       '    return train_loop(*config)\\n           ^^^^^^^^^^^^^^^^^^^\\n'
    ...       '  File "/y/train.py", line 3, in train_func\\n    1 / 0\\nZeroDivisionError: division by zero\\n')
    >>> for line in _tracebacks("Training failed due to worker errors:\\n[Rank 1,3 Error Snippet]:\\n" + tb)[1]:
    ...     print(line)
    Traceback (most recent call last):
      File "/y/train.py", line 3, in train_func
        1 / 0
    ZeroDivisionError: division by zero
    """
    parts = SNIPPET.split(message)
    return {int(rank): _without_wrapper(text) for rank, text in zip(parts[1::2], parts[2::2])}


def _without_wrapper(text: str) -> tuple[str, ...]:
    """A traceback's lines without the frame of :func:`jdist.ray.bridge.in_session` (:data:`WRAPPER_FRAME`)."""
    lines, ours = [], False
    for line in text.rstrip("\n").splitlines():
        if line.startswith("  File "):
            ours = WRAPPER_FRAME.match(line) is not None
        elif not line.startswith("    "):
            ours = False
        if not ours:
            lines.append(line)
    return tuple(lines)


def _code_of(trainer: Any) -> str:
    """The run's code, for the run log: the training function's source where Python has it."""
    fn = getattr(trainer, "train_loop_per_worker", None) or getattr(trainer, "_train_loop_per_worker", None)
    head = f"# jdist.ray.fit({type(trainer).__name__})\n"
    try:
        return head + inspect.getsource(fn) if fn is not None else head
    except (OSError, TypeError):
        return head


__all__ = ["fit"]
