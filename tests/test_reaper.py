"""The reaper (jdist.kernel.reaper): ends what a SIGKILLed kernel leaves on its host. Real processes
stand in for the kernel, the controller and the launcher; the whole path on two hosts with Slurm is
tests/test_multinode.py::test_a_sigkilled_kernel_leaves_nothing_on_either_node."""

from __future__ import annotations

import signal
import subprocess
import sys

from conftest import wait_for

from jdist.common.procs import alive, identity
from jdist.kernel import reaper

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
#: A process that ignores SIGTERM (the reaper must SIGKILL it after TERM_WAIT_S).
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)"]


def test_when_the_owner_dies_the_processes_end_and_the_commands_run(tmp_path):
    work = tmp_path / "jdist-cluster"
    work.mkdir()
    owner, controller = subprocess.Popen(SLEEP), subprocess.Popen(SLEEP)
    stubborn = subprocess.Popen(STUBBORN, stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"
    first, last = tmp_path / "first", tmp_path / "last"
    plan = work / "reaper.json"
    reaper.write_plan(plan, owner.pid, [controller.pid, stubborn.pid], [["touch", str(first)], ["touch", str(last)]])
    idents = [identity(controller.pid), identity(stubborn.pid)]
    proc = reaper.start(plan)
    try:
        assert all(alive(i) for i in idents)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        wait_for(lambda: not any(alive(i) for i in idents), timeout=reaper.TERM_WAIT_S + 5, what="processes ended")
        wait_for(lambda: last.exists() and not work.exists(), timeout=5, what="commands run, folder removed")
        assert first.exists() and proc.wait(5) == 0
    finally:
        for p in (owner, controller, stubborn, proc):
            p.kill()
            p.wait()


def test_a_stopped_cluster_leaves_the_reaper_nothing_to_do(tmp_path):
    work = tmp_path / "jdist-cluster"
    work.mkdir()
    owner, controller = subprocess.Popen(SLEEP), subprocess.Popen(SLEEP)
    plan = work / "reaper.json"
    reaper.write_plan(plan, owner.pid, [controller.pid], [])
    proc = reaper.start(plan)
    try:
        plan.unlink()  # what ClusterSession.stop does (with the folder)
        assert proc.wait(5) == 0
        assert controller.poll() is None  # untouched
    finally:
        for p in (owner, controller, proc):
            p.kill()
            p.wait()
