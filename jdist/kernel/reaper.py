"""Ends a cluster's processes on the kernel's host when the kernel dies without stopping them.

A kernel that exits stops its cluster; one that is SIGKILLed cannot. With ranks on other hosts,
no rank can watch the kernel's PID, so the kernel starts this small process beside the cluster
(in a session of its own, so a signal to the kernel's process group does not reach it). It
waits for the kernel to end; if the cluster's plan file is still there (the kernel did not stop
it), it runs the first listed command (SIGTERM to a Slurm job step's tasks, which then remove their
MPI shared memory), sends SIGTERM to the listed processes (the controller, mpiexec or srun: each
identified by PID and start time, never by name), SIGKILLs what is left 3 s later, and runs the
other commands (``scancel`` of the job step). Remote engines then end by themselves within seconds
(their controller's heartbeat is gone). The kernel removes the plan file when it stops the
cluster, and ends this process.

    python -m jdist.kernel.reaper PLAN.json    # the kernel starts it; the plan names the owner
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jdist.common.procs import alive, identity
from jdist.common.waiting import poll_until

#: How long the listed processes get after SIGTERM before SIGKILL.
TERM_WAIT_S = 3.0


def write_plan(path: Path, owner: int, processes: list[int], commands: list[list[str]]) -> None:
    """The reaper's instructions (written whole, by rename; the reaper reads them when the owner ends)."""
    plan = {"owner": identity(owner), "processes": [], "commands": commands}
    for pid in processes:
        try:
            plan["processes"].append(identity(pid))
        except Exception:  # already gone
            pass
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan))
    os.replace(tmp, path)


def start(path: Path) -> subprocess.Popen:
    """Start the reaper for the plan at ``path`` (which must exist)."""
    return subprocess.Popen([sys.executable, "-m", "jdist.kernel.reaper", str(path)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _run(commands: list[list[str]]) -> None:
    for cmd in commands:
        try:
            subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass


def reap(plan: dict[str, Any]) -> None:
    """Run the plan's first commands (e.g. SIGTERM to a job step's tasks), SIGTERM its processes,
    SIGKILL those left after :data:`TERM_WAIT_S`, then run its last commands (``scancel``)."""
    commands = plan.get("commands", [])
    _run(commands[:1])
    procs = [p for p in plan.get("processes", []) if alive(p)]
    for p in procs:
        try:
            os.kill(int(p["pid"]), signal.SIGTERM)
        except ProcessLookupError:
            pass
    poll_until(lambda: not any(alive(p) for p in procs), TERM_WAIT_S)
    for p in procs:
        if alive(p):
            try:
                os.kill(int(p["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    _run(commands[1:])


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    try:
        owner = json.loads(path.read_text())["owner"]
    except FileNotFoundError:
        return 0  # the cluster was stopped already
    except (OSError, ValueError, KeyError):
        return 1
    try:
        fd = os.pidfd_open(int(owner["pid"]))
    except (OSError, AttributeError):
        fd = None
    while alive(owner):
        if fd is not None:
            import select

            select.select([fd], [], [], 1.0)
        else:
            time.sleep(0.2)
        if not path.exists():  # the kernel stopped the cluster
            return 0
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0  # removed: the cluster was stopped
    reap(plan)
    path.unlink(missing_ok=True)
    if path.parent.name.startswith("jdist-"):  # the cluster's private folder
        shutil.rmtree(path.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
