"""``jdist.tune``: a hyper-parameter sweep driven from the notebook, trials on slots of the ranks.

The kernel owns an Optuna study, in memory and mirrored to its journal file in the sweep's folder in
Optuna's own format (:mod:`jdist.kernel.journal`; ``sweep.json`` and ``view.html`` there are for the
sidebar). The running cluster's ranks are tiled into slots of ``per_trial`` ranks, each slot its own
torch default group while the sweep runs (:mod:`jdist.rank.tune`). Every free slot gets the next trial at once
(no barrier across slots); ``jdist.log`` of the sweep's ``metric`` and ``trial.report`` feed the
pruner; a trial that raises, hangs past ``trial_timeout`` or is interrupted is told FAIL with its
rank's traceback and its slot repaired; Ctrl-C stops the sweep and keeps every finished trial,
and ``resume=True`` goes on where it stopped.

In the notebook::

    %%distributed -n 4
    def objective(trial):
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        ...
        return val_loss

    study = jdist.tune("objective", trials=32, per_trial=2, metric="val_loss", pruner="asha")
    study.best_params, jdist.last_sweep()
"""

from __future__ import annotations

import collections
import html
import json
import math
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jdist.errors import (ClusterError, OneLineError, RankFailure, first_failure, remote_errors, strip_ansi,
                          usage_error)
from jdist.metrics import default_run_dir
from jdist.plugins import backend_spec, backend_specs
from jdist.protocol import FOLDER_NAME, TUNE_REPLY, RankCall

from . import cluster as cl
from .sinks import RunLogSink
from .supervise.collect import RecordCollector
from .supervise.view import IppCellView

TUNE_INSTALL_HINT = "jdist.tune needs Optuna: pip install 'jdist[tune]' (or pip install optuna)."
#: Names accepted by ``pruner=`` (or pass an Optuna pruner).
PRUNERS = ("asha", "median", "hyperband", "none")
#: Trials in the view's table (the running ones first, then the newest) and curves drawn.
TABLE_ROWS = 40
CURVES = 30
#: Failed trials listed under the sweep's last line (all of them: ``jdist.last_sweep()``).
FAILED_SHOWN = 5
#: Trials are queued ahead on each slot while the median trial takes less than this (seconds).
PREFETCH_BELOW_S = 10.0
#: Seconds the other ranks of a trial get to raise TrialPruned after one did (SPMD code prunes on every rank)
#: before they are released from the collective they may wait in.
PRUNED_WAIT_S = 5.0

_last: Sweep | None = None


class RankLost(RuntimeError):
    """A rank died during a sweep: the sweep stopped (the message says how to go on)."""


class SweepStopped(OneLineError):
    """A trial's ranks did not stop when told to: the ranks were restarted and the sweep stopped (one line)."""


def tune(objective: str | Callable[[Any], Any], trials: int = 16, *, per_trial: int = 1, metric: str | None = None,
         direction: str = "minimize", pruner: Any = None, sampler: Any = None, study: Any = None,
         name: str | None = None, resume: bool = False, trial_timeout: float | None = None,
         show: bool = True) -> Any:
    """Run ``trials`` trials of ``objective`` on the running cluster's ranks, ``per_trial`` ranks each.

    ``objective``: the name of a function defined on the ranks (in a ``%%distributed`` cell), or a
    function defined in the notebook (sent to the ranks; its global names are the ranks'). It gets a
    trial (``suggest_float/int/categorical``, ``report``, ``should_prune``) and returns the value.
    ``metric``: a ``jdist.log`` name whose values (slot rank 0's) feed the pruner. ``pruner``:
    "asha", "median", "hyperband", "none" or an Optuna pruner. ``study``: an Optuna study of your own
    (its storage is then yours). ``resume``: go on with the sweep called ``name`` (default the newest),
    up to ``trials`` trials in all. ``trial_timeout``: seconds after which a trial is stopped and
    counted failed. Returns the ``optuna.Study``. Bad arguments raise one ``UsageError`` line before
    anything starts.

    >>> study = jdist.tune("objective", trials=8, per_trial=2, metric="val_loss")   # doctest: +SKIP
    """
    global _last
    t0 = time.perf_counter()
    optuna = _optuna()
    cluster = _check_args(optuna, trials, per_trial, metric, direction, pruner, study, trial_timeout)
    name = _sweep_name(name, resume, study)
    objective_name = _objective_on_ranks(cluster, objective)
    folder, study, journal, storage = _open_study(optuna, study, name, resume, direction, pruner, sampler)
    sweep = Sweep(cluster, study, objective_name, per_trial, metric, trials, trial_timeout, folder, show)
    sweep.journal, sweep.storage = journal, storage
    sweep.phases["before_s"] = time.perf_counter() - t0
    _last = sweep
    sweep.run()
    return study


def _check_args(optuna: Any, trials: Any, per_trial: Any, metric: Any, direction: Any, pruner: Any, study: Any,
                trial_timeout: Any) -> Any:
    """The running cluster, once every argument that needs no round trip to the ranks is right; else one
    ``UsageError`` line that names the fix (nothing has started yet)."""
    cluster = cl.current()
    if cluster is None or cluster.client is None:
        raise usage_error("jdist.tune runs trials on a running cluster: start one with a %%distributed cell first "
                          "(e.g. %%distributed -n 4 defining the objective).")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise usage_error(f"trials={trials!r}: a sweep needs a whole number of trials, at least 1.")
    n = cluster.config.n
    if not isinstance(per_trial, int) or isinstance(per_trial, bool) or per_trial < 1 or n % per_trial:
        raise usage_error(f"per_trial={per_trial!r} does not divide the {n} ranks into slots: use one of "
                          f"{', '.join(str(k) for k in range(1, n + 1) if n % k == 0)}.")
    if metric is not None and not isinstance(metric, str):
        raise usage_error(f"metric={metric!r}: pass the name of a jdist.log value (a str), or leave it out.")
    if study is None and str(getattr(direction, "name", direction)).lower() not in ("minimize", "maximize"):
        raise usage_error(f"direction={direction!r}: use 'minimize' or 'maximize'.")
    if isinstance(pruner, str) and pruner not in PRUNERS or not (
            pruner is None or isinstance(pruner, (str, optuna.pruners.BasePruner))):
        raise usage_error(f"pruner={pruner!r}: use one of {', '.join(PRUNERS)}, or an Optuna pruner.")
    if trial_timeout is not None and not (isinstance(trial_timeout, (int, float)) and trial_timeout > 0):
        raise usage_error(f"trial_timeout={trial_timeout!r}: pass positive seconds, or None (no limit).")
    if not backend_spec(cluster.config.backend).slots:
        able = [name for name, spec in sorted(backend_specs().items()) if spec.slots]
        raise usage_error(f"jdist.tune runs trials on slots of the ranks' group, which --backend "
                          f"{cluster.config.backend} cannot form (backends that can: {', '.join(able)}). Start one "
                          f"with %%distributed --backend {able[0]} --restart.")
    problem = slots_across_hosts({info["rank"]: info["host"] for info in cluster.ranks}, per_trial)
    if problem:
        raise usage_error(problem)
    return cluster


def slots_across_hosts(hosts: dict[int, str], per_trial: int) -> str | None:
    """Why slots of ``per_trial`` ranks cannot be formed on ranks placed on ``hosts`` (rank -> host): a slot
    must be on one host (its group rendezvous on loopback). None if they can.

    >>> slots_across_hosts({0: "a", 1: "a", 2: "b", 3: "b"}, 2) is None
    True
    >>> print(slots_across_hosts({0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}, 2))
    Slot 1 (ranks 2, 3) would span hosts a, b: a slot's ranks must share a host. Use per_trial=1 or 3.
    """
    n = len(hosts)
    for start in range(0, n, per_trial):
        ranks = list(range(start, start + per_trial))
        where = sorted({hosts[r] for r in ranks})
        if len(where) > 1:
            fits = [k for k in range(1, n + 1) if n % k == 0
                    and all(len({hosts[r] for r in range(i, i + k)}) == 1 for i in range(0, n, k))]
            return (f"Slot {start // per_trial} (ranks {', '.join(map(str, ranks))}) would span hosts "
                    f"{', '.join(where)}: a slot's ranks must share a host. Use per_trial="
                    f"{' or '.join(map(str, fits))}.")
    return None


def last_sweep() -> Any:
    """The newest sweep's trials as a pandas DataFrame (Optuna's ``trials_dataframe`` with each
    trial's slot, ranks, error and run folder); None before any sweep in this kernel."""
    return _last.dataframe() if _last is not None else None


def _objective_on_ranks(cluster: Any, objective: str | Callable[[Any], Any]) -> str:
    """The name of the objective in the ranks' namespace (a notebook function is sent there first)."""
    if isinstance(objective, str):
        missing = [r for r, ok in enumerate(cluster.call("has_function", objective)) if not ok]
        if missing:
            raise usage_error(f"jdist.tune: no function {objective!r} on rank(s) {missing}: define it in a "
                              "%%distributed cell first.")
        return objective
    if not callable(objective):
        raise usage_error("jdist.tune: objective must be a function of one trial, or the name of one on the ranks.")
    cluster.push("_jdist_objective", objective)
    return "_jdist_objective"


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ImportError(TUNE_INSTALL_HINT) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # jdist's view says what each trial did
    return optuna


def make_pruner(optuna: Any, pruner: Any) -> Any:
    """An Optuna pruner from ``pruner=``: a name of :data:`PRUNERS`, None (none) or a pruner object."""
    if pruner is None or pruner == "none":
        return optuna.pruners.NopPruner()
    if not isinstance(pruner, str):
        return pruner
    makers = {"asha": optuna.pruners.SuccessiveHalvingPruner, "median": optuna.pruners.MedianPruner,
              "hyperband": optuna.pruners.HyperbandPruner}
    if pruner not in makers:
        raise ValueError(f"pruner={pruner!r}: use one of {', '.join(PRUNERS)}, or an Optuna pruner.")
    return makers[pruner]()


def sweeps_dir() -> Path:
    """Where sweeps keep their folders: ``<run dir>/sweeps``."""
    return default_run_dir() / "sweeps"


def _sweep_name(name: str | None, resume: bool, study: Any) -> str | None:
    """The sweep's folder name: ``name``, the newest sweep's (``resume`` without one) or a new one; a
    ``UsageError`` line if it cannot be (nothing is created here). None for a study of the user's own."""
    root = sweeps_dir()
    if name is not None and (not isinstance(name, str) or not FOLDER_NAME.fullmatch(name) or name.startswith(".")):
        raise usage_error(f"name={name!r}: a sweep's name is its folder's (and the sidebar's link): use letters, "
                          "digits, '.', '_' and '-', not starting with '.'.")
    if study is not None:
        return None
    if resume:
        if name is None:
            existing = sorted((p for p in root.glob("*") if (p / "journal.log").exists()),
                              key=lambda p: p.stat().st_mtime) if root.exists() else []
            if not existing:
                raise usage_error(f"resume=True: no sweep in {root} to resume; start one without resume.")
            return existing[-1].name
        if not (root / name / "journal.log").exists():
            raise usage_error(f"resume=True: no sweep called {name!r} in {root}; start it without resume.")
        return name
    if name is None:  # a new name: two sweeps started in the same second get -2, -3...
        base = name = time.strftime("sweep-%Y%m%d-%H%M%S")
        number = 1
        while (root / name).exists():
            number += 1
            name = f"{base}-{number}"
        return name
    if (root / name / "journal.log").exists():
        raise usage_error(f"A sweep called {name!r} exists in {root}: pass resume=True to go on with it, "
                          "or another name.")
    return name


def _open_study(optuna: Any, study: Any, name: str | None, resume: bool, direction: str, pruner: Any,
                sampler: Any) -> tuple[Path, Any, Any, Any]:
    """The sweep's folder, study, mirrored journal and storage (``name`` from :func:`_sweep_name`; a study
    of the user's own keeps its storage: no journal, no storage of jdist's)."""
    from optuna.storages import JournalStorage

    from .journal import MirroredJournal

    root = sweeps_dir()
    if study is not None:
        folder = root / (re.sub(r"[^A-Za-z0-9_.-]", "_", study.study_name).lstrip(".") or "study")
        folder.mkdir(parents=True, exist_ok=True)
        return folder, study, None, None
    assert name is not None
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    journal = MirroredJournal(folder / "journal.log")
    if journal.dropped_tail:
        print(f"jdist.tune: the last line of {journal.path} was cut off (its writer stopped mid-line); it was "
              "dropped, the lines before it are read.")
    storage = JournalStorage(journal)
    study = optuna.create_study(study_name=name, storage=storage, direction=direction,
                                pruner=make_pruner(optuna, pruner), sampler=sampler, load_if_exists=resume)
    return folder, study, journal, storage


class _Wake:
    """A queue whose ``put`` (from ipyparallel's IO thread) also wakes the sweep's loop."""

    def __init__(self, event: threading.Event):
        self.q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.event = event

    def put(self, item: Any) -> None:
        self.q.put(item)
        self.event.set()


@dataclass
class TrialRun:
    """A trial running on a slot."""

    slot: int
    ranks: list[int]
    trial: Any  # optuna.Trial
    view: IppCellView
    inbox: _Wake
    records: RecordCollector
    started: float | None = None  # the ranks began it (a queued trial waits for the one before)
    pruned: bool = False
    stopped: str | None = None  # why the sweep stopped it: "timed out after ..." / "interrupted"
    stopped_at: float | None = None
    failed_at: float | None = None  # a rank's part failed while others ran
    where: list[str] = field(default_factory=list)  # each rank's line when it was stopped
    ended: float = 0.0
    decisions: dict[int, bool] = field(default_factory=dict)  # should_prune call number -> the answer
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=40))


class Sweep:
    """One ``jdist.tune`` call: the slots, the trials running on them, the live view."""

    def __init__(self, cluster: Any, study: Any, objective: str, per_trial: int,
                 metric: str | None, trials: int, trial_timeout: float | None, folder: Path, show: bool):
        self.cluster = cluster
        self.study = study
        self.objective = objective
        self.per_trial = per_trial
        self.metric = metric
        self.trials = trials
        self.trial_timeout = trial_timeout
        self.folder = folder
        self.slots = [list(range(i, i + per_trial)) for i in range(0, cluster.config.n, per_trial)]
        self.free = list(range(len(self.slots)))
        self.running: dict[int, TrialRun] = {}  # slot -> the trial its ranks run
        self.queued: dict[int, TrialRun] = {}  # slot -> the trial sent to start when that one ends
        self.ending: list[TrialRun] = []  # ended on the ranks, told once their last messages are in
        self.timeline: list[tuple[int, int, float, float, str]] = []  # slot, trial, start, end, state
        self.errors: dict[int, str] = {}  # trial number -> the root cause, one line
        self.wake = threading.Event()
        self.interrupted = False
        self.lost = False  # a rank died: no world group to form again (MPI ended every rank)
        self.grace_s = cluster.config.interrupt_grace  # --interrupt-grace: the seconds a stopped trial gets to end
        self.stuck: list[str] = []  # the trials still on their ranks when the sweep stopped waiting: where they are
        self.stuck_why = ""  # why it stopped waiting for them (the line that says the ranks are restarted)
        self.journal: Any = None  # the MirroredJournal of a study jdist created
        self.storage: Any = None  # and its JournalStorage (None: a study of the user's own)
        self.status = "running"  # then done / interrupted / stopped (sweep.json, for the sidebar)
        self.started = time.time()
        self.view = SweepView(self, show)
        self.dispatch_s: list[float] = []  # trial finished (seen) -> next trial sent on that slot
        self.freed_at: dict[int, float] = {}
        self.phases: dict[str, float] = {}  # seconds: forming the slots, the trials, the world group again
        self.t0 = 0.0
        self.entering: Any = None  # tune_enter's AsyncResult until every rank answered
        self.enter_error: str | None = None
        self.enter_refused = False
        # Parameters asked for with the trial (no round trip when the objective suggests them the same way)
        self.space = _optuna().search_space.IntersectionSearchSpace()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        optuna = _optuna()
        name = self.objective
        self._close_stale(optuna)
        self.t0 = t0 = time.perf_counter()
        # every rank forms its slot while the first trials travel: they wait behind it in the engines' queues
        self.entering = self.cluster.apply_async(RankCall("tune_enter"), self.per_trial)
        self.entering.add_done_callback(lambda _: self.wake.set())
        try:
            self._loop(optuna, name)
            if self.enter_error is not None:
                raise RuntimeError(f"jdist.tune: the slots could not be formed, {self.enter_error}")
            if self.stuck and not self.interrupted:
                raise SweepStopped(f"jdist.tune stopped: {self.stuck_why}; the ranks were restarted (the lines above "
                                   "say how it went). Every finished trial is kept: jdist.tune(..., resume=True) "
                                   "goes on.")
            self.status = "interrupted" if self.interrupted else "done"
        except BaseException:
            self.status = "stopped"
            raise
        finally:
            self._close(optuna, t0)

    def _close(self, optuna: Any, t0: float) -> None:
        """The sweep's end, whatever ended it: the ranks as before the sweep (:meth:`_give_back`), then the
        view, ``sweep.json`` and the journal final, and the last line. A Ctrl-C in these steps is dropped
        (each takes milliseconds, except the restart, which takes its own): it would leave ``sweep.json``
        saying "running" and a traceback through jdist."""
        t2 = time.perf_counter()
        notes: list[str] = []
        steps: list[Callable[[], Any]] = [
            lambda: notes.extend(self._give_back(optuna)),
            lambda: self.phases.update(trials_s=t2 - t0, world_s=time.perf_counter() - t2),
            lambda: self.view.update(final=True),
            lambda: notes.extend(self._flush_journal()),
            lambda: self._say_end(notes)]
        for step in steps:
            try:
                step()
            except KeyboardInterrupt:
                pass
        self.phases["after_s"] = time.perf_counter() - t2 - self.phases.get("world_s", 0.0)

    def _check_entered(self) -> None:
        """Once every rank answered ``tune_enter``: if one could not form its slot, nothing more is sent
        and the trials queued behind it are stopped, not counted (:meth:`run` then raises why)."""
        ar = self.entering
        if ar is None or not ar.ready():
            return
        self.entering = None
        self.phases["slots_s"] = time.perf_counter() - self.t0
        try:
            ar.get(0)
        except Exception as exc:
            errors = getattr(exc, "elist", None) or [(type(exc).__name__, str(exc))]
            # every rank refused before changing its group (jdist.rank.tune.enter_slots): nothing to give back
            self.enter_refused = len(errors) == len(ar) and all("Nothing was changed" in str(e[1]) for e in errors)
            self.enter_error = remote_errors(exc) + " (run %dist restart if the ranks do not answer)"
            self.interrupted = True  # nothing more is sent
            # the trials sent behind it fail by themselves on ranks without a slot: no signal (it could reach an
            # engine between two requests); none of them counts
            now = time.time()
            for tr in [*self.running.values(), *self.queued.values(), *self.ending]:
                tr.stopped, tr.stopped_at = "interrupted", tr.stopped_at or now
            for tr in self.queued.values():
                try:
                    self.cluster.client.abort(jobs=tr.view.ar, targets=self.cluster.engine_ids(tr.ranks), block=False)
                except Exception:
                    pass

    def _loop(self, optuna: Any, name: str) -> None:
        while True:
            try:
                self._check_entered()
                self._dispatch_or_death(optuna, name)
                if not self.running and not self.ending and self.entering is None:
                    return
                self.wake.wait(0.05 if self.ending else 0.25)
                self.wake.clear()
                dead = self.cluster.dead_ranks()
                if dead:
                    self._rank_died(optuna, dead)
                for slot, tr in list(self.running.items()):
                    if tr.view.ready():
                        del self.running[slot]
                        tr.ended = time.monotonic()
                        self.ending.append(tr)
                        nxt = self.queued.pop(slot, None)
                        if nxt is not None:  # already sent: the ranks started it when this one ended
                            self.running[slot] = nxt
                        else:
                            self._free(slot)
                for tr in [*self.running.values(), *self.queued.values()]:  # after the moves: none missed
                    self._pump(tr)
                    if tr in self.running.values():
                        self._watch(tr)
                if self.stuck:  # a stopped trial outlived --interrupt-grace: the ranks are restarted
                    self.stuck_why = "; and ".join(self.stuck)
                    self._abandon(optuna)
                    return
                self._dispatch_or_death(optuna, name)
                self._check_entered()  # trials are told once every rank formed its slot (or said why not)
                for tr in list(self.ending) if self.entering is None else ():  # and their last messages are in
                    if tr.view.ar.wait_for_output(0) or time.monotonic() - tr.ended > 1.0:  # (at most 1 s)
                        self.ending.remove(tr)
                        self._finish(optuna, tr)
                self.view.update()
            except KeyboardInterrupt:
                if not self.interrupted:
                    self.interrupted = True
                    try:
                        self._stop_all("interrupted")
                        continue
                    except KeyboardInterrupt:  # the second Ctrl-C came while the stops were sent
                        pass
                # a second Ctrl-C: stop waiting for the trials; those still on their ranks are named, and the
                # ranks restarted (their slot groups cannot be given back while a trial runs in them)
                self._stop_waiting()
                self._abandon(optuna)
                return

    def _dispatch_or_death(self, optuna: Any, name: str) -> None:
        try:
            self._dispatch(name)
        except ClusterError:  # a slot's rank died since the last look: say it as a death
            self._rank_died(optuna, self._dead_ranks_soon())

    def _stop_waiting(self) -> None:
        """The second Ctrl-C: the trials (or the forming of the slots) still on the ranks are :attr:`stuck`,
        each with where its ranks are."""
        live = [tr for tr in self.running.values() if not tr.view.ready()]
        live += [tr for slot, tr in self.queued.items()  # one that began: the trial before it on its slot ended
                 if not tr.view.ready() and (slot not in self.running or self.running[slot].view.ready())]
        where = self._where_ranks(sorted({r for tr in live for r in tr.view.running()}))
        for tr in live:
            tr.where = [where[r] for r in tr.view.running() if r in where]
            self.stuck.append(self._describe(tr))
        if self.entering is not None and not self.entering.ready():
            self.stuck.append(f"the slots being formed on ranks 0-{self.cluster.config.n - 1}")
        if self.stuck:
            self.stuck_why = f"stopped waiting (a second interrupt) for {'; and for '.join(self.stuck)}"

    @staticmethod
    def _describe(tr: TrialRun) -> str:
        where = f" ({'; '.join(tr.where)})" if tr.where else ""
        return f"trial {tr.trial.number} on ranks {', '.join(map(str, tr.view.running() or tr.ranks))}{where}"

    def _dead_ranks_soon(self) -> list[int]:
        """The dead ranks, once the launcher has seen the death that the client saw first (ClusterError
        again if it has not within 5 s)."""
        deadline = time.monotonic() + 5
        while not (dead := self.cluster.dead_ranks()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not dead:
            self.cluster.engine_ids()  # raises the ClusterError that names the ranks gone
        return dead

    def _rank_died(self, optuna: Any, dead: list[int]) -> None:
        """A rank's process ended: MPI cannot go on without it, so the sweep stops here (the launcher ends
        the other ranks); the trials that ran are told FAIL, every finished one is kept."""
        death = self.cluster.death_report(dead)
        self.lost = True
        for tr in [*self.ending, *self.running.values(), *self.queued.values()]:
            self._tell(optuna, tr, optuna.trial.TrialState.FAIL, error=f"rank {death.rank} died: {death.cause}")
        self.ending.clear()
        self.running.clear()
        self.queued.clear()
        raise RankLost(f"jdist.tune stopped: rank {death.rank} died ({death.cause}). Every finished trial is kept "
                       "in the journal: run %dist restart, define the objective again, then "
                       "jdist.tune(..., resume=True).")

    def _free(self, slot: int) -> None:
        self.free.append(slot)
        self.freed_at[slot] = time.perf_counter()

    def _dispatch(self, name: str) -> None:
        """Start trials on the free slots while the budget lasts, then queue the next trial behind each
        running one while trials are short (:meth:`_prefetch`): the ranks start it when that one ends."""
        def budget() -> int:
            return self._budget_left() - len(self.ending) - len(self.running) - len(self.queued)

        if self.entering is not None and self.ending:  # a trial ended before every rank said it formed its slot
            return  # (a rank without one fails it at once): no more trials until they all did (seen under load)
        while not self.interrupted and self.free and budget() > 0:
            slot = self.free.pop(0)
            self.running[slot] = self._send(slot, name)
            if slot in self.freed_at:
                self.dispatch_s.append(time.perf_counter() - self.freed_at.pop(slot))
        if self._prefetch():  # the last len(slots) trials go to whichever slot is free first: no idle tail
            for slot in self.running:
                if slot not in self.queued and not self.interrupted and budget() >= len(self.slots):
                    self.queued[slot] = self._send(slot, name)

    def _prefetch(self) -> bool:
        """Queue trials ahead while the median trial so far took under :data:`PREFETCH_BELOW_S`: then a
        few ms between trials matter and the sampler loses little by asking one trial early per slot.
        Longer trials are asked when their slot is free, so the sampler sees every result so far."""
        spans = [end - start for _, _, start, end, _ in self.timeline[-16:]]
        return bool(spans) and sorted(spans)[len(spans) // 2] < PREFETCH_BELOW_S

    def _budget_left(self) -> int:
        return self.trials - sum(1 for t in self.study.get_trials(deepcopy=False) if _counts(t))

    def _close_stale(self, optuna: Any) -> None:
        """Trials a previous kernel left RUNNING (it died or was interrupted hard) count as interrupted."""
        states = optuna.trial.TrialState
        for t in self.study.get_trials(deepcopy=False, states=(states.RUNNING,)):
            # Optuna's Study has no public call that sets an attribute of a trial it did not hand out: the
            # storage's (public BaseStorage methods) does; a study of the user's own is reached through its
            # private _storage, the one private name used here
            storage = self.storage if self.storage is not None else self.study._storage
            trial_id = storage.get_trial_id_from_study_id_trial_number(
                storage.get_study_id_from_name(self.study.study_name), t.number)
            storage.set_trial_user_attr(trial_id, "jdist_error", "interrupted (the sweep stopped)")
            storage.set_trial_user_attr(trial_id, "jdist_interrupted", True)
            self.study.tell(t.number, state=states.FAIL, skip_if_finished=True)

    def _send(self, slot: int, name: str) -> TrialRun:
        ranks = self.slots[slot]
        self.cluster.engine_ids(ranks)  # ClusterError if one died: before a trial is asked that none would run
        space = self.space.calculate(self.study)  # the parameters every finished trial had, same distribution
        trial = self.study.ask(fixed_distributions=space) if space else self.study.ask()
        given = {n: (*as_request(d), trial.params[n]) for n, d in space.items()}
        trial.set_user_attr("jdist_slot", slot)
        trial.set_user_attr("jdist_ranks", ranks)
        inbox = _Wake(self.wake)
        records = RecordCollector(self.cluster, f"jdist.tune {self.study.study_name}: trial {trial.number}",
                                  lambda run: [RunLogSink(str(self.folder / "trials"))], ranks=ranks)
        try:
            ar = self.cluster.apply_async(RankCall("tune_trial"), trial.number, name, given, ranks=ranks)
        except ClusterError:  # a rank died after the check above: the trial asked for it fails
            import optuna

            trial.set_user_attr("jdist_error", "a rank of its slot died before it started")
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        view = IppCellView(ar, ranks)
        view.on_each_done(self.wake.set)
        view.attach(inbox)
        return TrialRun(slot, ranks, trial, view, inbox, records)

    def _pump(self, tr: TrialRun) -> None:
        while True:
            try:
                rank, kind, content = tr.inbox.q.get_nowait()
            except queue.Empty:
                return
            if kind == "data":
                if content.get("kind") == "tune":
                    self._request(tr, rank, content)
                    continue
                tr.records.handle(rank, content)
                if content.get("kind") in ("records", "cell_end") and self.metric:
                    self._feed_pruner(tr, content.get("records") or ())
            elif kind == "stream":
                tr.output.extend(f"[r{rank}] {line}" for line in content.get("text", "").splitlines())
        tr.records.tick()

    def _feed_pruner(self, tr: TrialRun, records: Any) -> None:
        for rec in records:
            value = rec.get(self.metric)
            if rec.get("rank") == 0 and isinstance(value, (int, float)) and isinstance(rec.get("step"), int):
                tr.trial.report(float(value), rec["step"])

    def _request(self, tr: TrialRun, rank: int, msg: dict[str, Any]) -> None:
        op, payload = msg["op"], msg["payload"]
        trial = tr.trial
        reply: dict[str, Any] = {"trial": msg["trial"], "seq": msg["seq"]}
        try:
            if op == "suggest":
                args = payload["args"]
                if payload["kind"] == "categorical":
                    reply["value"] = trial.suggest_categorical(payload["name"], args["choices"])
                elif payload["kind"] == "int":
                    reply["value"] = trial.suggest_int(payload["name"], args["low"], args["high"], step=args["step"],
                                                       log=args["log"])
                else:
                    reply["value"] = trial.suggest_float(payload["name"], args["low"], args["high"], step=args["step"],
                                                         log=args["log"])
            elif op == "should_prune":  # decided once per call number: every rank of the slot agrees
                index = payload["index"]
                if index not in tr.decisions:
                    tr.pruned = tr.pruned or bool(trial.should_prune())  # pruners may answer numpy.bool_
                    tr.decisions[index] = tr.pruned
                reply["value"] = tr.decisions[index]
            elif op == "report":
                trial.report(payload["value"], payload["step"])
                return
            elif op == "user_attr":
                trial.set_user_attr(payload["key"], payload["value"])
                return
            elif op == "started":
                tr.started = time.time()
                return
        except Exception as exc:  # a bad suggestion (e.g. low > high): the rank raises it in the objective
            reply.pop("value", None)
            reply["error"] = f"{type(exc).__name__}: {exc}"
        if "value" in reply:
            reply["value"] = _plain_value(reply["value"])
            try:
                json.dumps(reply["value"])
            except (TypeError, ValueError):
                reply = {"trial": reply["trial"], "seq": reply["seq"],
                         "error": f"{op}: the value {reply.pop('value')!r} cannot be sent to the ranks (not JSON)"}
        self.cluster.reply(rank, TUNE_REPLY, reply)

    def _watch(self, tr: TrialRun) -> None:
        if self.entering is not None:  # a failure now may be a rank without a slot: tune_enter's answer decides
            return
        now = time.time()
        if tr.stopped is None:
            failed = tr.view.early_failures()  # the others may wait for the failed rank in a collective
            if failed and tr.failed_at is None:
                tr.failed_at = now
            if failed and (set(failed) != {"TrialPruned"} or now - (tr.failed_at or now) > PRUNED_WAIT_S):
                self._stop(tr, "released")  # (the others of a pruned trial raise TrialPruned too: given time)
            elif self.trial_timeout is not None and tr.started is not None and now - tr.started > self.trial_timeout:
                tr.where = self._where(tr)
                self._stop(tr, f"timed out after {self.trial_timeout:g} s")
        elif tr.stopped_at is not None and now - tr.stopped_at > self.grace_s and not tr.view.ready():
            tr.where = self._where(tr)  # where its ranks are now (a timed-out trial's error had where they were)
            why = "a rank failed" if tr.stopped == "released" else tr.stopped
            self.stuck.append(f"{self._describe(tr)} did not stop within {self.grace_s:g} s (--interrupt-grace) "
                              f"of being stopped ({why})")

    def _stop(self, tr: TrialRun, why: str) -> None:
        """Stop ``tr`` on its ranks (KeyboardInterrupt in the objective; a blocked collective is released):
        a message for this trial on each rank's control channel, not a signal to the process, which could
        reach the trial queued behind it (:func:`jdist.rank.tune.stop_trial`)."""
        tr.stopped, tr.stopped_at = why, time.time()
        for rank in tr.view.running():
            self.cluster.reply(rank, TUNE_REPLY, {"trial": tr.trial.number, "stop": why})

    def _where(self, tr: TrialRun) -> list[str]:
        where = self._where_ranks(tr.view.running())
        return [where[r] for r in sorted(where)]

    def _where_ranks(self, ranks: list[int]) -> dict[int, str]:
        """What each of ``ranks`` does: "rank 3 running cell line 7" (:func:`jdist.stacks.summary`); ranks
        that gave no stack within 2 s are left out, and so is everything after a Ctrl-C."""
        from jdist.stacks import summary

        if not ranks:
            return {}
        try:
            stacks = self.cluster.stacks(ranks)
        except (Exception, KeyboardInterrupt):
            return {}
        return {r: f"rank {r} {summary(frames)}" for r, frames in sorted(stacks.items()) if frames}

    def _stop_all(self, why: str) -> None:
        if self.entering is not None:  # the slots form first: a signal in the middle would leave them half made
            self.entering.wait(self.grace_s)
        for tr in self.queued.values():  # not started: taken out of the engines' queues (or stopped as it begins)
            try:
                self.cluster.client.abort(jobs=tr.view.ar, targets=self.cluster.engine_ids(tr.ranks), block=False)
            except Exception:
                pass
            self._stop(tr, why)
        for tr in self.running.values():
            if tr.stopped is None:
                self._stop(tr, why)

    def _abandon(self, optuna: Any) -> None:
        """Stop waiting for the trials: those that ended are told as they ended; the others FAIL, interrupted
        (not counted), except a trial stopped for its own fault (a timeout, a failed rank) that did not stop:
        it counts, with where its ranks were."""
        live = [tr for tr in [*self.running.values(), *self.queued.values()] if not tr.view.ready()]
        for tr in [*self.ending, *(tr for tr in [*self.running.values(), *self.queued.values()] if tr not in live)]:
            self._finish(optuna, tr)
        self.ending.clear()
        for tr in live:
            if tr.stopped not in (None, "interrupted"):
                cause = "a rank failed" if tr.stopped == "released" else tr.stopped
                error = f"{cause}, and it did not stop within {self.grace_s:g} s: {'; '.join(tr.where) or 'no stack'}"
            else:
                tr.stopped = "interrupted"
                error = "interrupted (the sweep stopped)" + (f" while {'; '.join(tr.where)}" if tr.where else "")
            self._tell(optuna, tr, optuna.trial.TrialState.FAIL, error=error)
        self.running.clear()
        self.queued.clear()

    def _settle(self, optuna: Any) -> None:
        """After an error in the kernel's loop: the trials still on the ranks are stopped and get
        --interrupt-grace to end; those that do not are :attr:`stuck` (the ranks are then restarted)."""
        live = [tr for tr in [*self.running.values(), *self.queued.values()] if not tr.view.ready()]
        if not live:
            return
        try:
            self._stop_all("interrupted")
            deadline = time.monotonic() + self.grace_s
            while any(not tr.view.ready() for tr in live) and time.monotonic() < deadline:
                self.wake.wait(0.05)
                self.wake.clear()
        except KeyboardInterrupt:  # stop waiting
            pass
        live = [tr for tr in live if not tr.view.ready()]
        for tr in live:
            tr.where = self._where(tr)
            self.stuck.append(self._describe(tr))
        if self.stuck:
            self.stuck_why = (f"after an error in the sweep, {'; and '.join(self.stuck)} did not stop within "
                              f"{self.grace_s:g} s (--interrupt-grace)")
        self._abandon(optuna)

    def _finish(self, optuna: Any, tr: TrialRun) -> None:
        self._pump(tr)
        failures = tr.view.failures()
        states = optuna.trial.TrialState
        result = None if failures else tr.view.ar.get()[0]  # slot rank 0's value
        if isinstance(result, BaseException):  # ipyparallel's TaskAborted: taken out of the queue unstarted
            self._tell(optuna, tr, states.FAIL, error=tr.stopped or f"{type(result).__name__}: {result}")
        elif not failures and tr.pruned:
            self._tell(optuna, tr, states.PRUNED)
        elif not failures and result is not None:
            self._tell(optuna, tr, states.COMPLETE, result)
        elif not failures:
            self._tell(optuna, tr, states.FAIL, error="the objective returned None")
        else:
            root = failures[first_failure(failures)]
            if root.ename == "TrialPruned":
                self._tell(optuna, tr, states.PRUNED)
            else:
                why = tr.stopped if tr.stopped and tr.stopped != "released" else None
                if why and tr.where:
                    why += ": " + "; ".join(tr.where)
                error = why or f"rank {root.rank}: {root.ename}: {root.evalue}"
                self._tell(optuna, tr, states.FAIL, error=error, failure=root)
        tr.records.finish("failed" if failures else "finished", self.errors.get(tr.trial.number) if failures else None)

    def _tell(self, optuna: Any, tr: TrialRun, state: Any, value: Any = None, error: str | None = None,
              failure: RankFailure | None = None) -> None:
        trial = tr.trial
        if error is not None:
            self.errors[trial.number] = error
            trial.set_user_attr("jdist_error", error)
            if failure is not None and failure.traceback:
                trial.set_user_attr("jdist_traceback", "\n".join(strip_ansi(line) for line in failure.traceback))
            if tr.output:
                trial.set_user_attr("jdist_output", "\n".join(tr.output))
            if tr.stopped == "interrupted":
                trial.set_user_attr("jdist_interrupted", True)
        if tr.records.run is not None:
            trial.set_user_attr("jdist_run", str(tr.records.run.path or ""))
        self.study.tell(trial, value, state=state)
        self.timeline.append((tr.slot, trial.number, tr.started or time.time(), time.time(), state.name))

    def _flush_journal(self) -> list[str]:
        """Wait for the journal file to hold every trial (a mirrored journal writes from a thread)."""
        from .journal import JournalWriteError

        if self.journal is None:  # a study of the user's own, with its own storage
            return []
        try:
            self.journal.flush()
        except JournalWriteError as exc:
            return [f"Every trial is in the study in memory, but {exc}: save it with "
                    "optuna.copy_study(...) to another storage before the kernel stops."]
        return []

    def _give_back(self, optuna: Any) -> list[str]:
        """The ranks as they were before the sweep: the world group formed again; or, where a trial still runs
        in its slot group (that group cannot be given back) or the world group could not be formed, the ranks
        restarted, said in one line first. Nothing to do after a rank died (MPI ended every rank: the
        RankLost line says what to do) or when every rank refused to form its slot (nothing changed)."""
        if self.lost or self.enter_refused:
            return []
        if not self.stuck:
            self._settle(optuna)  # after an error in the loop: the trials still running stop first
        if self.stuck:
            return [self._restart(f"{self.stuck_why}: a slot group that a trial still runs in cannot be given back")]
        try:
            answers = self.cluster.call("tune_leave", timeout=120)
        except (Exception, KeyboardInterrupt) as exc:  # a rank left its slot and not the others: no world group
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
            return [self._restart(f"the world process group could not be formed again after the sweep ({why})")]
        first = answers[0] if answers else {}
        return [line for line in (first.get("kept"), first.get("lost")) if line]

    def _restart(self, why: str) -> str:
        """Restart the ranks (set-up cells replayed, as ``%dist restart``); one line says why first. Its
        result line, or what to do if it could not (a failed start, a Ctrl-C during it)."""
        from . import recovery

        print(f"jdist.tune: {why}, so the ranks are restarted (set-up cells replayed, as %dist restart)...",
              flush=True)
        try:
            self.view.update(final=True)  # the sidebar's card says how the sweep ended while the ranks restart
            self.cluster.stop(busy=True)  # ranks still in a trial: a teardown would wait for them (5 s)
            return recovery.restart(self.cluster, lambda line: print(line, flush=True))
        except (Exception, KeyboardInterrupt) as exc:
            return (f"The ranks could not be restarted ({type(exc).__name__}: {exc}): run %dist restart, "
                    "then jdist.tune(..., resume=True).")

    def _say_end(self, notes: list[str]) -> None:
        trials = self.study.get_trials(deepcopy=False)
        states = collections.Counter("INTERRUPTED" if t.user_attrs.get("jdist_interrupted") else t.state.name
                                     for t in trials)
        parts = [f"{states[k]} {k.lower()}" for k in ("COMPLETE", "PRUNED", "FAIL", "INTERRUPTED") if states.get(k)]
        head = {"done": "Sweep done", "interrupted": "Sweep interrupted"}.get(self.status, "Sweep stopped")
        line = f"{head}: {self.study.study_name}, {', '.join(parts) or 'no trials'}"
        try:
            best = self.study.best_trial
            line += f"; best trial {best.number}: {best.value:.6g} {best.params}"
        except (ValueError, RuntimeError):  # none completed yet; several objectives have no single best
            pass
        print(line + f". Journal: {self.folder / 'journal.log'}")
        failed = [t for t in trials if t.state.name == "FAIL" and not t.user_attrs.get("jdist_interrupted")]
        for t in failed[:FAILED_SHOWN]:
            print(f"  trial {t.number} failed: {t.user_attrs.get('jdist_error', 'no error recorded')}")
        if len(failed) > FAILED_SHOWN:
            print(f"  ... and {len(failed) - FAILED_SHOWN} more: jdist.last_sweep() has each trial's error.")
        if self.status != "done":
            print("Every finished trial is kept; go on with jdist.tune(..., resume=True).")
        for note in notes:
            print(note)

    # -- results ---------------------------------------------------------------------------------
    def dataframe(self) -> Any:
        df = self.study.trials_dataframe()
        columns = ("slot", "ranks", "error", "run")
        df = df.rename(columns={f"user_attrs_jdist_{k}": k for k in columns})
        df = df.drop(columns=[c for c in df.columns if c.startswith("user_attrs_jdist_")])
        for k in columns:  # Optuna leaves out an attribute no trial has (no error, nothing logged): always there
            if k not in df.columns:
                df[k] = None
        return df


def _plain_value(value: Any) -> Any:
    """numpy scalars (a categorical choice, a pruner's answer) as Python ones, for the JSON reply."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict, str)) else value


def as_request(distribution: Any) -> tuple[str, dict[str, Any]]:
    """An Optuna distribution as the ranks' ``suggest_*`` call names it: (kind, args).

    >>> import optuna
    >>> as_request(optuna.distributions.FloatDistribution(1e-4, 0.1, log=True))
    ('float', {'low': 0.0001, 'high': 0.1, 'step': None, 'log': True})
    >>> as_request(optuna.distributions.CategoricalDistribution(("adam", "sgd")))
    ('categorical', {'choices': ['adam', 'sgd']})
    """
    name = type(distribution).__name__
    if name == "CategoricalDistribution":
        return "categorical", {"choices": list(distribution.choices)}
    kind = "int" if name == "IntDistribution" else "float"
    return kind, {"low": distribution.low, "high": distribution.high, "step": distribution.step,
                  "log": distribution.log}


def _counts(trial: Any) -> bool:
    """Whether a trial counts towards the sweep's budget: finished, and not stopped by an interrupt."""
    name = trial.state.name
    return name in ("COMPLETE", "PRUNED") or (name == "FAIL" and not trial.user_attrs.get("jdist_interrupted"))


class SweepView:
    """The sweep in the notebook (``show``): progress, best so far and the trials table, redrawn at most
    twice a second in one display (its last state stays in the saved notebook); and the same for the
    sidebar: ``sweep.json`` (:class:`jdist.protocol.SweepSummaryModel`) and ``view.html`` in the
    sweep's folder, each replaced whole (never read half-written)."""

    def __init__(self, sweep: Sweep, show: bool = True, every_s: float = 0.5):
        self.sweep = sweep
        self.show = show
        self.every_s = every_s
        self.last = 0.0
        self.handle: Any = None

    def update(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < self.every_s:
            return
        self.last = now
        rows = self.rows()
        page = self.html(rows)
        try:
            _replace(self.sweep.folder / "view.html", page)
            _replace(self.sweep.folder / "sweep.json", json.dumps(self.summary(rows), allow_nan=False))
        except (OSError, ValueError) as exc:  # a full disk, a value JSON cannot carry: the sweep goes on
            if final:
                print(f"jdist.tune: the sidebar's copy of the sweep could not be written ({exc}).")
        if not self.show:
            return
        from IPython.display import HTML, display

        out = HTML(page)
        if self.handle is None:
            self.handle = display(out, display_id=True)
        else:
            self.handle.update(out)

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The sweep for the sidebar (a :class:`jdist.protocol.SweepSummaryModel`)."""
        sw = self.sweep
        best = _best(sw.study)
        return {"name": sw.folder.name, "status": sw.status, "cluster_id": sw.cluster.cluster_id,
                "notebook": None, "started": sw.started, "ended": None if sw.status == "running" else time.time(),
                "updated": time.time(), "trials": sw.trials, "per_trial": sw.per_trial, "slots": len(sw.slots),
                "metric": sw.metric, "direction": sw.study.directions[0].name.lower(),
                "counts": dict(collections.Counter(r["state"] for r in rows)),
                "best_trial": best.number if best else None,
                "best_value": best.value if best and math.isfinite(best.value) else None,
                "best_params": {k: _plain_value(v) for k, v in best.params.items()} if best else None,
                "journal": str(sw.folder / "journal.log")}

    def rows(self) -> list[dict[str, Any]]:
        sw = self.sweep
        running = {tr.trial.number for tr in sw.running.values()}
        queued = {tr.trial.number for tr in sw.queued.values()}
        # when each trial ran on its ranks (Optuna's datetime_start is when it was asked: a queued trial waits)
        ran = {trial: (start, end) for _, trial, start, end, _ in sw.timeline}
        ran.update((tr.trial.number, (tr.started, None)) for tr in sw.running.values() if tr.started is not None)
        rows = []
        for t in sw.study.get_trials(deepcopy=False):
            state = ("QUEUED" if t.number in queued else "RUNNING" if t.number in running
                     else "INTERRUPTED" if t.user_attrs.get("jdist_interrupted") else t.state.name)
            end = t.datetime_complete.timestamp() if t.datetime_complete else time.time()
            start = t.datetime_start.timestamp() if t.datetime_start else end
            if t.number in ran:
                start, end = ran[t.number][0], ran[t.number][1] or time.time()
            elif state == "QUEUED":
                start = end
            last = max(t.intermediate_values) if t.intermediate_values else None
            rows.append({"trial": t.number, "state": state, "slot": t.user_attrs.get("jdist_slot"),
                         "params": t.params, "value": t.value,
                         "last": t.intermediate_values[last] if last is not None else None, "step": last,
                         "seconds": end - start, "error": t.user_attrs.get("jdist_error")})
        return rows

    def html(self, rows: list[dict[str, Any]] | None = None) -> str:
        from jdist.metrics import sweep as panels

        sw = self.sweep
        rows = self.rows() if rows is None else rows
        counts = collections.Counter(r["state"] for r in rows)
        head = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        single = len(sw.study.directions) == 1
        best = _best(sw.study)
        best_line = (f"best trial {best.number}: <b>{best.value:.6g}</b> {html.escape(_fmt_params(best.params))}"
                     if best is not None else "no trial completed yet" if single else "")
        cells = []
        for r in sorted(rows, key=lambda r: (r["state"] not in ("RUNNING", "QUEUED"), -r["trial"]))[:TABLE_ROWS]:
            value = f"{r['value']:.6g}" if isinstance(r["value"], float) else ""
            last = f"{r['last']:.4g} @ {r['step']}" if r["last"] is not None else ""
            colour = panels.COLOURS.get(r["state"], "#757575")
            cells.append(f"<tr><td>{r['trial']}</td><td style='color:{colour}'>{r['state'].lower()}</td>"
                         f"<td>{'' if r['slot'] is None else r['slot']}</td>"
                         f"<td>{html.escape(_fmt_params(r['params']))}</td><td>{value}</td><td>{last}</td>"
                         f"<td>{r['seconds']:.1f}</td><td>{html.escape(r['error'] or '')}</td></tr>")
        more = f"<div>... {len(rows) - TABLE_ROWS} more: jdist.last_sweep()</div>" if len(rows) > TABLE_ROWS else ""
        now = time.time()
        spans = [*sw.timeline, *((tr.slot, tr.trial.number, tr.started, None, "RUNNING")
                                 for tr in sw.running.values() if tr.started is not None)]
        trials = sw.study.get_trials(deepcopy=False)
        states = {r["trial"]: r["state"] for r in rows}
        recent = sorted((t for t in trials if t.intermediate_values), key=lambda t: t.number)[-CURVES:]
        curves = {t.number: (states.get(t.number, t.state.name), list(t.intermediate_values.items())) for t in recent}
        done = [t for t in trials if t.state.name == "COMPLETE" and single]
        figures = [panels.curves_svg(curves, sw.metric or "reported value"),
                   panels.best_svg([(t.number, t.value) for t in done], sw.study.direction.name.lower())]
        return ("<div class='jdist-sweep' style='font-family:sans-serif;font-size:12px'>"
                f"<b>jdist.tune {html.escape(sw.study.study_name)}</b>: {len(sw.slots)} slot(s) of {sw.per_trial} "
                f"rank(s), {head or 'starting'}; {best_line}"
                f"<div>{panels.timeline_svg(spans, len(sw.slots), now)}</div>"
                f"<div style='display:flex;gap:12px'>{''.join(figures)}</div>"
                f"<div>{panels.parallel_svg([(t.params, t.value) for t in done], sw.study.direction.name.lower())}</div>"
                "<table><tr><th>trial</th><th>state</th><th>slot</th><th>params</th><th>value</th>"
                f"<th>last reported</th><th>s</th><th>error</th></tr>{''.join(cells)}</table>{more}</div>")


def _best(study: Any) -> Any:
    """The study's best trial; None before one completed, or with several objectives (no single best)."""
    if len(study.directions) != 1:
        return None
    try:
        return study.best_trial
    except ValueError:
        return None


def _replace(path: Path, text: str) -> None:
    """Write ``path`` whole: readers see the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))
