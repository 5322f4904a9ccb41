"""Cluster lifecycle on a real MPI ipyparallel cluster (no kernel: jdist.kernel.cluster.ClusterSession
directly) with the local MPI launcher (jdist.kernel.launch.local_mpi)."""

from __future__ import annotations

import glob
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
from conftest import sigint_in_a_destructor, wait_for
from ipyparallel import interactive

from jdist.common.procs import mpi_shm_segments
from jdist.errors import ClusterError
from jdist.kernel.cluster import ClusterSession
from jdist.kernel.launch import local_mpi
from jdist.kernel.launch.local_mpi import mpiexec_path
from jdist.kernel.probes import probe, visible_gpus
from jdist.options import ClusterConfig


@pytest.fixture(autouse=True)
def _private_ipython_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path_factory.getbasetemp() / "ipython-test-cluster"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(tmp_path_factory.getbasetemp() / "ipython-test-cluster"))
        messages: list[str] = []
        c = ClusterSession(ClusterConfig(n=2, timeout=30))
        c.start(messages.append)
        c.start_messages = messages  # type: ignore[attr-defined]
        yield c
        c.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); look at its state
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_start_reports_progress_and_ranks(cluster):
    assert [r["rank"] for r in cluster.ranks] == [0, 1]
    assert {r["world_size"] for r in cluster.ranks} == {2}
    assert {r["device"] for r in cluster.ranks} == {"cpu"}
    assert cluster.start_messages[0].startswith("Starting 2 MPI rank")
    assert cluster.start_messages[-1].startswith("Ready: 2 rank(s), backend ddp")


def test_ranks_come_from_mpi_and_torch_group_matches(cluster):
    got = cluster.apply(_mpi_and_torch_ranks)
    assert got == [(0, 2, 0, 2), (1, 2, 1, 2)]


@interactive  # pickled by value: this test module is not importable on the engines
def _mpi_and_torch_ranks():
    import torch.distributed as dist
    from mpi4py import MPI

    return (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(), dist.get_rank(), dist.get_world_size())


def test_names_defined_on_ranks_and_push_pull(cluster):
    assert cluster.pull("rank") == [0, 1]
    assert cluster.pull("world_size") == [2, 2]
    cluster.push("greeting", "hi", ranks=[1])
    assert cluster.pull("greeting", ranks=[1]) == ["hi"]


@interactive
def last_ping() -> float:
    from ipyparallel.engine.app import IPEngine

    return IPEngine.instance()._hb_last_pinged


def test_the_controller_beats_at_its_period_once_every_rank_registered(cluster):
    """The controller beats quicker only while engines register (jdist/kernel/launch/ipcontroller.py):
    once all have, each rank's heart is pinged every HEARTBEAT_MS again (the controller's idle CPU)."""
    import psutil

    from jdist.kernel.cluster import HEARTBEAT_MS
    from jdist.kernel.launch import ipcontroller

    controller = psutil.Process(cluster.ipp.controller.process.pid)
    assert ipcontroller.__name__ in controller.cmdline() and "--engines=2" in controller.cmdline()
    times: list[float] = []
    end = time.monotonic() + 2
    while time.monotonic() < end:  # the engine notes each ping on its event loop, between two requests
        pinged = cluster.apply_async(last_ping, ranks=[0]).get(30)[0]
        if not times or pinged != times[-1]:
            times.append(pinged)
        time.sleep(0.01)
    gaps = sorted(b - a for a, b in zip(times[1:], times[2:]))  # the first one may have started mid-gap
    assert len(gaps) >= 5 and gaps[len(gaps) // 2] >= 0.8 * HEARTBEAT_MS / 1000, gaps


def test_status_lists_ranks_idle(cluster):
    st = cluster.status()
    assert [r["state"] for r in st["ranks"]] == ["idle", "idle"]
    assert st["config"]["n"] == 2 and st["cluster_id"].startswith("jdist-")


def test_status_shows_a_running_rank_busy(cluster):
    ar = cluster.execute("import time; print('running', flush=True); time.sleep(600)", ranks=[1])
    wait_for(lambda: [r["state"] for r in cluster.status()["ranks"]] == ["idle", "busy"], what="rank 1 busy")
    wait_for(lambda: "running" in ar.stdout[0], what="the cell running")  # before the interrupt, or it is lost
    cluster.interrupt([1])
    ar.wait(60)
    assert [r["state"] for r in cluster.status()["ranks"]] == ["idle", "idle"]


def test_stacks_are_samples_and_faulthandler_only_for_a_rank_that_holds_the_gil(cluster, tmp_path):
    """Rank 0 runs Python: its stack is its sample, read under the GIL. Rank 1 holds the GIL in C (a read() of a
    FIFO called through ctypes.PyDLL, which keeps the GIL, until the test writes to it after taking the stacks) so
    its guard's thread cannot sample it: faulthandler dumps it (SIGUSR1), which reads the frames without the GIL
    and so is never asked of a rank whose threads may be running Python (it crashed ranks: docs/reliability.md).
    Both run until the stacks are taken (a builtin summing a range ended before them, on a faster machine)."""
    done, fifo = tmp_path / "stacks-taken", tmp_path / "release-rank-1"
    os.mkfifo(fifo)
    # (each says it runs with a file: output would wait for ipykernel's IO thread, which needs the GIL)
    code = ("import ctypes, os, time\n"
            f"def ready():\n    open(os.path.join({str(tmp_path)!r}, f'ready-{{rank}}'), 'w').close()\n"
            f"def in_c():\n    fd = os.open({str(fifo)!r}, os.O_RDWR)\n    ready()\n"
            "    ctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)\n    os.close(fd)\n"
            f"def in_python():\n    ready()\n    t = time.time()\n"
            f"    while not os.path.exists({str(done)!r}) and time.time() - t < 60:\n"
            "        sum(range(1000))\n"
            "in_c() if rank == 1 else in_python()")
    for rank in (0, 1):
        (cluster.work_dir / f"rank-{rank}.txt").write_text("")  # faulthandler's file (the rank appends to it)
    ar = cluster.execute(code)
    try:
        wait_for(lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), what="the cell running on both ranks")
        stacks = cluster.stacks([0, 1])
    finally:
        done.touch()
        try:  # (rank 1 has the FIFO open once it is ready; else nothing waits on it)
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"x")
            os.close(fd)
        except OSError:
            pass
    cells = {r: [func for path, _, func in frames if "/ipykernel_" in path] for r, frames in stacks.items()}
    assert cells[0][:2] == ["in_python", "<module>"] and cells[1][:2] == ["in_c", "<module>"], (cells, stacks[1])
    assert not (cluster.work_dir / "rank-0.txt").read_text() and (cluster.work_dir / "rank-1.txt").read_text()
    ar.wait(120)


def test_a_sample_does_not_fail_a_system_call_in_c_code(cluster):
    """A watchdog sample (SIGUSR2) while rank 1 waits in C's read() of a pipe: the call goes on (SA_RESTART) and
    reads what comes 2 s later. Before, it returned -1 with EINTR at the sample, which C code that does not
    retry takes for an error (Python's own calls retry)."""
    code = ("import ctypes, os, threading\nr, w = os.pipe()\nthreading.Timer(2, os.write, (w, b'hello')).start()\n"
            "libc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(16)\n"
            "print('reading', flush=True)\ngot = (libc.read(r, buf, 16), ctypes.get_errno())")
    ar = cluster.execute(code, ranks=[1])
    wait_for(lambda: "reading" in ar.stdout[0], what="rank 1 about to read")
    assert cluster.samples([1])[1].frames  # it was sampled while it waited
    ar.wait(30)
    assert cluster.pull("got", ranks=[1]) == [(5, 0)]


def test_unknown_rank_names_valid_ranks(cluster):
    with pytest.raises(ValueError, match=r"No rank 5.*0\.\.1"):
        cluster.engine_ids([5])


def test_an_engine_unregistered_after_the_liveness_check_is_a_rank_death_not_a_key_error(cluster, monkeypatch):
    # ipyparallel's IO thread unregisters a dead engine on its own: between engine_ids' check and the send, the
    # client's ids still list it but its engine table no longer has it (seen on CI: KeyError from a jdist.tune
    # dispatch). That state is made here by hand on the real client; every way of sending must say "gone".
    from ipyparallel.util import ReverseDict

    client, eid = cluster.client, cluster.engine_of(1)
    monkeypatch.setattr(client, "_engines", ReverseDict({e: u for e, u in client._engines.items() if e != eid}))
    sends = [lambda: cluster.execute("1"), lambda: cluster.apply_async(abs, -1), lambda: cluster.push("x", 1),
             lambda: cluster.apply(abs, -1), lambda: cluster.control(1, "jdist_reply", {}),
             lambda: cluster.interrupt([1])]
    for send in sends:
        with pytest.raises(ClusterError, match=r"Rank\(s\) 1 are gone"):
            send()
    monkeypatch.undo()
    assert cluster.apply(abs, -1) == [1, 1]  # nothing was sent to rank 0 alone and left queued


def test_interrupt_stops_running_code_and_keeps_state(cluster):
    cluster.push("kept", 42)
    ar = cluster.execute("import time\nprint('running', flush=True)\nfor i in range(6000):\n    time.sleep(0.1)")
    # the cell runs on both ranks (the controller's "busy" comes as soon as the request is queued)
    wait_for(lambda: all("running" in out for out in ar.stdout), what="the cell running on both ranks")
    cluster.interrupt()
    ar.wait(60)
    assert ar.ready()
    assert {md["error"].ename for md in ar.metadata} == {"KeyboardInterrupt"}
    assert cluster.pull("kept") == [42, 42]


@pytest.mark.cluster
def test_stop_ends_every_rank_process():
    c = ClusterSession(ClusterConfig(n=2, timeout=30))
    c.start()
    pids = [r["pid"] for r in c.ranks]
    assert all(_alive(p) for p in pids)
    profile_dir, cluster_id, work_dir = c.ipp.profile_dir, c.ipp.cluster_id, c.work_dir
    mpiexec = [el.process.pid for el in c.launcher.engine_launchers()]
    launcher, by_themselves = c.launcher, []
    real = launcher.ranks_ended
    launcher.ranks_ended = lambda: (by_themselves.append(True), real())[1]
    c.stop()
    assert by_themselves == [True]  # idle ranks end their own processes (fast), nobody is signalled first
    wait_for(lambda: not any(_alive(p) for p in mpiexec), what="mpiexec to end")
    leftovers = [p for p in Path(profile_dir).rglob("*") if cluster_id in p.name]
    assert leftovers == [], "stop leaves no files of the cluster behind"
    assert not work_dir.exists()
    wait_for(lambda: not any(_alive(p) for p in pids), what="the rank processes to end")
    assert not c.running
    c.stop()  # idempotent


@pytest.mark.cluster
def test_stop_while_a_rank_and_its_nanny_were_killed_mid_cell_is_bounded(monkeypatch):
    """A rank killed with its nanny while a cell runs (a lost node, an OOM kill of its process group):
    the controller still lists its task, so the stop signals every engine through the controller, and
    the dead one never answers. The stop goes on after its bounded wait (once, a %dist stop hung here)."""
    import threading

    import jdist.kernel.cluster

    monkeypatch.setattr(jdist.kernel.cluster, "SIGNAL_WAIT_S", 2.0)
    c = ClusterSession(ClusterConfig(n=2, timeout=30))
    c.start()
    pids = [r["pid"] for r in c.ranks]
    ar = c.execute("import time; print('running', flush=True); time.sleep(600)")
    wait_for(lambda: all("running" in out for out in ar.stdout), what="the cell running on both ranks")
    victim = psutil.Process(pids[1])
    for proc in [*victim.children(recursive=True), victim]:  # the nanny is the engine's child
        proc.kill()
    stopped = threading.Event()
    threading.Thread(target=lambda: (c.stop(), stopped.set()), daemon=True).start()
    assert stopped.wait(60), "stop did not return within 60 s"
    wait_for(lambda: not any(_alive(p) for p in pids), what="the rank processes to end")


@pytest.mark.cluster
def test_a_rank_that_died_after_its_controller_names_the_controller_as_the_cause():
    """Its controller gone (in CI: it took its living kernel for gone when the wall clock was set), an engine
    leaves after missing the heartbeat for ~35 s: its death is said with the controller's end as its cause,
    not as the rank's own exit. (Rank 1 is killed here rather than waited for.)"""
    c = ClusterSession(ClusterConfig(n=2, timeout=30))
    c.start()
    try:
        controller = psutil.Process(c.controller_pid())
        for proc in [*controller.children(recursive=True), controller]:
            proc.kill()
        psutil.Process(c.ranks[1]["pid"]).kill()
        wait_for(lambda: c.dead_ranks(), what="rank 1's death seen")
        death = c.death_report(c.dead_ranks())
        assert death.cause.startswith(f"its controller (ipyparallel's, PID {controller.pid}) had ended, and an engine "
                                      "leaves once the controller's heartbeat has been gone for about 35 s (the rank: "
                                      "killed by SIGKILL"), death.cause
    finally:
        c.stop()


@pytest.mark.cluster
def test_a_killed_job_leaves_no_shared_memory_segment():
    # MPICH removes its /dev/shm segment in MPI_Finalize; a killed rank cannot. A later job whose
    # segment got the same name hung in MPI_Init (seen here, with 267 stale segments in /dev/shm).
    c = ClusterSession(ClusterConfig(n=2, timeout=30))
    c.start()
    try:
        segments = mpi_shm_segments([r["pid"] for r in c.ranks])
        assert segments, "the ranks share an MPICH shared-memory segment"
        os.kill(c.ranks[1]["pid"], signal.SIGKILL)
        wait_for(lambda: c.dead_ranks(), what="the killed rank to be seen")
        assert all(os.path.exists(p) for p in segments)  # nobody finalized MPI
    finally:
        c.stop()
    assert not any(os.path.exists(p) for p in segments)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"n": 0}, r"at least 1.*-n 2"),
        ({"n": 1000}, r"-n 64 or fewer"),
        ({"n": 2, "backend": "mpi-magic"}, r"Unknown backend.*ddp"),
        ({"n": 2, "launcher": "pbs"}, r"Unknown launcher 'pbs'.*local-mpi"),
        ({"n": 2, "timeout": 0}, r"--timeout must be positive"),
    ],
)
def test_config_errors_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClusterSession(ClusterConfig(**kwargs))


@pytest.mark.skipif(visible_gpus() >= 2, reason="this machine has GPUs")
def test_gpus_without_gpus_suggests_cpu_ranks():
    with pytest.raises(ValueError, match=r"--gpus 2 asks for 2 GPUs.*Use -n 2 to run 2 CPU ranks"):
        probe(ClusterConfig(n=2, gpus=True))


def test_mpiexec_comes_from_the_environment_not_path(monkeypatch):
    import sys

    monkeypatch.setenv("PATH", "/nonexistent")
    assert mpiexec_path() == os.path.join(sys.prefix, "bin", "mpiexec")


@pytest.mark.cluster
def test_start_failure_is_reported_with_mpiexec_output(monkeypatch):
    # An mpiexec that fails at once stands in for a broken MPI install. With --start-timeout
    # 120, a failure before that is the launcher's early-exit detection, not the timeout.
    monkeypatch.setattr(local_mpi, "local_mpiexec", lambda: "/bin/false")
    c = ClusterSession(ClusterConfig(n=2, start_timeout=120))
    with pytest.raises(ClusterError, match=r"The launch failed with 0/2 ranks registered") as info:
        c.start()
    assert "mpiexec exited" in info.value.lines
    assert not c.running and c.work_dir is None


@pytest.mark.cluster
def test_a_rank_that_ends_before_mpi_init_fails_the_start_at_once_with_its_output(monkeypatch, tmp_path):
    """mpiexec goes on waiting for the other ranks (stuck in MPI_Init): the rank's own exit is seen."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\nif os.environ.get('PMI_RANK') == '1':\n    sys.exit('rank 1: refusing to start')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    c = ClusterSession(ClusterConfig(n=2, start_timeout=120))
    with pytest.raises(ClusterError, match=r"The launch failed with [01]/2 ranks registered") as info:
        c.start()
    assert "rank 1 exited with code 1 before it registered" in info.value.lines, info.value.lines
    assert any(line.endswith("rank 1: refusing to start") for line in info.value.lines), info.value.lines  # its stderr
    assert not c.running and c.work_dir is None


@pytest.mark.cluster
def test_a_rank_that_crashes_in_its_set_up_is_named_and_the_ranks_start_once_more(monkeypatch, tmp_path):
    """Rank 1's process aborts in its set-up (after it registered) while rank 0 waits for its answer: the start
    stops at once (before, it waited out --timeout and 60 s more, as rank 0 waited in MPI for a rank that ended
    early in its set-up: 90 s here), says the rank, how it ended and where it crashed (its faulthandler report),
    and starts the ranks once more, which now come up. (In full test runs a new TF rank was killed by SIGSEGV in
    its set-up, about once in 15 runs, where nothing had said why: faulthandler's set-up dumps, since replaced by
    a thread of jdist's, which test_a_set_up_that_does_not_end_names_where_each_rank_waits reads.) A second crash in
    a row:
    test_a_second_crash_in_set_up_fails_the_start_with_both_said."""
    crashes = tmp_path / "crashes"
    crashes.mkdir()
    (tmp_path / "sitecustomize.py").write_text(
        "import os, resource, socket, sys\nif os.environ.get('PMI_RANK') == '1':\n"
        "    lookup = socket.gethostname\n"
        "    def gone():\n"
        f"        if sys._getframe(1).f_code.co_name == 'watch_owner' and not os.listdir({str(crashes)!r}):\n"
        f"            open(os.path.join({str(crashes)!r}, 'once'), 'w').close()  # the set-up's last step, once\n"
        "            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        "            os.write(2, b'fatal: last words\\n')\n"
        "            os.abort()\n"
        "        return lookup()\n"
        "    socket.gethostname = gone\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    c = ClusterSession(ClusterConfig(n=2, timeout=30))
    said: list[str] = []
    try:
        assert c.start(said.append) and c.running
        retries = [line.splitlines() for line in said if "Starting the ranks once more" in line]
        assert len(retries) == 1, said
        lines = retries[0]
        assert lines[:4] == ["rank 1 was killed by SIGABRT (Aborted) during its set-up",
                             "Rank 1's last output on stderr, not shown before it died:", "  fatal: last words",
                             "Rank 1 crashed (Fatal Python error: Aborted) here, innermost call last:"], lines
        assert lines[-3].endswith(", in watch_owner") and lines[-2].endswith(", in gone"), lines
        assert lines[4].endswith(", in __call__") and "ipyparallel" not in "\n".join(lines), lines  # from jdist's in
        assert lines[-1] == ("Starting the ranks once more: a crash in their set-up can be a one-off (a second one "
                             "fails the start)..."), lines  # the ranks' output comes with a failed start only
        assert said[-1].startswith("Ready: 2 rank(s)"), said
        assert c.pull("rank") == [0, 1]
    finally:
        c.stop()


def test_a_second_crash_in_set_up_fails_the_start_with_both_said(monkeypatch):
    """The start's one retry (the crash itself: the test above), with the ranks' starts replaced: a second crash
    fails the start with the crash's lines; a rank that ended otherwise (an exit code) is no reason to retry."""
    from jdist.kernel.cluster import _SETUP_OUTPUT, _SetupCrash

    crash = ClusterError("Setting up backend 'ddp' on the ranks failed: a rank's process ended.",
                         "rank 1 was killed by SIGSEGV (Segmentation fault) during its set-up", _SETUP_OUTPUT, "out")
    starts: list[int] = []

    def crashes(self, say):
        starts.append(1)
        raise _SetupCrash(crash)

    monkeypatch.setattr(ClusterSession, "_start", crashes)
    said: list[str] = []
    with pytest.raises(ClusterError) as info:
        ClusterSession(ClusterConfig(n=2)).start(said.append)
    assert info.value.lines == [crash.lines[0], "A rank crashed in the ranks' first start too (said above).",
                                *crash.lines[1:]]
    assert len(starts) == 2 and said == [crash.lines[1] + "\nStarting the ranks once more: a crash in their set-up "
                                         "can be a one-off (a second one fails the start)..."], said

    def exits(self, say):
        starts.append(1)
        raise ClusterError("rank 1 exited with code 3 during its set-up")

    starts.clear()
    monkeypatch.setattr(ClusterSession, "_start", exits)
    with pytest.raises(ClusterError, match="exited with code 3"):
        ClusterSession(ClusterConfig(n=2)).start()
    assert len(starts) == 1


@pytest.mark.parametrize("status, crashed", [("134", True), ("139", True), ("3", False), ("137", False),
                                             ("130", False), ("", False)])
def test_only_a_crash_signal_is_a_crash(tmp_path, status, crashed):
    """The exit status the shell around a local rank writes (128+N: signal N): a crash is a fault of the process
    itself (SIGABRT, SIGSEGV...), not an exit code, SIGKILL or SIGINT (someone ended it), nor a status being
    written."""
    from jdist.kernel.launch.local_mpi import LocalMPILauncher

    (tmp_path / "exit-1").write_text(status)
    assert LocalMPILauncher(ClusterConfig(n=2), tmp_path).crashed() is crashed


@pytest.mark.cluster
def test_a_set_up_that_does_not_end_names_where_each_rank_waits(monkeypatch, tmp_path):
    """Rank 1 stalls in its set-up (its host name lookup in mpi_world sleeps), so rank 0 waits for it in
    MPI's allgather: the start fails when --timeout and the slack have passed, with where each rank
    was at its newest stack dump (one every --timeout s), instead of ipyparallel's "Result not ready."
    (seen once in a clean clone's test run, with no clue where)."""
    import jdist.kernel.cluster as cluster_module

    (tmp_path / "sitecustomize.py").write_text(
        "import os, socket, sys, time\nif os.environ.get('PMI_RANK') == '1':\n"
        "    lookup = socket.gethostname\n"
        "    def slow_gethostname():\n"
        "        if sys._getframe(1).f_code.co_name == 'mpi_world':\n"
        "            time.sleep(60)\n"
        "        return lookup()\n"
        "    socket.gethostname = slow_gethostname\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(cluster_module, "SETUP_SLACK_S", 3.0)
    c = ClusterSession(ClusterConfig(n=2, timeout=2))
    with pytest.raises(ClusterError) as info:
        c.start()
    lines = info.value.lines
    assert lines[0].startswith("Setting up backend 'ddp' on the ranks did not end within 5 s "
                               "(--timeout 2 and 3 s more): 2 of 2 rank(s) still at it."), lines
    text = "\n".join(lines)
    assert "Rank 0 (process " in text and "Rank 1 (process " in text, text
    # the newest of the stacks each rank writes every --timeout s: 4 s in (2 s under load: the second not yet)
    assert sorted(re.findall(r"Rank \d \(process \d+\), (\d) s into its set-up \(innermost call last\)", text)) in (
        ["2", "2"], ["2", "4"], ["4", "4"]), text
    assert text.count("in mpi_world") == 2 and text.count("in slow_gethostname") == 1, text  # rank 0 waits in MPI
    assert text.index("Rank 1 (") < text.index("in slow_gethostname"), text
    assert "kernelbase.py" not in text, text  # the set-up's frames, not the engine's around them
    assert not c.running and c.work_dir is None


@pytest.mark.cluster
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped interrupt
def test_a_ctrl_c_that_python_dropped_during_the_set_up_stops_the_start(monkeypatch):
    """A SIGINT whose KeyboardInterrupt Python drops (it lands in a destructor, as in pyzmq's Frame.__dealloc__
    while the start polls) still stops the start at its next look, which ends what it started; before, the
    start went on to the end (or to --timeout + 60 s for a set-up that does not end)."""
    real = ClusterSession._setup_ranks

    def dropped_first(self, check):
        sigint_in_a_destructor()
        return real(self, check)

    monkeypatch.setattr(ClusterSession, "_setup_ranks", dropped_first)
    c = ClusterSession(ClusterConfig(n=2, timeout=30))
    with pytest.raises(KeyboardInterrupt):
        c.start()
    assert not c.running and c.work_dir is None


@pytest.mark.cluster
def test_a_start_that_times_out_leaves_no_process_of_the_job(monkeypatch):
    # The ranks cannot register within 0.5 s: start() fails while they start (in MPI_Init or
    # registering). Every process noted under mpiexec must be gone after the failed start.
    from jdist.common.procs import alive

    noted = []
    stop = local_mpi.LocalMPILauncher.stop

    def spy(self):
        noted.extend(self.job_processes())
        stop(self)

    monkeypatch.setattr(local_mpi.LocalMPILauncher, "stop", spy)
    segments = set(glob.glob("/dev/shm/mpich_shm_*"))
    c = ClusterSession(ClusterConfig(n=2, start_timeout=0.5))
    with pytest.raises(ClusterError, match="registered within"):
        c.start()
    assert len(noted) >= 2, noted  # at least the two rank processes were seen
    assert not [p for p in noted if alive(p)]
    # a later job could hang on a leftover; segments that other jobs (another test worker's) hold are theirs
    new = set(glob.glob("/dev/shm/mpich_shm_*")) - segments
    assert not new - mpi_shm_segments(psutil.pids()), new
    assert not c.running and c.work_dir is None


@pytest.mark.cluster
@pytest.mark.parametrize("ranks_first", [False, True], ids=["ranks-alive", "ranks-killed-first"])
def test_ranks_and_controller_end_when_the_kernel_is_killed(tmp_path, ranks_first):
    # A kernel killed with SIGKILL cannot stop its cluster: the ranks must notice and clean up, and
    # the controller ends itself when no rank is left to end it (ranks killed first; a start cut short)
    import signal
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from jdist.kernel.cluster import ClusterSession\n"
        "from jdist.options import ClusterConfig\n"
        "c = ClusterSession(ClusterConfig(n=2, timeout=30)); c.start()\n"
        "mpiexec = [l.process.pid for l in c.ipp.engines.values()]\n"
        "print(json.dumps([r['pid'] for r in c.ranks] + [c.ipp.controller.process.pid] + mpiexec), flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "IPYTHONDIR": str(tmp_path)}
    owner = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    try:
        import json

        pids = json.loads(owner.stdout.readline())
        assert all(_alive(p) for p in pids)
        if ranks_first:
            ranks = [psutil.Process(p) for p in pids[:2]]
            for proc in [*ranks, *(child for r in ranks for child in r.children(recursive=True))]:
                proc.kill()
            wait_for(lambda: not any(_alive(p) for p in pids[:2]), what="the killed ranks to end")
        owner.send_signal(signal.SIGKILL)
        owner.wait(60)
        wait_for(lambda: not any(_alive(p) for p in pids), timeout=120,
                 what="ranks, mpiexec and controller to end after their owner")
    finally:
        if owner.poll() is None:
            owner.kill()
