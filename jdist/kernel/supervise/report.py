"""How a cell's outcome is shown: one concise error, plus what was done about the other ranks.

:func:`raise_for_result` raises :class:`jdist.errors.RankDied`, :class:`~jdist.errors.HangError`,
:class:`~jdist.errors.RankError` or KeyboardInterrupt for a cell that did not finish, with the
lines of :func:`fault_notes` (ranks released, the process group re-created, ranks stuck).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from jdist.common.last_words import lines_of
from jdist.common.mismatch import alone_line, mismatch_lines
from jdist.common.stacks import crash_lines, waiting_phrase
from jdist.errors import CellInterrupt, HangError, RankDied, RankError, RankFailure, dead_hint
from jdist.metrics import Run
from jdist.options import NOTEBOOK, Frontend

from ..launch import RankDeath
from .memory import killed_lines, memory_lines
from .outcome import CellStatus, Observations, Outcome


@dataclass
class CellResult:
    """What happened to one cell: its observations, outcome and run (None if nothing was logged)."""

    obs: Observations
    outcome: Outcome
    run: Run | None = None
    rebuilt: dict[str, Any] | None = None  # the re-built process group, or where released ranks waited (supervisor)
    stuck_stacks: dict[int, str] = field(default_factory=dict)
    watchdog_s: float = 0.0
    grace_s: float = 0.0  # --interrupt-grace: how long released or interrupted ranks had to stop
    #: ranks whose communication cannot be used again in their process, and why: the ranks must restart
    unusable: dict[int, str] = field(default_factory=dict)
    #: lines the backend adds under a known upstream failure (:attr:`jdist.plugins.BackendSpec.hints`)
    hints: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def death(self) -> RankDeath | None:
        return self.obs.death

    @property
    def hang(self) -> dict[int, str] | None:
        return self.obs.hang

    @property
    def failed(self) -> dict[int, RankFailure]:
        return self.outcome.failed

    @property
    def interrupted(self) -> bool:
        return self.outcome.interrupted

    @property
    def ok(self) -> bool:
        """The cell finished on every rank."""
        return self.outcome.status is CellStatus.FINISHED


def fault_notes(result: CellResult, frontend: Frontend = NOTEBOOK) -> list[str]:
    """What was done about released or stuck ranks and what was kept, as lines for the user (the advice in
    ``frontend``'s words: :attr:`jdist.options.Frontend.restart`)."""
    lines = list(result.hints)
    obs = result.obs
    rep = result.rebuilt or {}
    where = rep.get("released_from", {})
    if obs.released:
        first = result.outcome.first_failed
        quit = result.outcome.quit
        why = "of the hang" if obs.hang is not None else (
            f"rank {first} failed" if first is not None else
            f"of pdb's q on {rank_ranges(quit)}" if quit else "of the interrupt")
        alike: dict[str, list[int]] = {}  # at 32 ranks, one line per place rather than one per rank
        for r in obs.released:
            how = (waiting_phrase(where[r]) if r in where else "still running: below" if r in obs.stuck
                   else "stopped with KeyboardInterrupt")
            alike.setdefault(how, []).append(r)
        for how, ranks in alike.items():
            it = "it was " if len(ranks) == 1 else "they were "
            lines.append(f"{rank_ranges(ranks)}: released because {why} "
                         f"({it + how if how.startswith('waiting') else how}).")
    if result.unusable:
        reasons = sorted(set(result.unusable.values()))
        lines.append(f"{rank_ranges(sorted(result.unusable)).capitalize()}: the collectives cannot be used again in "
                     f"these processes ({'; '.join(reasons)}).")
    if "error" in rep:
        lines.append(f"The process group could not be re-created ({rep['error']})"
                     + (f": run {frontend.restart}." if frontend.restart else "."))
    elif result.rebuilt and rep.get("rebuilt", True):
        kept, lost = rep.get("kept"), rep.get("lost")
        lines.append("The process group was re-created on all ranks; variables on the ranks are kept"
                     + (f", and {kept}" if kept else "") + ".")
        if lost:
            lines.append(f"Not kept: {lost}.")
    if obs.stuck:
        within = "(a second interrupt ended the wait)" if obs.cut_short else f"within {result.grace_s:g} s"
        lines.append(f"rank(s) {', '.join(map(str, obs.stuck))} did not stop {within}:")
        lines += [f"  rank {r}: {what}" for r, what in sorted(result.stuck_stacks.items())]
        if frontend.restart and not result.unusable:  # (unusable ranks: the front end restarts them)
            lines.append(f"Run {frontend.restart} to get the ranks back (their variables are lost"
                         + (f"; {frontend.stacks} shows where they are)." if frontend.stacks else ")."))
    return lines


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``; one rank: ``"rank 3"``.

    >>> rank_ranges([0, 1, 2, 5]), rank_ranges([3])
    ('ranks 0-2, 5', 'rank 3')
    """
    parts: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def exit_note(result: CellResult) -> str | None:
    """The line for a cell whose code exited (``sys.exit(0)``, ``exit()``) on some ranks: the ranks stay."""
    clean = [r for r, code in result.outcome.exited.items() if code == 0]
    if not clean:
        return None
    return (f"jdist: {rank_ranges(clean)} exited with code 0 (sys.exit/exit()): the cell ended there; "
            "the ranks and their variables stay (%dist stop ends them).")


def raise_for_result(result: CellResult, world_size: int, notes: Sequence[str] = (),
                     frontend: Frontend = NOTEBOOK) -> None:
    """Raise one concise error for a failed, hung, dead or interrupted cell (nothing if it finished;
    a cell that exited with code 0 on some ranks prints one line saying so).

    ``notes``: extra lines (e.g. what an automatic restart did).
    """
    if result.ok:
        note = exit_note(result)
        if note:
            print(note, flush=True)
    extra = fault_notes(result, frontend) + list(notes)
    obs = result.obs
    if obs.death is not None:
        d = obs.death
        raise RankDied(
            f"rank {d.rank} died: {d.cause}. MPI ended the other rank(s) too "
            f"(the cell had run {result.elapsed_s:.1f} s).",
            *(killed_lines(result.run, d.rank) if d.oom and d.rank is not None else ()),
            *lines_of(d.rank, d.last_words),
            *crash_lines(d.rank, d.crash),
            *(extra or [f"Run {frontend.restart} to start fresh ranks: it replays the set-up cells and restores the "
                        "newest checkpoint of jdist.checkpoint_every, if there is one; other variables are lost."]
              if frontend.restart else extra),
        )
    if obs.hang is not None and not result.failed:
        finished = [r for r in obs.ranks if r not in obs.hang]
        if obs.alone:
            lines = [alone_line(obs.hang, finished, obs.collectives or {}, world_size),
                     *[f"  rank {r}: {waiting_phrase(w)}" for r, w in sorted(obs.hang.items())]]
        else:
            lines = [f"hang: no progress for {result.watchdog_s:g} s and every running rank waits in a collective "
                     "(--watchdog).", *[f"  rank {r}: {waiting_phrase(w)}" for r, w in sorted(obs.hang.items())]]
        lines += [f"  rank {r}: finished the cell (it never called the matching collective)" for r in finished]
        if not obs.alone:
            lines += mismatch_lines(obs.collectives or {}, obs.hang, world_size)
        raise HangError(*lines, *extra)
    if result.interrupted:
        quit = result.outcome.quit
        if quit:
            msg = (f"Stopped: pdb's q on {rank_ranges(quit)} ended the cell there"
                   + (" (the other ranks were released)" if obs.released else "") + "; variables on the ranks are kept.")
        else:
            msg = "Interrupted: every rank received SIGINT"
            msg += "." if obs.stuck else " and stopped; variables on the ranks are kept."
        raise CellInterrupt(msg, *extra)
    if result.failed:
        assert result.outcome.first_failed is not None
        oom = memory_lines(result.run, result.failed[result.outcome.first_failed])
        if oom:  # (before the other notes: what took the memory is the cause)
            extra = [*oom, *extra]
        released = [r for r in obs.released if r not in result.failed]
        raise RankError(result.failed, world_size, result.outcome.first_failed, extra, released=len(released),
                        dead_hint=dead_hint(frontend.restart) if frontend.restart else None)
