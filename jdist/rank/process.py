"""The rank's process: how it ends, whatever ends it, leaving nothing behind.

* The kernel exits normally: it calls :func:`teardown` then :func:`exit_process` on every rank.
* The kernel is killed (local ranks): :func:`watch_owner` notices within a second; rank 0 ends
  the controller and every rank exits.
* hydra or srun end a remote rank with SIGTERM (a stop, a dead peer, the kernel's reaper):
  :func:`end_on_sigterm`.

However a rank ends without ``MPI_Finalize``, it removes the names of its MPICH shared-memory
segments first (:func:`unlink_mpi_shm`): a leftover segment whose name a later job picks makes
that job hang in ``MPI_Init``. Remote ranks also note them for the shell around their engine,
which removes them after a SIGKILL (:func:`note_mpi_shm`).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from jdist.protocol import Owner

from .session import current


#: The process that owns the cluster (the kernel, or ``jdist run``); :func:`set_owner` changes it.
_owner: dict[str, Any] = {}


def watch_owner(owner: Owner, stop_controller: bool, interval: float = 1.0) -> None:
    """End this rank if the process that owns the cluster (a kernel, or ``jdist run``) is gone
    (killed, crashed).

    An owner that exits normally stops its cluster; one that is SIGKILLed cannot. Then
    rank 0 also ends the controller, identified by PID and start time (never by name),
    and every rank exits, which ends the MPI job: nothing is left behind. The owner can
    change (``%dist attach`` of a ``jdist run --keep`` cluster): :func:`set_owner`.
    """
    import psutil

    from jdist.common.procs import alive, pid_alive

    if owner["host"] != socket.gethostname():
        return  # the kernel runs on another machine: its PID means nothing here
    _owner.update(owner)
    pid, created = owner["controller"]
    controller = {"pid": int(pid), "create_time": created}

    def watch() -> None:
        while pid_alive(_owner["pid"]):
            time.sleep(interval)
        if stop_controller and alive(controller):
            psutil.Process(int(pid)).terminate()
        unlink_mpi_shm()
        os._exit(0)

    threading.Thread(target=watch, name="jdist-owner-watch", daemon=True).start()


def set_owner(pid: int) -> None:
    """The cluster now belongs to process ``pid`` of the same host (a kernel that attached it)."""
    _owner["pid"] = int(pid)


def end_on_sigterm(guard: Any) -> None:
    """A remote rank: note its MPI shared memory for the shell around the engine, and end at once
    on SIGTERM, removing it (the default action would leave it in that host's /dev/shm)."""
    note_mpi_shm()
    guard.on_terminate = terminated
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated())


def teardown(finalize_within: float = 2.0) -> None:
    """Release the backend on this rank and finalize MPI (called by the kernel on every rank at once
    before it stops the cluster).

    MPI is finalized only if every rank gets here within ``finalize_within`` seconds (a rank still
    busy would leave the others blocked in ``MPI_Finalize``). A finalized job ends at once when its
    ranks exit; without it mpiexec waits for them about 2 s more (``MPI4PY_RC_FINALIZE=false``
    keeps a rank whose peers died from waiting in ``MPI_Finalize`` at exit).
    """
    from mpi4py import MPI

    from jdist.common.waiting import poll_until

    s = current()
    if s is not None:
        s.log_hooks.clear()
        s.stop_publisher()
        if s.backend is not None:
            s.backend.teardown()
        s.backend = None
    if MPI.Is_finalized():
        return
    everyone = MPI.COMM_WORLD.Ibarrier()
    if poll_until(everyone.Test, finalize_within, interval=0.002):
        MPI.Finalize()  # else not every rank is here: leave MPI as it is


def exit_process() -> None:
    """End this rank's process at once (the kernel stops the cluster; :func:`teardown` ran).

    Skips the interpreter's own shutdown (ipykernel, torch and module clean-up), which takes
    about a second per rank and is of no use to a process whose state is being thrown away.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    unlink_mpi_shm()  # MPI_Finalize did, unless a rank was busy
    os._exit(0)


def note_mpi_shm() -> None:
    """Tell the shell around this engine our MPI shared-memory segments (it removes them after we end,
    also after a SIGKILL; :data:`jdist.kernel.launch.remote.REMOTE_WRAPPER`)."""
    from jdist.common.procs import mpi_shm_segments

    note = os.environ.get("JDIST_SHM_NOTE")
    if note:
        with open(note, "w") as f:
            f.writelines(f"{path}\n" for path in sorted(mpi_shm_segments([os.getpid()])))


def terminated() -> None:
    """SIGTERM on a remote rank: remove this job's MPI shared-memory names, then end at once."""
    unlink_mpi_shm()
    os._exit(128 + signal.SIGTERM)


def unlink_mpi_shm() -> None:
    """Remove the names of this job's MPICH shared-memory segments before exiting without
    ``MPI_Finalize`` (see :func:`jdist.common.procs.mpi_shm_segments`); mappings stay valid."""
    from jdist.common.procs import mpi_shm_segments

    for path in mpi_shm_segments([os.getpid()]):
        try:
            os.unlink(path)
        except OSError:
            pass
