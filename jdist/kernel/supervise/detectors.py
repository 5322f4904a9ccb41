"""Fault detectors: small objects the supervisor polls while a cell runs.

Each :class:`Detector` looks at the running cell on every poll and may return an action:
:class:`Stop` (a rank process died: end the cell now), :class:`Release` (stop the ranks
still running: after a failure elsewhere, or a hang), :class:`EndGrace` (the ranks still running
after a release cannot stop: stop waiting for them) or :class:`ReleaseAgain` (during the grace, ranks
left waiting in a collective that the stopped ones will not join). The user's interrupt is not a
detector: it arrives as KeyboardInterrupt in the kernel and the supervisor forwards it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from jdist.common.stacks import Collective, Sample, blocked, describe
from jdist.plugins import backend_spec

from ..launch import RankDeath

if TYPE_CHECKING:
    from .supervisor import CellSupervisor

#: After a rank failed, how long the others may go on before they are released.
RELEASE_GRACE_S = 0.25
#: A rank whose engine died (ipyparallel's ``EngineError``: its nanny told the controller) is a death, which the
#: launcher reports with its cause: this long for that report before the failure is taken as a rank's error
#: (under load the nanny's word came first, and the other rank was released as after an exception).
DEATH_REPORT_S = 10.0
#: Every this many seconds of a grace (after an interrupt, a release or a sweep's stop), ranks still waiting in a
#: collective while others of theirs have stopped are released again (:class:`LeftInCollective`).
RERELEASE_S = 2.0
#: How long the hang watchdog waits for the ranks' samples (answered in milliseconds; a rank
#: that holds the GIL for longer is busy, not blocked in a collective, which releases it).
SAMPLE_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class Stop:
    death: RankDeath


@dataclass(frozen=True)
class Release:
    reason: str  # "failure", "hang" or "alone" (a hang proven at once: see AloneInCollective)
    hang: dict[int, str] | None = None  # rank -> the collective it waits in
    #: rank -> its newest collective on each of its groups (c10d's Flight Recorder), for a hang: every rank of the
    #: cell's, also those that finished it
    collectives: dict[int, tuple[Collective, ...]] | None = None


@dataclass(frozen=True)
class EndGrace:
    """No rank still running can stop: end the wait for them now (they are named as not stopping)."""


@dataclass(frozen=True)
class ReleaseAgain:
    """Release these ranks again: they wait in a collective that ranks which stopped will not join."""
    ranks: list[int]


Action = Stop | Release | EndGrace | ReleaseAgain


class Detector(Protocol):
    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        """``now``: ``time.monotonic()``. Returns an action, or None."""


class DeathDetector:
    """A rank process ended (the launcher knows): end the cell at once, naming the rank and cause."""

    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        dead = sup.cluster.dead_ranks()
        return Stop(sup.cluster.death_report(dead)) if dead else None


class PartialFailureDetector:
    """Some ranks failed while others still run: those would wait for them in the next
    collective, so they are released after ``grace`` seconds."""

    def __init__(self, grace: float = RELEASE_GRACE_S):
        self.grace = grace
        self.failed_at: float | None = None
        self.wait = grace

    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        if sup.releasing:
            return None
        if self.failed_at is None and sup.view.failed_while_others_run():
            self.failed_at = now
            engines_died = all(name == "EngineError" for name in sup.view.early_failures())
            self.wait = DEATH_REPORT_S if engines_died else self.grace  # DeathDetector stops the cell meanwhile
        if self.failed_at is not None and now - self.failed_at >= self.wait:
            return Release("failure")
        return None


class HangWatchdog:
    """A hang (``--watchdog``; 0: off): no progress (output, records, a rank finishing) for
    ``period`` seconds, and every running rank proven blocked in a collective.

    The proof compares two samples of each rank (:class:`jdist.common.stacks.Sample`) half a period
    apart: the rank sat in the same collective all along, started no other, and used almost
    no CPU (:func:`jdist.common.stacks.blocked`). A rank merely found inside a collective or a DDP
    backward, as healthy training is most of the time, is never enough. Sampling starts once
    the cell has been quiet for half the period and goes on every ``spacing`` seconds while it
    stays quiet, so a hang is reported within ``period`` of its start (``period/2 + spacing``
    when it starts late in a long quiet stretch). ``sup``: what is watched, a cell's supervisor or a sweep's
    trial (:class:`jdist.kernel.tune.TrialRun`): anything with ``releasing``, ``last_progress``, ``view``
    (the ranks still running) and ``cluster``.
    """

    def __init__(self, period: float):
        self.period = period
        self.spacing = min(1.0, period / 4)
        self.history: list[tuple[float, dict[int, Sample]]] = []  # (taken at, samples), oldest first
        self.quiet_since: float | None = None  # sup.last_progress while the history was taken
        self.samples_taken = 0

    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        if sup.releasing or not self.period:
            return None
        if self.quiet_since != sup.last_progress:  # progress: earlier samples prove nothing now
            self.history, self.quiet_since = [], sup.last_progress
        quiet = now - sup.last_progress
        if quiet < self.period / 2 or (self.history and now - self.history[-1][0] < self.spacing):
            return None
        running = sup.view.running()
        if not running:
            return None
        samples = sup.cluster.samples(running, timeout=SAMPLE_TIMEOUT_S)
        self.samples_taken += 1
        self.history.append((now, samples))
        older = [i for i, (t, _) in enumerate(self.history) if now - t >= self.period / 2 - self.spacing / 2]
        if not older:
            return None
        del self.history[:older[-1]]  # keep the newest sample old enough to compare with, and later ones
        if quiet < self.period:
            return None
        base = self.history[0][1]
        spec = backend_spec(sup.cluster.config.backend)
        waiting = {r: blocked(base.get(r), s, spec.backward_waits, spec.collective_paths, spec.spins)
                   for r, s in samples.items()}
        if not all(waiting.values()):
            return None
        finished = [r for r in getattr(sup, "ranks", ()) if r not in samples]  # (their newest collectives too)
        others = sup.cluster.samples(finished, timeout=SAMPLE_TIMEOUT_S) if finished else {}
        collectives = {r: s.collectives for r, s in {**samples, **others}.items() if s.collectives}
        return Release("hang", {r: w for r, w in waiting.items() if w}, collectives or None)


class UnreleasableWait:
    """After a release or an interrupt, on a backend whose collectives cannot be released
    (:attr:`jdist.plugins.BackendSpec.releases` False: Horovod's run over MPI): once every rank still
    running is seen waiting in one of its collectives, it will not stop, and waiting out
    ``--interrupt-grace`` would only delay its restart. Looks every ``every`` seconds."""

    def __init__(self, every: float = 0.25):
        self.every = every
        self.last = 0.0

    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        spec = backend_spec(sup.cluster.config.backend)
        if not sup.releasing or spec.releases or not spec.collective_paths or now - self.last < self.every:
            return None
        self.last = now
        running = sup.view.running()
        if not running:
            return None
        stacks = sup.cluster.samples(running, timeout=SAMPLE_TIMEOUT_S)
        waiting = [describe(stacks[r].frames, spec.backward_waits, spec.collective_paths) if r in stacks else None
                   for r in running]
        return EndGrace() if all(waiting) else None


class LeftInCollective:
    """During a grace (``sup.releasing``), every ``every`` seconds: where some of ``sup.ranks`` have stopped,
    the ranks still waiting in a collective are to be released again (:class:`ReleaseAgain`).

    The first release found them outside any collective (they handled the interrupt, or it came just before
    they entered one), and the stopped ranks will not join the one they wait in now. Seen under load: a rank of
    a DeepSpeed ZeRO-3 cell went on into an all-gather after the interrupt, and a trial's rank waited out its
    grace in ``all_reduce``; once, at a single look 2 s in, no rank had stopped yet, so one look is not
    enough. ``sup``: a cell's supervisor or a sweep's trial (``releasing``, ``ranks``, ``view``, ``cluster``)."""

    def __init__(self, every: float = RERELEASE_S):
        self.every = every
        self.next: float | None = None  # the next look (None: no grace yet)

    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        if not sup.releasing:
            self.next = None
            return None
        if self.next is None:
            self.next = now + self.every
        if now < self.next:
            return None
        self.next = now + self.every
        running = sup.view.running()
        spec = backend_spec(sup.cluster.config.backend)
        if not running or len(running) == len(sup.ranks) or not spec.releases:  # (TF: its waits cannot be released)
            return None
        samples = sup.cluster.samples(running, timeout=SAMPLE_TIMEOUT_S)
        waiting = [r for r in running
                   if r in samples and describe(samples[r].frames, spec.backward_waits, spec.collective_paths)]
        return ReleaseAgain(waiting) if waiting else None


class AloneInCollective:
    """A collective that ranks which finished the cell will not join (``if rank == 0: dist.barrier()``): a hang proven
    without waiting for ``--watchdog``, so the cell ends within about ``after`` + ``every`` seconds.

    Once some ranks have finished their part (none failed) while others still run, for ``after`` seconds, every
    ``every`` seconds: a running rank waiting in a collective (its stack) whose newest collective on a group (c10d's
    Flight Recorder) has not completed, where every finished rank of that group started fewer collectives on it
    (their newest sequence number is lower), waits for ranks that cannot call it any more. Without the Flight
    Recorder's word for both sides (a backend or torch without it), it says nothing and the watchdog still does.
    ``sup``: a cell's supervisor (``releasing``, ``ranks``, ``view``, ``cluster``)."""

    def __init__(self, after: float = 1.0, every: float = 0.5):
        self.after, self.every = after, every
        self.since: float | None = None  # when some ranks were first seen finished while others run
        self.last = 0.0
        self.finished: dict[int, Sample] = {}  # the finished ranks' samples (they no longer change)

    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        spec = backend_spec(sup.cluster.config.backend)
        if sup.releasing or not spec.releases:
            return None
        running = sup.view.running()
        ranks = list(getattr(sup, "ranks", ()))
        finished = [r for r in ranks if r not in running]
        if not running or not finished or sup.view.early_failures():
            self.since = None
            return None
        if self.since is None:
            self.since = now
        if now - self.since < self.after or now - self.last < self.every:
            return None
        self.last = now
        wanted = [r for r in finished if r not in self.finished]
        if wanted:
            self.finished.update(sup.cluster.samples(wanted, timeout=SAMPLE_TIMEOUT_S))
        samples = sup.cluster.samples(running, timeout=SAMPLE_TIMEOUT_S)
        alone: dict[int, str] = {}
        for rank, sample in samples.items():
            waiting = describe(sample.frames, spec.backward_waits, spec.collective_paths)
            if waiting and any(self._left(c, rank, finished) for c in sample.collectives):
                alone[rank] = waiting
        if not alone:
            return None
        collectives = {r: s.collectives for r, s in {**self.finished, **samples}.items() if s.collectives}
        return Release("alone", alone, collectives or None)

    def _left(self, c: Collective, rank: int, finished: list[int]) -> bool:
        """Whether ``rank``'s collective ``c`` waits for finished ranks that never started it."""
        if c.done or rank not in c.group:
            return False
        gone = [r for r in finished if r in c.group]
        if not gone:
            return False
        for r in gone:  # (the recorder is on for every rank alike: a rank with no entry on the group started none on it)
            sample = self.finished.get(r)
            if sample is None or sample.progress is None:
                return False  # (its guard did not answer: the watchdog decides)
            theirs = [o.seq for o in sample.collectives if o.group == c.group]
            if theirs and max(theirs) >= c.seq:
                return False
        return True


def default_detectors(watchdog: float) -> list[Detector]:
    return [DeathDetector(), PartialFailureDetector(), HangWatchdog(watchdog), AloneInCollective(), UnreleasableWait(),
            LeftInCollective()]
