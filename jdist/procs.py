"""Process identity and liveness on this machine, one definition for every part of jdist.

A PID alone can be reused by another process: a process is identified by its PID and its start
time (:func:`identity`), and :func:`alive` checks both. Used by the kernel (its own processes),
the ranks (is the kernel that owns them still there?) and the server (are a cluster's kernel
and controller still there?). Nothing here signals a process.

Example:
    >>> import os
    >>> alive(identity(os.getpid()))
    True
    >>> alive({"pid": os.getpid(), "create_time": 1.0})
    False
"""

from __future__ import annotations

from typing import Any

from jdist.protocol import ProcessIdentity

#: How far two readings of one process's start time may differ (psutil rounds to the clock tick).
START_TIME_TOLERANCE_S = 0.05


def identity(pid: int) -> ProcessIdentity:
    """``{"pid", "create_time"}`` of a running process (psutil.NoSuchProcess if there is none)."""
    import psutil

    return ProcessIdentity(pid=pid, create_time=psutil.Process(pid).create_time())


def alive(ident: ProcessIdentity | dict[str, Any] | None) -> bool:
    """Whether the process of :func:`identity` still runs: same PID and start time, not a zombie.

    An identity without ``create_time`` is checked by PID alone.
    """
    import psutil

    if not ident or not ident.get("pid"):
        return False
    try:
        proc = psutil.Process(ident["pid"])
        created = ident.get("create_time")
        if created is not None and abs(proc.create_time() - float(created)) > START_TIME_TOLERANCE_S:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID runs and is not a zombie.

    >>> import os
    >>> pid_alive(os.getpid())
    True
    """
    return alive({"pid": pid})


def popen_alive(proc: Any) -> bool:
    """A ``psutil.Process`` still running and not a zombie (None counts as alive: not started yet)."""
    import psutil

    if proc is None:
        return True
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
