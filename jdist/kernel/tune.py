"""``jdist.tune``: a hyper-parameter sweep driven from the notebook, trials on slots of the ranks.

The kernel owns an Optuna study (its journal file in the sweep's folder, Optuna's own format); the
running cluster's ranks are tiled into slots of ``per_trial`` ranks, each slot its own torch default
group while the sweep runs (:mod:`jdist.rank.tune`). Every free slot gets the next trial at once
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
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jdist.errors import RankFailure
from jdist.metrics import default_run_dir

from . import cluster as cl
from .supervise.collect import RecordCollector
from .supervise.view import IppCellView

TUNE_INSTALL_HINT = "jdist.tune needs Optuna: pip install 'jdist[tune]' (or pip install optuna)."
#: Names accepted by ``pruner=`` (or pass an Optuna pruner).
PRUNERS = ("asha", "median", "hyperband", "none")
#: Backends whose groups a sweep's slots replace (torch's default group).
SLOT_BACKENDS = ("ddp", "fsdp")
#: Seconds the ranks of an interrupted or timed-out trial get to end it before the sweep stops.
GRACE_S = 15.0
REPLY_TYPE = "jdist_tune_reply"  # jdist.rank.tune.REPLY_TYPE (the kernel does not import rank code)

_last: Sweep | None = None


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
    counted failed. Returns the ``optuna.Study``.

    >>> study = jdist.tune("objective", trials=8, per_trial=2, metric="val_loss")   # doctest: +SKIP
    """
    global _last
    optuna = _optuna()
    cluster = cl.current()
    if cluster is None or cluster.client is None:
        raise RuntimeError("jdist.tune runs trials on a running cluster: start one with a %%distributed cell first "
                           "(e.g. %%distributed -n 4 defining the objective).")
    n = cluster.config.n
    if per_trial < 1 or n % per_trial:
        raise ValueError(f"per_trial={per_trial} does not divide the {n} ranks into slots: use one of "
                         f"{', '.join(str(k) for k in range(1, n + 1) if n % k == 0)}.")
    if trials < 1:
        raise ValueError("trials must be at least 1.")
    if cluster.config.backend not in SLOT_BACKENDS:
        raise ValueError(f"jdist.tune runs trials with --backend {' or '.join(SLOT_BACKENDS)} (slots of the torch "
                         f"default group); this cluster runs --backend {cluster.config.backend}. Start one with "
                         "%%distributed --backend ddp --restart.")
    if len({info["host"] for info in cluster.ranks}) > 1 and per_trial > 1:
        raise ValueError("Slots of several ranks on a cluster of several hosts are not supported yet: "
                         "use per_trial=1, or ranks on one host.")
    objective_name = _objective_on_ranks(cluster, objective)
    folder, study = _open_study(optuna, study, name, resume, direction, pruner, sampler)
    sweep = Sweep(cluster, study, objective_name, per_trial, metric, trials, trial_timeout, folder, show)
    _last = sweep
    sweep.run()
    return study


def last_sweep() -> Any:
    """The newest sweep's trials as a pandas DataFrame (Optuna's ``trials_dataframe`` with each
    trial's slot, ranks and error); None before any sweep in this kernel."""
    return _last.dataframe() if _last is not None else None


def _objective_on_ranks(cluster: Any, objective: str | Callable[[Any], Any]) -> str:
    """The name of the objective in the ranks' namespace (a notebook function is sent there first)."""
    if isinstance(objective, str):
        missing = [r for r, ok in enumerate(cluster.call("has_function", objective)) if not ok]
        if missing:
            raise NameError(f"jdist.tune: no function {objective!r} on rank(s) {missing}: define it in a "
                            "%%distributed cell first.")
        return objective
    if not callable(objective):
        raise TypeError("jdist.tune: objective must be a function of one trial, or the name of one on the ranks.")
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


def _open_study(optuna: Any, study: Any, name: str | None, resume: bool, direction: str, pruner: Any,
                sampler: Any) -> tuple[Path, Any]:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    root = sweeps_dir()
    if study is not None:
        folder = root / study.study_name
        folder.mkdir(parents=True, exist_ok=True)
        return folder, study
    if resume:
        if name is None:
            existing = sorted((p for p in root.glob("*") if (p / "journal.log").exists()),
                              key=lambda p: p.stat().st_mtime) if root.exists() else []
            if not existing:
                raise FileNotFoundError(f"resume=True: no sweep in {root} to resume; start one without resume.")
            name = existing[-1].name
        elif not (root / name / "journal.log").exists():
            raise FileNotFoundError(f"resume=True: no sweep called {name!r} in {root}.")
    else:
        name = name or time.strftime("sweep-%Y%m%d-%H%M%S")
        if (root / name / "journal.log").exists():
            raise FileExistsError(f"A sweep called {name!r} exists in {root}: pass resume=True to go on with it, "
                                  "or another name.")
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(folder / "journal.log")))
    study = optuna.create_study(study_name=name, storage=storage, direction=direction,
                                pruner=make_pruner(optuna, pruner), sampler=sampler, load_if_exists=resume)
    return folder, study


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
    started: float = field(default_factory=time.time)
    result: Any = None
    has_result: bool = False
    pruned: bool = False
    stopped: str | None = None  # why the sweep stopped it: "timed out after ..." / "interrupted"
    stopped_at: float | None = None
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
        self.running: dict[int, TrialRun] = {}
        self.slot_of: dict[int, int] = {}  # trial number -> slot (this call's trials)
        self.timeline: list[tuple[int, int, float, float, str]] = []  # slot, trial, start, end, state
        self.errors: dict[int, str] = {}  # trial number -> the root cause, one line
        self.wake = threading.Event()
        self.interrupted = False
        self.view = SweepView(self) if show else None
        self.dispatch_s: list[float] = []  # trial finished (seen) -> next trial sent on that slot

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        optuna = _optuna()
        name = self.objective
        self._close_stale(optuna)
        self.cluster.call("tune_enter", self.per_trial, timeout=120)
        try:
            self._loop(optuna, name)
        finally:
            notes = self._leave()
            if self.view is not None:
                self.view.update(final=True)
            self._say_end(notes)

    def _loop(self, optuna: Any, name: str) -> None:
        last_free: dict[int, float] = {}
        while True:
            try:
                while not self.interrupted and self.free and self._budget_left() > len(self.running):
                    slot = self.free.pop(0)
                    self._start(slot, name)
                    if slot in last_free:
                        self.dispatch_s.append(time.perf_counter() - last_free.pop(slot))
                if not self.running:
                    return
                self.wake.wait(0.25)
                self.wake.clear()
                for slot, tr in list(self.running.items()):
                    self._pump(tr)
                    self._watch(tr)
                    if tr.view.ready():
                        self._finish(optuna, tr)
                        del self.running[slot]
                        if self._slot_usable(tr):
                            self.free.append(slot)
                            last_free[slot] = time.perf_counter()
                if self.view is not None:
                    self.view.update()
            except KeyboardInterrupt:
                if self.interrupted:  # a second Ctrl-C: stop waiting for the trials
                    self._kill_running(optuna)
                    return
                self.interrupted = True
                self._stop_all("interrupted")

    def _budget_left(self) -> int:
        return self.trials - sum(1 for t in self.study.get_trials(deepcopy=False) if _counts(t))

    def _close_stale(self, optuna: Any) -> None:
        """Trials a previous kernel left RUNNING (it died or was interrupted hard) count as failed."""
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            self.study._storage.set_trial_user_attr(t._trial_id, "jdist_error", "interrupted (the sweep stopped)")
            self.study._storage.set_trial_user_attr(t._trial_id, "jdist_interrupted", True)
            self.study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)

    def _start(self, slot: int, name: str) -> None:
        trial = self.study.ask()
        ranks = self.slots[slot]
        trial.set_user_attr("jdist_slot", slot)
        trial.set_user_attr("jdist_ranks", ranks)
        code = f"__import__('jdist.rank.tune').rank.tune.run_trial({trial.number}, {name!r})"
        inbox = _Wake(self.wake)
        records = RecordCollector(self.cluster, f"jdist.tune {self.study.study_name}: trial {trial.number}",
                                  lambda run: [_TrialLog(self.folder / "trials")], ranks=ranks)
        view = IppCellView(self.cluster.execute(code, ranks), ranks)
        for child in view._children:
            child.add_done_callback(lambda _f: self.wake.set())
        view.attach(inbox)
        self.running[slot] = TrialRun(slot, ranks, trial, view, inbox, records)
        self.slot_of[trial.number] = slot

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
            elif op == "should_prune":
                tr.pruned = tr.pruned or trial.should_prune()
                reply["value"] = tr.pruned
            elif op == "report":
                trial.report(payload["value"], payload["step"])
                return
            elif op == "user_attr":
                trial.set_user_attr(payload["key"], payload["value"])
                return
            elif op == "result":
                tr.result, tr.has_result = payload["value"], True
                return
        except Exception as exc:  # a bad suggestion (e.g. low > high): the rank raises it in the objective
            reply.pop("value", None)
            reply["error"] = f"{type(exc).__name__}: {exc}"
        self.cluster.client._send_control_request(targets=[self.cluster.engine_ids([rank])[0]],
                                                  msg_type=REPLY_TYPE, content=reply, block=False)

    def _watch(self, tr: TrialRun) -> None:
        now = time.time()
        if tr.stopped is None:
            if tr.view.failed_while_others_run():  # the others wait for the failed rank in a collective
                tr.stopped, tr.stopped_at = "released", now
                self.cluster.interrupt(tr.view.running())
            elif self.trial_timeout is not None and now - tr.started > self.trial_timeout:
                tr.stopped, tr.stopped_at = f"timed out after {self.trial_timeout:g} s", now
                tr.output.extend(self._where(tr))
                self.cluster.interrupt(tr.view.running())
        elif tr.stopped_at is not None and now - tr.stopped_at > GRACE_S and not tr.view.ready():
            raise RuntimeError(f"jdist.tune: trial {tr.trial.number} on ranks {tr.ranks} did not stop within "
                               f"{GRACE_S:g} s of being {tr.stopped}; run %dist restart, then "
                               "jdist.tune(..., resume=True).")

    def _where(self, tr: TrialRun) -> list[str]:
        from jdist.stacks import summary

        try:
            stacks = self.cluster.stacks(tr.view.running())
        except Exception:
            return []
        return [f"rank {r}: {summary(frames)}" for r, frames in sorted(stacks.items()) if frames]

    def _stop_all(self, why: str) -> None:
        now = time.time()
        for tr in self.running.values():
            if tr.stopped is None:
                tr.stopped, tr.stopped_at = why, now
                self.cluster.interrupt(tr.view.running())

    def _kill_running(self, optuna: Any) -> None:
        for tr in self.running.values():
            tr.stopped = "interrupted"
            self._tell(optuna, tr, optuna.trial.TrialState.FAIL, error="interrupted (the sweep stopped)")
        self.running.clear()

    def _finish(self, optuna: Any, tr: TrialRun) -> None:
        try:
            tr.view.wait_for_output(1.0)
        except Exception:
            pass
        self._pump(tr)
        failures = tr.view.failures()
        states = optuna.trial.TrialState
        if not failures and tr.pruned:
            self._tell(optuna, tr, states.PRUNED)
        elif not failures and tr.has_result and tr.result is not None:
            self._tell(optuna, tr, states.COMPLETE, tr.result)
        elif not failures:
            self._tell(optuna, tr, states.FAIL, error="the objective returned None")
        else:
            root = min(failures.values(), key=lambda f: (f.completed or float("inf"), f.rank))
            if root.ename == "TrialPruned":
                self._tell(optuna, tr, states.PRUNED)
            else:
                why = tr.stopped if tr.stopped and tr.stopped != "released" else None
                error = why or f"rank {root.rank}: {root.ename}: {root.evalue}"
                self._tell(optuna, tr, states.FAIL, error=error, failure=root)
            if tr.stopped != "interrupted" or not self.interrupted:
                self._repair(tr)
        tr.records.finish("finished" if not failures else "failed", None if not failures else self.errors.get(tr.trial.number))

    def _tell(self, optuna: Any, tr: TrialRun, state: Any, value: Any = None, error: str | None = None,
              failure: RankFailure | None = None) -> None:
        trial = tr.trial
        if error is not None:
            self.errors[trial.number] = error
            trial.set_user_attr("jdist_error", error)
            if failure is not None and failure.traceback:
                trial.set_user_attr("jdist_traceback", "\n".join(_plain(line) for line in failure.traceback))
            if tr.output:
                trial.set_user_attr("jdist_output", "\n".join(tr.output))
            if tr.stopped == "interrupted":
                trial.set_user_attr("jdist_interrupted", True)
        if tr.records.run is not None:
            trial.set_user_attr("jdist_run", str(tr.records.run.path or ""))
        self.study.tell(trial, value, state=state)
        self.timeline.append((tr.slot, trial.number, tr.started, time.time(), state.name))

    def _repair(self, tr: TrialRun) -> None:
        try:
            self.cluster.call("tune_repair", ranks=tr.ranks, timeout=60)
        except Exception as exc:
            tr.stopped = tr.stopped or "lost"
            print(f"jdist.tune: slot {tr.slot} (ranks {tr.ranks}) could not be repaired ({exc}); "
                  "it takes no more trials.")
            setattr(tr, "_lost", True)

    def _slot_usable(self, tr: TrialRun) -> bool:
        return not getattr(tr, "_lost", False)

    def _leave(self) -> list[str]:
        try:
            answers = self.cluster.call("tune_leave", timeout=120)
        except Exception as exc:
            return [f"The world process group could not be formed again after the sweep ({exc}); run %dist restart."]
        first = answers[0] if answers else {}
        return [line for line in (first.get("kept"), first.get("lost")) if line]

    def _say_end(self, notes: list[str]) -> None:
        states = collections.Counter(t.state.name for t in self.study.get_trials(deepcopy=False))
        parts = [f"{states.get(k, 0)} {k.lower()}" for k in ("COMPLETE", "PRUNED", "FAIL") if states.get(k)]
        head = "Sweep interrupted" if self.interrupted else "Sweep done"
        line = f"{head}: {self.study.study_name}, {', '.join(parts) or 'no trials'}"
        try:
            best = self.study.best_trial
            line += f"; best trial {best.number}: {best.value:.6g} {best.params}"
        except ValueError:
            pass
        print(line + f". Journal: {self.folder / 'journal.log'}")
        if self.interrupted:
            print("Every finished trial is kept; go on with jdist.tune(..., resume=True).")
        for note in notes:
            print(note)

    # -- results ---------------------------------------------------------------------------------
    def dataframe(self) -> Any:
        df = self.study.trials_dataframe()
        renames = {f"user_attrs_jdist_{k}": k for k in ("slot", "ranks", "error", "run")}
        df = df.rename(columns=renames)
        drop = [c for c in df.columns if c.startswith("user_attrs_jdist_")]
        return df.drop(columns=drop)


def _counts(trial: Any) -> bool:
    """Whether a trial counts towards the sweep's budget: finished, and not stopped by an interrupt."""
    name = trial.state.name
    return name in ("COMPLETE", "PRUNED") or (name == "FAIL" and not trial.user_attrs.get("jdist_interrupted"))


def _plain(line: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", line)


class _TrialLog:
    """A trial's run folder under the sweep's ``trials/`` (not in the notebook's run list)."""

    def __init__(self, root: Path):
        from .sinks import RunLogSink

        self.sink = RunLogSink(str(root))

    def start(self, run: Any) -> None:
        self.sink.start(run)

    def add(self, records: Any) -> None:
        self.sink.add(records)

    def tick(self) -> None:
        pass

    def finish(self, run: Any) -> None:
        self.sink.finish(run)


class SweepView:
    """The sweep in the notebook: progress, best so far and the trials table, redrawn at most
    twice a second in one display (its last state stays in the saved notebook)."""

    def __init__(self, sweep: Sweep, every_s: float = 0.5):
        self.sweep = sweep
        self.every_s = every_s
        self.last = 0.0
        self.handle: Any = None

    def update(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < self.every_s:
            return
        self.last = now
        from IPython.display import HTML, display

        out = HTML(self.html())
        if self.handle is None:
            self.handle = display(out, display_id=True)
        else:
            self.handle.update(out)

    def rows(self) -> list[dict[str, Any]]:
        sw = self.sweep
        running = {tr.trial.number: tr for tr in sw.running.values()}
        rows = []
        for t in sw.study.get_trials(deepcopy=False):
            tr = running.get(t.number)
            state = "RUNNING" if tr is not None else t.state.name
            end = t.datetime_complete.timestamp() if t.datetime_complete else time.time()
            start = t.datetime_start.timestamp() if t.datetime_start else end
            last = max(t.intermediate_values) if t.intermediate_values else None
            rows.append({"trial": t.number, "state": state, "slot": t.user_attrs.get("jdist_slot"),
                         "params": t.params, "value": t.value,
                         "last": t.intermediate_values[last] if last is not None else None, "step": last,
                         "seconds": end - start, "error": t.user_attrs.get("jdist_error")})
        return rows

    def html(self) -> str:
        sw = self.sweep
        rows = self.rows()
        counts = collections.Counter(r["state"] for r in rows)
        head = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        try:
            best = sw.study.best_trial
            best_line = f"best trial {best.number}: <b>{best.value:.6g}</b> {html.escape(str(best.params))}"
        except ValueError:
            best_line = "no trial completed yet"
        cells = []
        for r in sorted(rows, key=lambda r: (r["state"] != "RUNNING", -r["trial"]))[:40]:
            value = f"{r['value']:.6g}" if isinstance(r["value"], float) else ""
            last = f"{r['last']:.4g} @ {r['step']}" if r["last"] is not None else ""
            note = html.escape(r["error"] or "")
            cells.append(f"<tr><td>{r['trial']}</td><td>{r['state'].lower()}</td><td>{r['slot']}</td>"
                         f"<td>{html.escape(_fmt_params(r['params']))}</td><td>{value}</td><td>{last}</td>"
                         f"<td>{r['seconds']:.1f}</td><td>{note}</td></tr>")
        return (f"<div class='jdist-sweep'><b>jdist.tune {html.escape(sw.study.study_name)}</b>: "
                f"{len(sw.slots)} slot(s) of {sw.per_trial} rank(s), {head or 'starting'}; {best_line}"
                "<table><tr><th>trial</th><th>state</th><th>slot</th><th>params</th><th>value</th>"
                f"<th>last reported</th><th>s</th><th>error</th></tr>{''.join(cells)}</table></div>")


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def sweep_folders() -> list[Path]:
    """The sweeps under :func:`sweeps_dir`, newest first."""
    root = sweeps_dir()
    if not root.exists():
        return []
    return sorted((p for p in root.iterdir() if (p / "journal.log").exists()), key=lambda p: p.stat().st_mtime,
                  reverse=True)


