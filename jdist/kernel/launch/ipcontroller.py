"""The ranks' ipyparallel controller process: ipyparallel's own, with quicker heartbeats while engines register.

ipyparallel's controller registers an engine only once its heart monitor has heard the engine's
heart: after the engine's registration it pings on its next beat and takes note of the answer on
the beat after that. At the cluster's steady period (``HEARTBEAT_MS``, 200 ms) every start waited
0.2-0.4 s for that (measured: the ranks' own registration done at 2.30 s, the kernel saw them at
2.60-2.80 s). This entry point beats every :data:`STARTUP_BEAT_MS` until the cluster's ``--engines``
hearts are all beating, then at the configured period, so a start waits about 0.1 s and the
controller's idle CPU stays that of the steady period.

Used as the controller launcher's command (``jdist/kernel/cluster.py``)::

    python -m jdist.kernel.launch.ipcontroller --engines=4 [ipcontroller's own arguments]

Everything but ``--engines`` goes to ipyparallel's controller unchanged.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: The beat while engines register. Missed beats count as ipyparallel counts them, so the shorter
#: period also shortens the tolerance of an engine that registered first (150 x 50 ms = 7.5 s).
STARTUP_BEAT_MS = 50
#: How many engines the cluster starts (set by ``--engines``; the heart-monitor process reads it).
ENGINES_VAR = "JDIST_CONTROLLER_ENGINES"


def split_engines(argv: list[str]) -> tuple[int, list[str]]:
    """``--engines=N`` out of the command line: N, and ipyparallel's arguments.

    >>> split_engines(["--engines=4", "--log-level=ERROR"])
    (4, ['--log-level=ERROR'])
    >>> split_engines(["--log-level=ERROR"])
    (0, ['--log-level=ERROR'])
    """
    engines, rest = 0, []
    for arg in argv:
        if arg.startswith("--engines="):
            engines = int(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return engines, rest


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
    engines, rest = split_engines(sys.argv[1:] if argv is None else argv)
    os.environ[ENGINES_VAR] = str(engines)
    from ipyparallel.controller import app

    app.start_heartmonitor = start_heartmonitor  # what the controller's heart-monitor process runs
    sys.argv = [sys.argv[0], *rest]
    app.main()


if __name__ == "__main__":
    main()
