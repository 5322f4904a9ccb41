"""A sweep's Optuna journal kept in memory and mirrored to its file by a thread of its own.

Optuna's ``JournalFileBackend`` reopens the file for every read and takes a lock file, writes and
``fsync`` s for every write: an ask, each parameter, each ``trial.report`` and the tell each cost a
round trip to the disk on the thread that drives the sweep (several ms on a busy or network file
system). :class:`MirroredJournal` answers Optuna's reads from memory and hands each write to a
writer thread, which appends batches to the same file in Optuna's own format (one JSON object per
line), with one ``fsync`` per batch. So ``optuna-dashboard``, ``jupyterlab-optuna`` or
``JournalFileBackend`` read the file as any Optuna journal, and a sweep resumes from it.

One process writes a mirrored journal (the kernel that drives the sweep); other processes may read
the file at any time. :meth:`flush` returns once everything appended so far is on disk.

>>> import tempfile, optuna
>>> from optuna.storages import JournalStorage
>>> path = tempfile.mkdtemp() + "/journal.log"
>>> study = optuna.create_study(storage=JournalStorage(MirroredJournal(path)), study_name="s")
>>> study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=3)
>>> study._storage._backend.flush()
>>> from optuna.storages.journal import JournalFileBackend
>>> len(optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(path))).trials)
3
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Iterable

from optuna.storages.journal import BaseJournalBackend, JournalFileSymlinkLock

#: The writer thread collects appends for this long before it writes them (one fsync per batch).
BATCH_S = 0.05
#: The writer thread ends after this long without appends (a later append starts it again).
IDLE_S = 5.0


_open: weakref.WeakSet[MirroredJournal] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    """At the kernel's exit: what the writer threads hold goes to disk (they are daemons)."""
    for journal in list(_open):
        try:
            journal.flush(timeout=10.0)
        except OSError:
            pass


class JournalWriteError(OSError):
    """The journal file could not be written: the study is complete in memory only."""


class MirroredJournal(BaseJournalBackend):
    """Optuna's journal in memory, appended to ``path`` in Optuna's file format by a writer thread."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.dropped_tail = False  # the file ended in a cut-off line (a writer died mid-line): removed
        self._logs: list[dict[str, Any]] = self._load()
        self._pending: list[str] = []
        self._appended = 0  # lines appended, lines on disk
        self._written = 0
        self._error: OSError | None = None
        self._cv = threading.Condition()
        self._hurry = False  # flush() waits: write what there is without waiting for more
        self._thread: threading.Thread | None = None
        self._lock = JournalFileSymlinkLock(str(self.path))  # the lock Optuna's own writers take
        _open.add(self)

    def _load(self) -> list[dict[str, Any]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        if end < len(data):
            self.dropped_tail = True
            with open(self.path, "r+b") as f:
                f.truncate(end)
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]

    # -- Optuna's backend interface ---------------------------------------------------------------
    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        return self._logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        lines = [json.dumps(log, separators=(",", ":")) for log in logs]  # as Optuna writes them
        self._logs.extend(logs)
        with self._cv:
            self._pending.extend(lines)
            self._appended += len(lines)
            if self._thread is None and self._error is None:  # after an error the file stays as it was
                self._thread = threading.Thread(target=self._write_loop, name="jdist-journal", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    # -- the file --------------------------------------------------------------------------------
    def flush(self, timeout: float | None = 30.0) -> None:
        """Wait until every log appended so far is on disk; :class:`JournalWriteError` if it cannot be."""
        with self._cv:
            self._hurry = True
            self._cv.notify_all()
            if not self._cv.wait_for(lambda: self._written >= self._appended or self._error is not None, timeout):
                raise JournalWriteError(f"the journal {self.path} is not written after {timeout:g} s (a slow disk?)")
            if self._error is not None:
                raise JournalWriteError(f"the journal {self.path} could not be written: {self._error}")

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                if not self._cv.wait_for(lambda: bool(self._pending), IDLE_S):
                    self._thread = None  # idle: a later append starts a new writer
                    return
                self._cv.wait_for(lambda: self._hurry, BATCH_S)  # let a burst (an ask: trial, params...) gather
                batch, self._pending = self._pending, []
                self._hurry = False
            try:
                self._lock.acquire()
                try:
                    with open(self.path, "ab") as f:
                        f.write(("\n".join(batch) + "\n").encode())
                        f.flush()
                        os.fsync(f.fileno())
                finally:
                    self._lock.release()
            except OSError as exc:
                with self._cv:
                    self._error = exc
                    self._thread = None
                    self._cv.notify_all()
                return
            with self._cv:
                self._written += len(batch)
                self._cv.notify_all()
