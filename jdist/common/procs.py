"""Process identity and liveness on this machine, one definition for every part of jdist.

A PID alone can be reused by another process: a process is identified by its PID and its start
time (:func:`identity`), and :func:`alive` checks both. The start time is counted from the machine's boot
(Linux: ``/proc/<pid>/stat``), not from the epoch: psutil's ``create_time`` adds the boot time as the wall
clock gives it now, which moves when the clock is set (a VM's clock corrected after a pause), and then
every check failed at once: the controllers of CI's clusters took their kernels for gone and ended
(their ranks ended 37 s later, missing its heartbeat). Used by the kernel (its own processes),
the ranks (is the kernel that owns them still there?) and the server (are a cluster's kernel
and controller still there?). Nothing here signals a process. :func:`mpi_shm_segments` finds
what an MPI job leaves in ``/dev/shm`` if its ranks end without ``MPI_Finalize``.

Example:
    >>> import os
    >>> alive(identity(os.getpid()))
    True
    >>> alive({"pid": os.getpid(), "create_time": 1.0})
    False
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

from jdist.protocol import ProcessIdentity

#: How far two readings of one process's start time may differ (they are in clock ticks).
START_TIME_TOLERANCE_S = 0.05


def started(pid: int) -> float:
    """When process ``pid`` started, in seconds after the machine booted (psutil.NoSuchProcess if there is no
    such process). Where there is no ``/proc`` (not Linux), psutil's start time since the epoch.

    >>> 0 < started(os.getpid()) <= time.clock_gettime(time.CLOCK_BOOTTIME)
    True
    """
    import psutil

    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    except OSError:
        return psutil.Process(pid).create_time()
    # after the command name (in parentheses, which may hold spaces): field 3 (state) ... field 22 (starttime)
    return int(stat[stat.rindex(b")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")


def identity(pid: int) -> ProcessIdentity:
    """``{"pid", "create_time"}`` of a running process (psutil.NoSuchProcess if there is none); ``create_time``
    is :func:`started`'s."""
    return ProcessIdentity(pid=pid, create_time=started(pid))


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
        if created is not None and abs(started(proc.pid) - float(created)) > START_TIME_TOLERANCE_S:
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


def open_files(pid: int) -> dict[int, str]:
    """What each file descriptor of process ``pid`` refers to (``/proc/<pid>/fd``; {} if gone).

    >>> any(t.startswith("/") or ":" in t for t in open_files(os.getpid()).values())
    True
    """
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    out = {}
    for name in names:
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:  # closed meanwhile
            continue
    return out


def mpi_shm_segments(pids: Sequence[int]) -> set[str]:
    """The MPICH shared-memory segments (``/dev/shm/mpich_shm_*``) these processes have open.

    ``MPI_Finalize`` removes them; a job whose ranks were killed, or exited without it, leaves
    them (2 MB each), and a later job whose segment gets the same name hangs in ``MPI_Init``.

    >>> mpi_shm_segments([os.getpid()])   # this process runs no MPI job
    set()
    """
    return {target for pid in pids for target in open_files(pid).values()
            if target.startswith("/dev/shm/mpich_shm_") and not target.endswith(" (deleted)")}


def orphaned_mpi_shm(min_age: float = 60.0, shm_dir: Path = Path("/dev/shm")) -> list[Path]:
    """This user's MPICH shared-memory segments (``mpich_shm_*``, ``mpich_vci_*``) that no process has
    open and that are older than ``min_age`` seconds: left by jobs whose ranks were killed (a job's ranks
    hold their segment open until ``MPI_Finalize`` removes it).

    MPICH names a job's segment after its world id (a 32-bit hash, ``mpich_shm_<id>_<node>``) and opens
    an existing segment of that name instead of creating one, so a new job whose name matches a leftover
    starts on a dead job's contents. The likely cause of an ``MPI_Init`` failure seen once in a full test
    run here ("Message from rank 1 and tag 7 truncated"; ten leftovers in ``/dev/shm``, PIDs wrapping at
    32768), and of the hangs in ``MPI_Init`` that :func:`mpi_shm_segments` was written for. The local
    launcher removes these before it starts a job.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     old, held, new = (Path(d) / f"mpich_shm_{n}_0" for n in ("a1", "b2", "c3"))
    ...     for path in (old, held, new):
    ...         _ = path.write_bytes(b"")
    ...     for path in (old, held):
    ...         os.utime(path, (time.time() - 120,) * 2)
    ...     with open(held):
    ...         [p.name for p in orphaned_mpi_shm(60, Path(d))]
    ['mpich_shm_a1_0']
    """
    now, uid = time.time(), os.getuid()
    candidates = {}
    for path in shm_dir.glob("mpich_*"):
        if not path.name.startswith(("mpich_shm_", "mpich_vci_")):
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_uid == uid and now - st.st_mtime >= min_age:
            candidates[str(path)] = path
    if candidates:
        for name in os.listdir("/proc"):
            if name.isdigit():
                for target in open_files(int(name)).values():
                    candidates.pop(target, None)
    return sorted(candidates.values())
