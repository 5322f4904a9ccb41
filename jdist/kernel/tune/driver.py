"""A sweep's loop: every free slot gets the next trial, each trial watched (failures, ``trial_timeout``, the
hang watchdog), told to Optuna once its last messages are in, and the end that gives the world group back
or restarts the ranks (see :mod:`jdist.kernel.tune`)."""

from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jdist.common.stacks import waiting_phrase
from jdist.errors import ClusterError, OneLineError, RankFailure, first_failure, remote_errors, strip_ansi
from jdist.protocol import TUNE_REPLY, RankCall

from ..sinks import RunLogSink
from ..supervise.collect import RecordCollector
from ..supervise.detectors import HangWatchdog, LeftInCollective, Release, ReleaseAgain
from ..supervise.sigint import SigintCount
from ..supervise.view import IppCellView
from .requests import answer, as_request
from .view import SweepView

TUNE_INSTALL_HINT = "jdist.tune needs Optuna: pip install 'jdist[tune]' (or pip install optuna)."


#: Failed trials listed under the sweep's last line (all of them: ``jdist.last_sweep()``).
FAILED_SHOWN = 5


#: Trials are queued ahead on each slot while the median trial takes less than this (seconds).
PREFETCH_BELOW_S = 10.0


#: Seconds the other ranks of a trial get to raise TrialPruned after one did (SPMD code prunes on every rank)
#: before they are released from the collective they may wait in.
PRUNED_WAIT_S = 5.0


class RankLost(RuntimeError):
    """A rank died during a sweep: the sweep stopped (the message says how to go on)."""


class SweepStopped(OneLineError):
    """A trial's ranks did not stop when told to: the ranks were restarted and the sweep stopped (one line)."""


def optuna_module() -> Any:
    try:
        import optuna
    except ImportError:
        raise ImportError(TUNE_INSTALL_HINT) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # jdist's view says what each trial did
    return optuna


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
    #: The hang watchdog of a cell (--watchdog), on this trial's ranks: what it reads (below) is the trial's.
    watchdog: HangWatchdog | None = None
    #: Once stopped, its ranks still waiting in a collective that stopped ranks will not join get the stop again.
    left: LeftInCollective = field(default_factory=LeftInCollective)
    cluster: Any = None
    last_progress: float = field(default_factory=time.monotonic)  # a message of the trial, or a rank ending it
    done_count: int = 0

    @property
    def releasing(self) -> bool:
        """The sweep stopped it (the watchdog looks no more)."""
        return self.stopped is not None


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
        self.asked: list[Any] = []  # every trial this sweep asked of the study (:meth:`_fail_unfinished`)
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
        self.space = optuna_module().search_space.IntersectionSearchSpace()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        optuna = optuna_module()
        name = self.objective
        self._close_stale(optuna)
        self.t0 = t0 = time.perf_counter()
        # every rank forms its slot while the first trials travel: they wait behind it in the engines' queues
        self.entering = self.cluster.apply_async(RankCall("tune_enter"), self.per_trial)
        self.entering.add_done_callback(lambda _: self.wake.set())
        try:
            with SigintCount() as sigints:  # a Ctrl-C that Python drops in a destructor is raised again
                self._loop(optuna, name, sigints)
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
            lambda: self._fail_unfinished(optuna),
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

    def _fail_unfinished(self, optuna: Any) -> None:
        """Every trial this sweep asked and did not finish is FAIL, interrupted: a Ctrl-C that landed between the
        study's ask and the trial's start left it RUNNING (seen once in two interrupted sweeps)."""
        running = {t.number for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
        for trial in self.asked:
            if trial.number in running:
                self.errors[trial.number] = "interrupted (the sweep stopped) before it started"
                trial.set_user_attr("jdist_error", self.errors[trial.number])
                trial.set_user_attr("jdist_interrupted", True)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)

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

    def _loop(self, optuna: Any, name: str, sigints: SigintCount) -> None:
        while True:
            try:
                sigints.check()
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
                sigints.handled()
                if not self.interrupted:
                    self.interrupted = True
                    try:
                        self._stop_all("interrupted")
                        continue
                    except KeyboardInterrupt:  # the second Ctrl-C came while the stops were sent
                        sigints.handled()
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
        self.asked.append(trial)
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
        period = self.cluster.config.watchdog
        return TrialRun(slot, ranks, trial, view, inbox, records, cluster=self.cluster,
                        watchdog=HangWatchdog(period) if period else None)

    def _pump(self, tr: TrialRun) -> None:
        while True:
            try:
                rank, kind, content = tr.inbox.q.get_nowait()
            except queue.Empty:
                return
            if not (kind == "data" and content.get("kind") == "host"):  # (a host's load says nothing of the trial)
                tr.last_progress = time.monotonic()
            if kind == "data":
                if content.get("kind") == "tune":
                    answer(self.cluster, tr, rank, content)
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
            elif (hang := self._hung(tr)) is not None:
                tr.where = [f"rank {r} {waiting_phrase(w)}" for r, w in sorted(hang.items())]
                period = self.cluster.config.watchdog
                self._stop(tr, f"hung: no progress for {period:g} s and every rank of its slot waits in a "
                               "collective (--watchdog)")
        elif tr.stopped_at is not None and now - tr.stopped_at > self.grace_s and not tr.view.ready():
            tr.where = self._where(tr)  # where its ranks are now (a timed-out trial's error had where they were)
            why = "a rank failed" if tr.stopped == "released" else tr.stopped
            self.stuck.append(f"{self._describe(tr)} did not stop within {self.grace_s:g} s (--interrupt-grace) "
                              f"of being stopped ({why})")
        elif isinstance(again := tr.left.poll(time.monotonic(), tr), ReleaseAgain):
            self._send_stop(tr, again.ranks)

    def _hung(self, tr: TrialRun) -> dict[int, str] | None:
        """The cells' hang watchdog on this trial (:class:`~jdist.kernel.supervise.detectors.HangWatchdog`: no
        progress for ``--watchdog`` s and every running rank of the slot proven blocked in a collective):
        rank -> the collective it waits in, or None."""
        if tr.watchdog is None or tr.started is None:
            return None
        done = tr.view.done_count()
        if done != tr.done_count:
            tr.done_count, tr.last_progress = done, time.monotonic()
        action = tr.watchdog.poll(time.monotonic(), tr)
        return action.hang if isinstance(action, Release) else None

    def _stop(self, tr: TrialRun, why: str) -> None:
        """Stop ``tr`` on its ranks (KeyboardInterrupt in the objective; a blocked collective is released):
        a message for this trial on each rank's control channel, not a signal to the process, which could
        reach the trial queued behind it (:func:`jdist.rank.tune.stop_trial`)."""
        tr.stopped, tr.stopped_at = why, time.time()
        self._send_stop(tr, tr.view.running())

    def _send_stop(self, tr: TrialRun, ranks: list[int]) -> None:
        for rank in ranks:
            self.cluster.reply(rank, TUNE_REPLY, {"trial": tr.trial.number, "stop": tr.stopped})

    def _where(self, tr: TrialRun) -> list[str]:
        where = self._where_ranks(tr.view.running())
        return [where[r] for r in sorted(where)]

    def _where_ranks(self, ranks: list[int]) -> dict[int, str]:
        """What each of ``ranks`` does: "rank 3 running cell line 7" (:func:`jdist.common.stacks.summary`); ranks
        that gave no stack within 2 s are left out, and so is everything after a Ctrl-C."""
        from jdist.common.stacks import summary

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
        from ..journal import JournalWriteError

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
        from .. import recovery

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


def _counts(trial: Any) -> bool:
    """Whether a trial counts towards the sweep's budget: finished, and not stopped by an interrupt."""
    name = trial.state.name
    return name in ("COMPLETE", "PRUNED") or (name == "FAIL" and not trial.user_attrs.get("jdist_interrupted"))
