"""Ctrl-C in a driver's wait loop, never lost: :class:`SigintCount`.

Every driver that waits in the kernel while ranks work (a cell, a sweep, a Ray Train run) waits in a
loop of short polls; a Ctrl-C there must stop the work. Python can drop it: a SIGINT whose handler runs
inside a destructor (a Cython ``__dealloc__``, such as pyzmq's ``Frame``, which the polls free by the
thousand, or a ``__del__``) has its KeyboardInterrupt printed as "Exception ignored in ..." and lost.
A loop that counts SIGINTs raises it again at its next turn.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class SigintCount:
    """While a driver waits, SIGINT does what its handler did (KeyboardInterrupt) and is also counted, so that an
    interrupt Python dropped in a destructor is handled all the same (seen in test runs: a cell's interrupt fault
    ran on for 120 s; a sweep's trials were never stopped). :meth:`check` raises it again at the wait loop's next
    turn; :meth:`handled` notes one the loop caught. In the main thread only (where Python runs signal
    handlers); elsewhere it does nothing.

    >>> import os, signal, time
    >>> with SigintCount() as c:
    ...     try:
    ...         os.kill(os.getpid(), signal.SIGINT); time.sleep(1)
    ...     except KeyboardInterrupt:
    ...         c.handled()
    ...     c.check()  # nothing was dropped
    """

    def __init__(self) -> None:
        self.count = 0  # KeyboardInterrupts the SIGINT handler raised
        self.seen = 0  # KeyboardInterrupts handled
        self.previous: Any = None

    def __enter__(self) -> SigintCount:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """The handler before decides (``jdist run``'s: a second Ctrl-C ends the ranks); a KeyboardInterrupt
        it raises is counted."""
        previous = self.previous
        if callable(previous):
            try:
                previous(signum, frame)
            except KeyboardInterrupt:
                self.count += 1
                raise
            return
        if previous != signal.SIG_IGN:
            self.count += 1
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt for an interrupt that arrived but was not handled (Python dropped it)."""
        if self.seen < self.count:
            raise KeyboardInterrupt

    def handled(self) -> None:
        """A KeyboardInterrupt was handled."""
        self.seen = min(self.seen + 1, self.count)
