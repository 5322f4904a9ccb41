"""How much of the kernel's memory runs may hold: older runs leave memory, their folders stay.

The kernel tracks each run it makes (:func:`track`). When the runs' values
(:attr:`jdist.metrics.Run.nbytes`) add up to more than ``max_bytes``, or more than ``keep`` runs
hold values, the least recently used runs that have ended are released
(:meth:`~jdist.metrics.Run.release`): a released run keeps its description (status, code, ...)
and reads its values back from its run folder the next time anything asks for them, which
makes it the most recently used. A running run is never released.

Example:
    >>> budget = RunBudget(max_bytes=2**20, keep=2)
    >>> budget.limits()
    {'max_bytes': 1048576, 'keep': 2}
"""

from __future__ import annotations

import ctypes
import os
import sys
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .records import Run

#: Default cap on the bytes the kernel's runs hold (``$JDIST_RUN_MEMORY_MB`` overrides it).
MAX_BYTES = int(float(os.environ.get("JDIST_RUN_MEMORY_MB", "512")) * 2**20)
#: Default number of runs that keep their values in memory.
KEEP = 10


class RunBudget:
    """The runs of one process that hold values, least recently used first."""

    def __init__(self, max_bytes: int = MAX_BYTES, keep: int = KEEP):
        self.max_bytes = max_bytes
        self.keep = keep
        self._refs: OrderedDict[int, weakref.ref[Run]] = OrderedDict()  # a run no one holds leaves

    def limits(self) -> dict[str, int]:
        return {"max_bytes": self.max_bytes, "keep": self.keep}

    @property
    def runs(self) -> list[Run]:
        """The tracked runs, least recently used first."""
        return [run for ref in list(self._refs.values()) if (run := ref()) is not None]

    def track(self, run: Run) -> None:
        """Count ``run`` in (as the most recently used) and release older ones over the budget."""
        key = id(run)
        self._refs[key] = weakref.ref(run, lambda _, key=key: self._refs.pop(key, None))
        self._refs.move_to_end(key)
        self.enforce()

    def loaded(self, run: Run) -> None:
        """``run`` was read back from its folder: the most recently used now."""
        if id(run) in self._refs:
            self._refs.move_to_end(id(run))
            self.enforce(spare=run)

    def held(self) -> int:
        """Bytes the tracked runs hold now."""
        return sum(run.nbytes for run in self.runs)

    def enforce(self, spare: Run | None = None) -> list[Run]:
        """Release the least recently used ended runs while over a limit (``spare``: not that one,
        the run just read back for a caller); returns the runs released."""
        loaded = [run for run in self.runs if not run.released]
        total = sum(run.nbytes for run in loaded)
        released = []
        for run in loaded:
            if total <= self.max_bytes and len(loaded) - len(released) <= self.keep:
                break
            if run is spare:
                continue
            size = run.nbytes
            if run.release():
                released.append(run)
                total -= size
        if released:
            _give_back_memory()
        return released


def _give_back_memory() -> None:
    """Return freed heap pages to the system (glibc keeps them for reuse; RSS would not drop)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


#: The kernel's budget (``jdist.run_memory``).
BUDGET = RunBudget()


def track(run: Run) -> None:
    BUDGET.track(run)


def loaded(run: Run) -> None:
    BUDGET.loaded(run)


def configure(max_mb: float | None = None, keep: int | None = None) -> dict[str, Any]:
    """Set the kernel's run memory budget (``None``: unchanged) and say where it stands.

    >>> configure()["keep"] >= 1
    True
    """
    if max_mb is not None:
        if max_mb <= 0:
            raise ValueError(f"jdist.run_memory: max_mb must be > 0, not {max_mb}")
        BUDGET.max_bytes = int(max_mb * 2**20)
    if keep is not None:
        if keep < 1:
            raise ValueError(f"jdist.run_memory: keep must be >= 1, not {keep}")
        BUDGET.keep = int(keep)
    BUDGET.enforce()
    runs = BUDGET.runs
    return {"max_mb": BUDGET.max_bytes / 2**20, "keep": BUDGET.keep, "held_mb": round(BUDGET.held() / 2**20, 1),
            "runs_in_memory": sum(not r.released for r in runs), "runs_released": sum(r.released for r in runs)}


__all__ = ["BUDGET", "KEEP", "MAX_BYTES", "RunBudget", "configure", "loaded", "track"]
