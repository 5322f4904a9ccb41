"""What happened to a cell, decided from what was observed: a pure function, unit-tested alone.

The supervisor records :class:`Observations` (which ranks failed and how, whether the user
interrupted, which ranks jdist released, a hang, a death); :func:`classify` turns them into
an :class:`Outcome`: the cell's status and the failures worth reporting. The subtle rules
live here:

* a rank released by jdist (after another rank failed, or after a hang) fails with
  KeyboardInterrupt or a broken connection: that is a consequence, not the origin;
* a user's interrupt is an interrupt, not a failure, even though every rank raised
  (KeyboardInterrupt); a real error that a rank raised before is still reported;
* ranks that all raised KeyboardInterrupt on their own (no release) were interrupted;
* a hang with no other failure is a hang (its released ranks are not failures);
* a death (a rank process ended) outranks everything but a user's interrupt;
* a rank that raised ``SystemExit`` (``sys.exit``, ``exit()``, argparse) exited: with code 0 it
  finished (the outcome lists it in ``exited``), with another code it failed with that code;
* a rank that raised pdb's ``BdbQuit`` was stopped by the user (``q`` at a ``breakpoint()``): the cell
  was interrupted there, not failed (the outcome lists it in ``quit``).

Example:
    >>> from jdist.errors import RankFailure
    >>> obs = Observations(ranks=[0, 1], failures={1: RankFailure(1, "ValueError", "bad"),
    ...                    0: RankFailure(0, "KeyboardInterrupt", "")}, released=[0])
    >>> out = classify(obs)
    >>> out.status, sorted(out.failed), out.first_failed, out.error
    (<CellStatus.FAILED: 'failed'>, [1], 1, 'rank 1: ValueError: bad')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from jdist.common.stacks import Collective
from jdist.errors import RankFailure, first_failure

from ..launch import RankDeath


class CellStatus(str, Enum):
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    HUNG = "hung"
    DIED = "died"

    @property
    def run_status(self) -> str:
        """The status of the cell's run (run log, dashboard, sidebar): finished, failed or interrupted."""
        return {"hung": "failed", "died": "failed"}.get(self.value, self.value)


@dataclass
class Observations:
    """What the supervisor saw while a cell ran on ``ranks``."""

    ranks: list[int]
    failures: dict[int, RankFailure] = field(default_factory=dict)  # every rank whose part raised
    interrupted: bool = False  # the user interrupted the kernel
    released: list[int] = field(default_factory=list)  # ranks jdist stopped (a failure elsewhere, a hang)
    hang: dict[int, str] | None = None  # rank -> the collective it waited in
    collectives: dict[int, tuple[Collective, ...]] | None = None  # rank -> its newest collectives (a hang's)
    alone: bool = False  # the hang: a collective that ranks which finished the cell never started (no watchdog)
    death: RankDeath | None = None  # the first rank process that ended
    stuck: list[int] = field(default_factory=list)  # ranks that did not stop after an interrupt/release
    cut_short: bool = False  # a second interrupt ended the wait for them before --interrupt-grace


@dataclass(frozen=True)
class Outcome:
    status: CellStatus
    failed: dict[int, RankFailure]  # the failures to report: the origin, without consequences
    first_failed: int | None  # the failure that completed first
    error: str | None  # one line for the run log and the dashboard
    exited: dict[int, int] = field(default_factory=dict)  # rank -> exit code, for ranks that raised SystemExit
    quit: list[int] = field(default_factory=list)  # ranks where the user quit pdb (q at a breakpoint())

    @property
    def interrupted(self) -> bool:
        return self.status is CellStatus.INTERRUPTED


def classify(obs: Observations) -> Outcome:
    """The outcome of a cell (see the module doc for the rules).

    >>> classify(Observations(ranks=[0, 1])).status
    <CellStatus.FINISHED: 'finished'>
    >>> out = classify(Observations(ranks=[0, 1], failures={r: RankFailure(r, "SystemExit", "0") for r in (0, 1)}))
    >>> out.status, out.exited
    (<CellStatus.FINISHED: 'finished'>, {0: 0, 1: 0})
    >>> classify(Observations(ranks=[0, 1], interrupted=True, failures={
    ...     r: RankFailure(r, "KeyboardInterrupt", "") for r in (0, 1)})).status
    <CellStatus.INTERRUPTED: 'interrupted'>
    >>> out = classify(Observations(ranks=[0, 1], released=[0], failures={
    ...     1: RankFailure(1, "BdbQuit", "", completed=1.0), 0: RankFailure(0, "KeyboardInterrupt", "")}))
    >>> out.status, out.quit, out.failed
    (<CellStatus.INTERRUPTED: 'interrupted'>, [1], {})
    """
    exited = {r: code for r, e in obs.failures.items() if (code := e.exit_code) is not None}
    failed = {r: e for r, e in obs.failures.items() if e.exit_code != 0}
    released = {r for r in obs.released if r in failed}
    origin = {r: e for r, e in failed.items() if r not in released}
    quit = sorted(r for r, e in failed.items() if e.ename == "BdbQuit")
    user_interrupt = obs.interrupted or bool(quit) or (
        bool(failed) and not obs.released and all(e.ename == "KeyboardInterrupt" for e in failed.values())
    )
    if user_interrupt:  # what the interrupt (or pdb's quit) itself raised is no failure
        report = {r: e for r, e in origin.items() if e.ename not in ("KeyboardInterrupt", "BdbQuit")}
    elif origin:
        report = origin
    elif obs.hang is not None:
        report = {}
    else:
        report = dict(failed)
    if user_interrupt:
        status = CellStatus.INTERRUPTED
    elif obs.death is not None:
        status = CellStatus.DIED
    elif obs.hang is not None and not origin:
        status = CellStatus.HUNG
    elif failed or obs.hang is not None:
        status = CellStatus.FAILED
    else:
        status = CellStatus.FINISHED
    first = first_failure(report) if report else None
    if obs.death is not None:
        error: str | None = f"rank {obs.death.rank} died: {obs.death.cause}"
    elif obs.hang is not None:
        error = "hang: " + "; ".join(f"rank {r}: {w}" for r, w in sorted(obs.hang.items()))
    elif first is not None:
        error = f"rank {first}: {report[first].summary}"
    else:
        error = None
    return Outcome(status, report, first, error, exited, quit)
