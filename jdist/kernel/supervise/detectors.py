"""Fault detectors: small objects the supervisor polls while a cell runs.

Each :class:`Detector` looks at the running cell on every poll and may return an action:
:class:`Stop` (a rank process died: end the cell now) or :class:`Release` (stop the ranks
still running: after a failure elsewhere, or a hang). The user's interrupt is not a
detector: it arrives as KeyboardInterrupt in the kernel and the supervisor forwards it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from jdist.plugins import backend_spec
from jdist.stacks import describe

from ..launch import RankDeath

if TYPE_CHECKING:
    from .supervisor import CellSupervisor

#: After a rank failed, how long the others may go on before they are released.
RELEASE_GRACE_S = 0.25


@dataclass(frozen=True)
class Stop:
    death: RankDeath


@dataclass(frozen=True)
class Release:
    reason: str  # "failure" or "hang"
    hang: dict[int, str] | None = None  # rank -> the collective it waits in


Action = Stop | Release


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

    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        if sup.releasing:
            return None
        if self.failed_at is None and sup.view.failed_while_others_run():
            self.failed_at = now
        if self.failed_at is not None and now - self.failed_at >= self.grace:
            return Release("failure")
        return None


class HangWatchdog:
    """No progress (output, records, a rank finishing) for ``period`` seconds and every running
    rank's stack waits in a collective: a hang (``--watchdog``; 0: off)."""

    def __init__(self, period: float):
        self.period = period

    def poll(self, now: float, sup: CellSupervisor) -> Action | None:
        if sup.releasing or not self.period or now - sup.last_progress < self.period:
            return None
        sup.last_progress = now  # sample again one period later
        running = sup.view.running()
        if not running:
            return None
        spec = backend_spec(sup.cluster.config.backend)
        waiting = {r: describe(frames, spec.backward_waits, spec.collective_paths)
                   for r, frames in sup.cluster.stacks(running).items()}
        if not all(waiting.values()):
            return None
        return Release("hang", {r: w for r, w in waiting.items() if w})


def default_detectors(watchdog: float) -> list[Detector]:
    return [DeathDetector(), PartialFailureDetector(), HangWatchdog(watchdog)]
