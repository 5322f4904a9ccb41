"""jdist's errors, in one place (pure: no IPython, ipyparallel or torch needed).

Two kinds of failure reach a notebook user:

* **bad input** (an option, a rank list, a variable name): IPython's own
  :class:`~IPython.core.error.UsageError`, shown as one ``UsageError: ...`` line, the same
  as the errors of the magics' argument parser, so every bad-input message looks alike;
* **faults** (a rank failed, died or hung; the cluster could not start): a
  :class:`JdistError` subclass. They render as a red headline plus a few plain lines,
  never as a traceback of jdist's own code (:class:`OneLineError`).

A failure on one rank is a :class:`RankFailure` record (rank, exception name and text,
traceback, when it completed), the equivalent of torch elastic's ``ProcessFailure``.

Example:
    >>> err = ClusterError("No mpiexec found. Install MPI: pip install mpich mpi4py")
    >>> err._render_traceback_()
    ['\\x1b[0;31mClusterError\\x1b[0m: No mpiexec found. Install MPI: pip install mpich mpi4py']
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Sequence

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (IPython's tracebacks carry them).

    >>> strip_ansi("\x1b[31mValueError\x1b[39m: boom")
    'ValueError: boom'
    """
    return _ANSI.sub("", text)

def dead_hint(restart: str) -> str:
    """Shown after a fault in which the rank processes died; ``restart``: the front end's way to start
    fresh ranks (:attr:`jdist.options.Frontend.restart`)."""
    return ("The rank processes died (MPI ends the whole job when one rank exits or is killed). "
            f"Run {restart} to start fresh ranks; their variables are lost.")


#: :func:`dead_hint` in a notebook.
DEAD_HINT = dead_hint("%dist restart")


def need(module: str, what: str, extra: str) -> Any:
    """``import module``, or one ImportError line naming the extra that installs it.

    >>> need("no_such_module_here", "jdist.Thing", "hf")
    Traceback (most recent call last):
    ImportError: jdist.Thing needs no_such_module_here: pip install 'jdist[hf]'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs {module.split('.')[0]}: pip install 'jdist[{extra}]'") from None


def usage_error(message: str) -> Exception:
    """IPython's ``UsageError`` (one ``UsageError: message`` line in a notebook).

    Imported lazily: the ranks and the server never need IPython's magics machinery.
    """
    from IPython.core.error import UsageError

    return UsageError(message)


class JdistError(Exception):
    """Base of jdist's fault errors."""


class OneLineError(JdistError):
    """Renders as ``<red>Name</red>: first line`` plus the remaining lines, no traceback.

    ``lines``: the headline first, then any detail lines (what was done, what to do).
    """

    def __init__(self, *lines: str):
        self.lines = [line for text in lines for line in str(text).splitlines()] or [""]
        super().__init__(self.lines[0])

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self.lines[0]}", *self.lines[1:]]


class ClusterError(OneLineError):
    """A cluster could not be started or used; the message says what to do."""


class ClusterChanged(JdistError):
    """The cluster the sidebar showed is no longer the kernel's current cluster."""


class RankDied(OneLineError):
    """A rank process ended (killed, out of memory, exited): MPI ended the others too."""


class HangError(OneLineError):
    """The watchdog saw every running rank wait in a collective without progress."""


class CellInterrupt(KeyboardInterrupt):
    """The user's interrupt of a cell (or ``q`` in a rank's pdb), once the ranks stopped: rendered as its
    lines, never as a traceback of jdist's own frames. It is a ``KeyboardInterrupt`` and is named so (the
    name a notebook shows, and what code catching the interrupt expects).

    >>> err = CellInterrupt("Interrupted: every rank received SIGINT and stopped.", "rank 0: released ...")
    >>> type(err).__name__, err._render_traceback_()[0]
    ('KeyboardInterrupt', '\\x1b[0;31mKeyboardInterrupt\\x1b[0m: Interrupted: every rank received SIGINT and stopped.')
    """

    def __init__(self, *lines: str):
        self.lines = [line for text in lines for line in str(text).splitlines()] or [""]
        super().__init__(self.lines[0])

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {self.lines[0]}", *self.lines[1:]]


CellInterrupt.__name__ = CellInterrupt.__qualname__ = "KeyboardInterrupt"


@dataclass(frozen=True)
class RankFailure:
    """What failed on one rank: the exception (``ename``/``evalue``), its traceback lines as
    the rank rendered them, and when the rank's reply completed (unix time, None if unknown).

    >>> RankFailure(1, "ValueError", "bad shard").summary
    'ValueError: bad shard'
    """

    rank: int
    ename: str
    evalue: str
    traceback: tuple[str, ...] = ()
    completed: float | None = None

    @property
    def summary(self) -> str:
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}" + (
                f" ({self.evalue})" if self.evalue and self.evalue != str(self.exit_code) else "")
        return f"{self.ename}: {self.evalue}"

    @property
    def exit_code(self) -> int | None:
        """The exit code of a ``SystemExit`` (``sys.exit``, ``exit()``, argparse), as Python's own
        process would end with it: None/0 -> 0, an int -> it, a message -> 1; None for other errors.

        >>> [RankFailure(0, "SystemExit", v).exit_code for v in ("", "None", "0", "3", "bad input")]
        [0, 0, 0, 3, 1]
        >>> RankFailure(1, "SystemExit", "bad input").summary
        'exited with code 1 (bad input)'
        """
        if self.ename != "SystemExit":
            return None
        if self.evalue in ("", "None"):
            return 0
        try:
            return int(self.evalue)
        except ValueError:
            return 1


def first_failure(failures: dict[int, RankFailure]) -> int:
    """The rank whose failure completed first (the origin; others often fail because of it).

    >>> first_failure({0: RankFailure(0, "E", "", completed=2.0), 1: RankFailure(1, "E", "", completed=1.0)})
    1
    """
    return min(failures, key=lambda r: (failures[r].completed is None, failures[r].completed or 0, r))


class RankError(JdistError):
    """One or more ranks raised. Shows the failing ranks and the first failing rank's traceback once.

    ``released``: how many other ranks jdist stopped before they ended. The headline says they had not got
    as far as the failing ranks: at 32 ranks a bug every rank hits fails on the few that get there first,
    and "2 of 32 rank(s) failed" alone would read as a bug of those two.

    >>> RankError({1: RankFailure(1, "ValueError", "bad")}, 32, 1, released=31).headline
    '1 of 32 rank(s) failed (rank 1); first failure on rank 1: ValueError: bad; the other 31 were released before they got that far'
    """

    def __init__(self, failed: dict[int, RankFailure], world_size: int, first: int, notes: Sequence[str] = (),
                 released: int = 0, dead_hint: str | None = DEAD_HINT):
        self.failed = failed
        self.dead_hint = dead_hint
        self.world_size = world_size
        self.first = first
        self.notes = list(notes)
        err = failed[first]
        ranks = ", ".join(map(str, sorted(failed)))
        self.headline = (
            f"{len(failed)} of {world_size} rank(s) failed (rank{'s' if len(failed) > 1 else ''} "
            f"{ranks}); first failure on rank {first}: {err.summary}"
        )
        if released:
            self.headline += ("; the other rank was released before it got that far" if released == 1 else
                              f"; the other {released} were released before they got that far")
        super().__init__(self.headline)

    def _render_traceback_(self) -> list[str]:
        err = self.failed[self.first]
        lines = [f"\x1b[0;31mRankError\x1b[0m: {self.headline}"]
        if err.exit_code is None:  # an exit's headline says it all
            lines += ["", f"Traceback from rank {self.first}:", *(list(err.traceback) or [err.summary])]
        others = {r: e for r, e in self.failed.items() if r != self.first}
        if others:
            lines.append("")
            lines += [f"rank {r}: {e.summary}" for r, e in sorted(others.items())]
        if self.dead_hint and any(e.ename in ("EngineError", "RankDied") for e in self.failed.values()):
            lines += ["", self.dead_hint]
        return lines + ([""] + list(self.notes) if self.notes else [])


__all__ = [
    "CellInterrupt",
    "ClusterChanged",
    "ClusterError",
    "DEAD_HINT",
    "dead_hint",
    "HangError",
    "JdistError",
    "OneLineError",
    "RankDied",
    "RankError",
    "RankFailure",
    "first_failure",
    "usage_error",
]


def remote_errors(exc: BaseException, limit: int = 2) -> str:
    """One line for an error the ranks raised: each rank's ``ename: evalue`` (ipyparallel's ``CompositeError``
    carries them in ``elist``; the first ``limit``), else the error itself.

    >>> remote_errors(ValueError("boom"))
    'ValueError: boom'
    """
    errors = getattr(exc, "elist", None) or [(type(exc).__name__, getattr(exc, "evalue", None) or str(exc))]
    return "; ".join(strip_ansi(f"{e[0]}: {e[1]}") for e in errors[:limit])

