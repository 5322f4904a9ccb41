"""Stragglers, with their cause: a rank persistently slower than the others, from its records alone.

In synchronous training every rank's step takes as long as the slowest one's: the others wait for it in their
collectives. So a straggler is not the rank with the longest step but the one that spends the longest *outside*
communication (``step_time_s - comm_time_s``: its own work), while the others' communication grows by what they
wait for it. :class:`StragglerWatch` sums each rank's records over windows of :data:`WINDOW_S` seconds (the
kernel's clock, as they arrive) and scores each rank against the others, as nvidia-resiliency-ext's straggler
detection scores sections: its relative score is its work divided by the median of the other ranks' work in that
window, and beside it, its own best window's work. A rank scored at least :data:`SLOW` in :data:`WINDOWS` windows in
a row is named once, with what its step is made of (:class:`Straggler`): the share it waited for data
(``data_time_s``: the time in ``DataLoader.__next__``), computed, and communicated, against the others'. One slow
step moves a window's mean little and one window is not enough, so a pause does not flag a rank.

Example (2 ranks whose records arrive over four 1-second windows; rank 1 waits 60 ms for data each step):
    >>> watch = StragglerWatch(2, window_s=1.0)
    >>> for second in range(4):
    ...     watch.add([{"rank": r, "step_time_s": 0.1, "comm_time_s": 0.08 - 0.07 * r,
    ...                 "data_time_s": 0.06 * r} for _ in range(5) for r in (0, 1)])
    ...     found = watch.poll(float(second + 1))
    >>> [s.line() for s in watch.flagged]  # doctest: +NORMALIZE_WHITESPACE
    ['rank 1 is slower than the others: 4.5x their median time outside communication for the last 2 s
    (2 windows of 1 s); it waits for data 60% of its step, the others 0%; they wait for it in
    communication 80% of theirs. Cause: waiting for data (its DataLoader).']
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Seconds of records in one window (``$JDIST_STRAGGLER_WINDOW_S`` in the kernel).
WINDOW_S = 10.0
#: A rank is slow in a window when its work is at least this many times the others' median.
SLOW = 1.3
#: Slow windows in a row before a rank is named.
WINDOWS = 2
#: A rank's window counts only with at least this many records (steps) in it.
MIN_STEPS = 3
#: A straggler that waits for a CPU this share of its step more than the others is starved by its host's load.
STARVED = 0.1


@dataclass
class Straggler:
    """A rank named as a straggler: its score (work / the others' median work, the last window), the windows it
    was slow in, and each part of its step against the others' (shares of the step; None: not measured)."""

    rank: int
    score: float
    windows: int
    window_s: float
    data_share: float | None
    others_data_share: float | None
    compute_share: float | None
    others_compute_share: float | None
    others_comm_share: float | None
    best_ratio: float | None = None  # its work now / its best window's
    host: str = ""
    #: The share of its step it waited for a CPU (``cpu_wait_s``: runnable, its core taken), and the others' median.
    wait_share: float | None = None
    others_wait_share: float | None = None

    @property
    def cause(self) -> str:
        """``"data"``, ``"host load"`` or ``"compute"``: what it does more of than the others, of waiting for data,
        waiting for a CPU (other processes or CPU steal take its cores) and computing (the rest of its time
        outside communication)."""
        data = (self.data_share or 0.0) - (self.others_data_share or 0.0)
        wait = (self.wait_share or 0.0) - (self.others_wait_share or 0.0)
        compute = (self.compute_share or 0.0) - (self.others_compute_share or 0.0)
        if data > 0 and data >= compute and data >= wait:
            return "data"
        if wait >= STARVED and wait >= compute:
            return "host load"
        return "compute"

    def line(self) -> str:
        """One line for the cell's output and the run's summary."""
        seconds = self.windows * self.window_s
        text = (f"rank {self.rank}{f' ({self.host})' if self.host else ''} is slower than the others: "
                f"{self.score:.1f}x their median time outside communication"
                f"{' or waiting for a CPU' if self.cause == 'host load' else ''} for the last {seconds:g} s "
                f"({self.windows} windows of {self.window_s:g} s)")
        if self.best_ratio is not None and self.best_ratio >= 1.2:
            text += f", {self.best_ratio:.1f}x its own best window"
        if self.data_share is not None and (self.cause == "data" or self.data_share >= 0.01):
            text += f"; it waits for data {self.data_share:.0%} of its step, the others {self.others_data_share:.0%}"
        cause = self.cause
        if cause == "compute" and self.compute_share is not None:
            text += f"; it computes {self.compute_share:.0%} of its step, the others {self.others_compute_share:.0%}"
        if cause == "host load":
            text += (f"; it waits for a CPU {self.wait_share:.0%} of its step (runnable, its core taken), the others "
                     f"{self.others_wait_share or 0.0:.0%}")
        if self.others_comm_share is not None:
            text += f"; they wait for it in communication {self.others_comm_share:.0%} of theirs"
        said = {"data": "waiting for data (its DataLoader)",
                "host load": f"host load (other processes on {self.host or 'its host'}, or CPU steal, take its cores)",
                "compute": "its own computation (a slower device or core, or more work on it)"}[cause]
        return text + f". Cause: {said}."


@dataclass
class _Window:
    """Per rank sums over one window: records, step time, and over the records that have each: comm time
    (with the step time of those records), data time (idem), time waiting for a CPU (idem)."""

    n: np.ndarray
    step: np.ndarray
    comm: np.ndarray
    comm_step: np.ndarray
    data: np.ndarray
    data_step: np.ndarray
    wait: np.ndarray
    wait_step: np.ndarray

    @classmethod
    def empty(cls, size: int) -> _Window:
        return cls(*(np.zeros(size) for _ in range(8)))


@dataclass
class StragglerWatch:
    """Scores a run's ranks over windows of ``window_s`` (see the module doc): :meth:`add` each batch of records
    as it comes, :meth:`poll` with the clock; a rank is named once (:attr:`flagged`)."""

    world_size: int
    window_s: float = WINDOW_S
    hosts: dict[int, str] = field(default_factory=dict)
    flagged: list[Straggler] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._window = _Window.empty(self.world_size)
        self._started: float | None = None
        self._streak = np.zeros(self.world_size, dtype=np.int64)
        self._best = np.full(self.world_size, np.inf)
        self._named: set[int] = set()
        self._stage: dict[int, int] = {}  # rank -> its pipeline stage (pp_stage): compared with its stage's only

    def add(self, records: Any) -> None:
        """A batch of records (a :class:`~jdist.metrics.store.RecordBatch` or record dicts)."""
        from .store import RecordBatch

        batch = records if isinstance(records, RecordBatch) else RecordBatch.from_records(list(records))
        cols = batch.columns
        if not batch.n or "step_time_s" not in cols:
            return
        rank = cols["rank"].astype(np.int64)
        keep = (rank >= 0) & (rank < self.world_size) & ~np.isnan(cols["step_time_s"])
        if not keep.any():
            return
        rank, step = rank[keep], cols["step_time_s"][keep]
        if "pp_stage" in cols:  # (a pipeline's stages do different work: a rank is compared with its stage's)
            stages = cols["pp_stage"][keep]
            for r, st in zip(rank.tolist(), stages.tolist()):
                if st == st:
                    self._stage[r] = int(st)
        w, size = self._window, self.world_size
        w.n += np.bincount(rank, minlength=size)
        w.step += np.bincount(rank, weights=step, minlength=size)
        for name, total, steps in (("comm_time_s", "comm", "comm_step"), ("data_time_s", "data", "data_step"),
                                   ("cpu_wait_s", "wait", "wait_step")):
            if name in cols:
                value = cols[name][keep]
                known = ~np.isnan(value)
                setattr(w, total, getattr(w, total) + np.bincount(rank[known], weights=value[known], minlength=size))
                setattr(w, steps, getattr(w, steps) + np.bincount(rank[known], weights=step[known], minlength=size))

    def poll(self, now: float) -> list[Straggler]:
        """Close the window if ``window_s`` has passed since it began (``now``: the clock's seconds); returns the
        ranks named by it (each rank once per watch)."""
        if self._started is None:
            self._started = now
            return []
        if now - self._started < self.window_s:
            return []
        window, self._window, self._started = self._window, _Window.empty(self.world_size), now
        return self._score(window)

    def _score(self, w: _Window) -> list[Straggler]:
        ranks = [r for r in range(self.world_size) if w.n[r] >= MIN_STEPS]
        if len(ranks) < 2:
            self._streak[:] = 0
            return []
        timed = all(w.comm_step[r] > 0 for r in ranks)
        # its own work: the step time outside communication (without comm timing: the step time)
        work = {r: (w.step[r] - w.comm[r] * w.step[r] / w.comm_step[r]) / w.n[r] if timed else w.step[r] / w.n[r]
                for r in ranks}
        share = {name: {r: getattr(w, name)[r] / getattr(w, f"{name}_step")[r] for r in ranks
                        if getattr(w, f"{name}_step")[r] > 0} for name in ("comm", "data", "wait")}
        for r, wait in share["wait"].items():  # and its waits for a CPU, also those inside a collective (a starved
            work[r] = min(w.step[r] / w.n[r], work[r] + wait * w.step[r] / w.n[r])  # rank's show there), at most its step
        found = []
        for r in ranks:
            stage = self._stage.get(r)
            others = [work[o] for o in ranks if o != r and self._stage.get(o) == stage]
            if not others:  # (the only rank of its pipeline stage: nothing alike to compare with)
                self._streak[r] = 0
                continue
            median = statistics.median(others)
            score = work[r] / median if median > 0 else math.inf if work[r] > 0 else 1.0
            self._best[r] = min(self._best[r], work[r])
            self._streak[r] = self._streak[r] + 1 if score >= SLOW else 0
            if self._streak[r] < WINDOWS or r in self._named:
                continue
            self._named.add(r)
            data, comm = share["data"], share["comm"]

            def others_median(values: dict[int, float], r: int = r) -> float | None:
                rest = [v for o, v in values.items() if o != r]
                return statistics.median(rest) if rest else None

            compute = ({o: 1.0 - comm[o] - data.get(o, 0.0) for o in comm} if timed else {})
            found.append(Straggler(
                rank=r, score=score, windows=int(self._streak[r]), window_s=self.window_s,
                data_share=data.get(r), others_data_share=others_median(data),
                compute_share=compute.get(r), others_compute_share=others_median(compute),
                others_comm_share=others_median(comm) if timed else None,
                best_ratio=work[r] / self._best[r] if self._best[r] > 0 else None, host=self.hosts.get(r, ""),
                wait_share=share["wait"].get(r), others_wait_share=others_median(share["wait"])))
        self.flagged.extend(found)
        return found


def window_from_env(environ: Any) -> float:
    """``$JDIST_STRAGGLER_WINDOW_S`` (seconds, > 0), else :data:`WINDOW_S`; a bad value is one line with the fix.

    >>> window_from_env({}), window_from_env({"JDIST_STRAGGLER_WINDOW_S": "2"})
    (10.0, 2.0)
    >>> window_from_env({"JDIST_STRAGGLER_WINDOW_S": "soon"})
    Traceback (most recent call last):
    ValueError: JDIST_STRAGGLER_WINDOW_S='soon': seconds of records per straggler window, a number > 0 (default 10).
    """
    raw = environ.get("JDIST_STRAGGLER_WINDOW_S")
    if raw is None:
        return WINDOW_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"JDIST_STRAGGLER_WINDOW_S={raw!r}: seconds of records per straggler window, a number > 0 "
                         f"(default {WINDOW_S:g}).")
    return value


__all__: Sequence[str] = ["MIN_STEPS", "SLOW", "STARVED", "WINDOWS", "WINDOW_S", "Straggler", "StragglerWatch",
                          "window_from_env"]
