"""The ranks' ipyparallel controller process: ipyparallel's own, with quicker heartbeats while engines register.

ipyparallel's controller registers an engine only once its heart monitor has heard the engine's
heart: after the engine's registration it pings on its next beat and takes note of the answer on
the beat after that. At the cluster's steady period (``HEARTBEAT_MS``, 200 ms) every start waited
0.2-0.4 s for that (measured: the ranks' own registration done at 2.30 s, the kernel saw them at
2.60-2.80 s). This entry point beats every :data:`STARTUP_BEAT_MS` until the cluster's ``--engines``
hearts are all beating, then at the configured period, so a start waits about 0.1 s and the
controller's idle CPU stays that of the steady period.

It also watches the process that owns the cluster (``--owner-file``: a file holding its PID and start
time, rewritten when another process attaches the cluster): once that process is gone, the controller
ends itself and its scheduler processes. The ranks end it too when their owner dies (rank 0), but a
cluster whose ranks died first, or never started, used to leave it running.

Used as the controller launcher's command (``jdist/kernel/cluster.py``)::

    python -m jdist.kernel.launch.ipcontroller --engines=4 --owner-file=PATH [ipcontroller's own arguments]

Everything but ``--engines`` and ``--owner-file`` goes to ipyparallel's controller unchanged.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: The beat while engines register. Missed beats count as ipyparallel counts them, so the shorter
#: period also shortens the tolerance of an engine that registered first (150 x 50 ms = 7.5 s).
STARTUP_BEAT_MS = 50
#: How many engines the cluster starts (set by ``--engines``; the heart-monitor process reads it).
ENGINES_VAR = "JDIST_CONTROLLER_ENGINES"


#: Seconds between two looks at the owner.
OWNER_POLL_S = 1.0


def split_engines(argv: list[str]) -> tuple[int, str | None, list[str]]:
    """``--engines=N`` and ``--owner-file=PATH`` out of the command line: N, PATH, ipyparallel's arguments.

    >>> split_engines(["--engines=4", "--owner-file=/tmp/x/owner", "--log-level=ERROR"])
    (4, '/tmp/x/owner', ['--log-level=ERROR'])
    >>> split_engines(["--log-level=ERROR"])
    (0, None, ['--log-level=ERROR'])
    """
    engines, owner, rest = 0, None, []
    for arg in argv:
        if arg.startswith("--engines="):
            engines = int(arg.split("=", 1)[1])
        elif arg.startswith("--owner-file="):
            owner = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return engines, owner, rest


def write_owner(path: Path, pid: int) -> None:
    """Note process ``pid`` (of this host) as the cluster's owner in ``path``, whole (by rename)."""
    from jdist.common.procs import started

    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid} {started(pid)}\n")
    os.replace(tmp, path)


def owner_alive(path: Path) -> bool:
    """Whether the process noted in ``path`` still runs (the same process: PID and start time). No file:
    the owner's stop removed the cluster's folder, or the owner is gone."""
    from jdist.common.procs import alive

    try:
        pid, created = path.read_text().split()
    except (OSError, ValueError):
        return False
    return alive({"pid": int(pid), "create_time": float(created)})


def watch_owner(path: Path) -> None:
    """End this controller and its schedulers once the owner noted in ``path`` is gone."""

    def watch() -> None:
        while owner_alive(path):
            time.sleep(OWNER_POLL_S)
        import psutil

        children = psutil.Process().children(recursive=True)
        for child in children:
            try:
                child.terminate()
            except psutil.Error:
                pass
        for child in psutil.wait_procs(children, timeout=3)[1]:
            try:
                child.kill()
            except psutil.Error:
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="jdist-owner-watch", daemon=True).start()


def next_period(hearts: int, engines: int, period_ms: int) -> int:
    """The heart monitor's next beat (ms): quick until ``engines`` hearts beat, then its own period.

    >>> next_period(1, 2, 200), next_period(2, 2, 200), next_period(0, 0, 200)
    (50, 200, 200)
    """
    return STARTUP_BEAT_MS if hearts < engines else period_ms


def start_heartmonitor(**kwargs: Any) -> None:
    """ipyparallel's ``start_heartmonitor`` (the target of the controller's heart-monitor process),
    with the beat period of :func:`next_period` until every engine's heart has beaten once; from
    then on the configured one, also after an engine dies. A function of this module, so the
    process finds it whether it is forked or spawned."""
    from ipyparallel.controller import heartmonitor

    engines = int(os.environ.get(ENGINES_VAR, "0"))
    beat = heartmonitor.HeartMonitor.beat
    registering = [True]

    def adaptive_beat(self: Any) -> None:
        beat(self)
        if registering[0]:
            self.caller.callback_time = next_period(len(self.hearts), engines, self.period)
            registering[0] = self.caller.callback_time != self.period

    heartmonitor.HeartMonitor.beat = adaptive_beat
    heartmonitor.start_heartmonitor(**kwargs)


def main(argv: list[str] | None = None) -> None:
    engines, owner, rest = split_engines(sys.argv[1:] if argv is None else argv)
    os.environ[ENGINES_VAR] = str(engines)
    if owner is not None:
        watch_owner(Path(owner))
    from ipyparallel.controller import app

    app.start_heartmonitor = start_heartmonitor  # what the controller's heart-monitor process runs
    sys.argv = [sys.argv[0], *rest]
    app.main()


if __name__ == "__main__":
    main()
