"""Kernel lifecycle with a live cluster, on real kernels and real MPI clusters.

What a notebook user does with the Kernel menu (Shut Down, Restart, and the forced
variants that SIGKILL the kernel) must not leave ranks, their nannies, mpiexec (and hydra_pmi_proxy) or the
ipyparallel controller running. Plus a bad environment (MPI missing): one line that
names the fix.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import psutil
import pytest
from conftest import KernelSession

from jdist.errors import ClusterError
from jdist.kernel.launch.local_mpi import mpiexec_path

#: Seconds the processes of a cluster get to end after its kernel shut down or was killed: far more
#: than the mechanisms need (jupyter_client escalates to SIGTERM after 2.5 s and SIGKILL after 5 s;
#: the ranks' owner watch polls every 1 s), so only a cluster that would never end fails.
#: How fast it is: benchmarks/bench_faults.py.
CLEANUP_BOUND = 90.0

_COLLECT = (
    "import json as _j, jdist as _jd\n"
    "_c = _jd.kernel.cluster.current()\n"
    "print(_j.dumps({'ranks': [r['pid'] for r in _c.ranks],\n"
    "    'controller': _c.ipp.controller.process.pid,\n"
    "    'mpiexec': [l.process.pid for l in _c.ipp.engines.values()]}))\n"
    "del _j, _jd, _c\n"
)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (is_running also checks the start time: no PID reuse)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(f"{p.pid} (gone)")
    return "; ".join(out)


def _start_cluster(session: KernelSession) -> dict[str, Any]:
    """``%%distributed -n 2`` in ``session``; returns the cluster's processes (psutil objects)."""
    session.run("%load_ext jdist")
    session.run("%%distributed -n 2\nimport os")
    status = session.run("%dist status").stdout
    pids = json.loads(session.run(_COLLECT).stdout)
    for pid in pids["ranks"]:
        assert str(pid) in status, (pid, status)
    kernel = psutil.Process(session.km.provisioner.pid)
    named = [*pids["ranks"], pids["controller"], *pids["mpiexec"]]
    # everything the kernel started: controller and its schedulers, mpiexec (and hydra_pmi_proxy
    # or the shells around the ranks, depending on the launcher), ranks and their nannies
    procs = {p.pid: p for p in kernel.children(recursive=True)}
    for pid in named:
        procs.setdefault(pid, psutil.Process(pid))
    for pid in [pids["controller"], *pids["mpiexec"]]:
        for child in psutil.Process(pid).children(recursive=True):
            procs.setdefault(child.pid, child)
    assert any(p.name().startswith("mpiexec") for p in procs.values()), _describe(list(procs.values()))
    assert all(_alive(p) for p in procs.values()), _describe(list(procs.values()))
    return {"pids": pids, "procs": list(procs.values()), "kernel": kernel}


def _wait_all_gone(procs: list[psutil.Process], t0: float, bound: float) -> tuple[float, list[psutil.Process]]:
    """Seconds from ``t0`` until none of ``procs`` is alive (or the bound), and the survivors."""
    while True:
        left = [p for p in procs if _alive(p)]
        now = time.perf_counter()
        if not left or now - t0 > bound:
            return now - t0, left
        time.sleep(0.05)


def _kill(procs: list[psutil.Process]) -> None:
    """Clean up after a failed test: only the processes this test started, by PID."""
    for p in procs:
        try:
            if _alive(p):
                p.kill()
        except psutil.Error:
            pass


def _shutdown_status(km: Any) -> str:
    status = getattr(km, "_shutdown_status", None)
    return getattr(status, "value", str(status))


@pytest.fixture
def session(kernel_env):
    s = KernelSession(kernel_env)
    yield s
    try:
        s.kc.stop_channels()
    finally:
        if s.km.has_kernel:
            s.km.shutdown_kernel(now=True)


@pytest.mark.parametrize("now", [False, True], ids=["graceful", "forced"])
def test_kernel_restart_ends_the_old_cluster_and_a_new_one_starts(session, now):
    """JupyterLab's Restart Kernel is its Shut Down (graceful: ``now=False``) then a new kernel; ``now=True``
    SIGKILLs the kernel's process group, which does not reach the cluster (ipyparallel starts it in sessions
    of its own): then only the ranks' owner watch can end it. jdist's clean-up is the kernel's exit either
    way, so this test is also the one for a plain shutdown."""
    started = _start_cluster(session)
    procs = started["procs"]
    bound = CLEANUP_BOUND
    new_procs: list[psutil.Process] = []
    try:
        t0 = time.perf_counter()
        session.km.restart_kernel(now=now)
        call_s = time.perf_counter() - t0
        elapsed, left = _wait_all_gone(procs, t0, bound)
        assert not _alive(started["kernel"])
        assert not left, (
            f"restart_kernel(now={now}) left {len(left)}/{len(procs)} old cluster processes after {elapsed:.1f} s "
            f"(restart call {call_s:.1f} s, old kernel ended by {_shutdown_status(session.km)}): {_describe(left)}"
        )
        print(f"restart_kernel(now={now}): all {len(procs)} old cluster processes gone after {elapsed:.2f} s "
              f"(restart call {call_s:.2f} s, old kernel ended by {_shutdown_status(session.km)})")

        session.kc.wait_for_ready(timeout=60)
        assert session.value("'jdist' in dir()") is False, "the restarted kernel is a fresh one"
        session.run("%load_ext jdist")
        out = session.run("%%distributed -n 2\nprint(world_size)")
        assert out.stdout.strip().splitlines()[-1] == "2", out.stdout
        new_procs = psutil.Process(session.km.provisioner.pid).children(recursive=True)  # the new cluster
        assert len(new_procs) >= 4 and not {p.pid for p in new_procs} & {p.pid for p in procs if _alive(p)}
        assert session.run("%dist stop").stdout == "Cluster stopped.\n"
        elapsed, left = _wait_all_gone(new_procs, time.perf_counter(), CLEANUP_BOUND)
        assert not left, f"%dist stop left {_describe(left)}"
    finally:
        _kill(procs + new_procs)


def _no_mpi_env(tmp_path) -> tuple[str, str]:
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    return str(prefix), str(empty)


def test_missing_mpiexec_says_how_to_install_mpi(monkeypatch, tmp_path):
    prefix, empty = _no_mpi_env(tmp_path)
    monkeypatch.setattr(sys, "prefix", prefix)
    monkeypatch.setenv("PATH", empty)
    with pytest.raises(ClusterError) as info:
        mpiexec_path()
    msg = str(info.value)
    assert "No mpiexec found" in msg and prefix in msg, msg
    assert f"{sys.executable} -m pip install mpich mpi4py" in msg, msg


def test_missing_mpiexec_in_a_kernel_is_one_line_naming_the_fix(session, tmp_path):
    # The kernel's interpreter is this venv's, so its sys.prefix/bin has mpiexec: the cell
    # points sys.prefix and PATH at folders without one (as in an environment without MPI),
    # runs the magic, and puts them back.
    prefix, empty = _no_mpi_env(tmp_path)
    session.run("%load_ext jdist")
    session.run(
        "import os as _os, sys as _sys\n"
        f"_saved = (_sys.prefix, _os.environ['PATH']); _sys.prefix = {prefix!r}; _os.environ['PATH'] = {empty!r}"
    )
    try:
        out = session.run("%%distributed -n 2\nx = 1", allow_error=True)
    finally:
        session.run("_sys.prefix, _os.environ['PATH'] = _saved")
    shown = out.shown
    assert out.error is not None and out.error["ename"] == "ClusterError", out.error
    assert len(shown.splitlines()) == 1, f"one line, no traceback:\n{shown}"
    assert "No mpiexec found" in shown and "pip install mpich mpi4py" in shown, shown
    assert "Traceback" not in out.stderr, out.stderr
    assert session.value("jdist.kernel.cluster.current() is None") is True
    # nothing was left half-started: the kernel has no child processes
    assert psutil.Process(session.km.provisioner.pid).children(recursive=True) == []


def test_kernel_killed_after_a_rank_ended_leaves_nothing(session):
    # The state a graceful shutdown can reach when jupyter_client escalates (SIGTERM to the
    # kernel after 2.5 s, SIGKILL after 5 s) while ipyparallel is still stopping the engines:
    # one rank already ended after its SIGTERM (MPI4PY_RC_FINALIZE=false: it does not wait in
    # MPI_Finalize for its peer), the kernel gone. Made deterministic: SIGTERM to rank 1 only,
    # wait until it has ended, then SIGKILL the kernel. The other rank, mpiexec and the
    # controller must still all go.
    started = _start_cluster(session)
    procs = started["procs"]
    rank1 = psutil.Process(started["pids"]["ranks"][1])
    try:
        rank1.terminate()
        _wait_all_gone([rank1], time.perf_counter(), CLEANUP_BOUND)
        assert not _alive(rank1), "rank 1 did not end after SIGTERM"
        session.kc.stop_channels()
        t0 = time.perf_counter()
        session.km.shutdown_kernel(now=True)
        elapsed, left = _wait_all_gone(procs, t0, CLEANUP_BOUND)
        assert not left, (
            f"{len(left)}/{len(procs)} cluster processes outlived the killed kernel by {elapsed:.1f} s: {_describe(left)}"
        )
        print(f"kernel killed after rank 1 ended: all {len(procs)} cluster processes gone after {elapsed:.2f} s")
    finally:
        _kill(procs)
