"""The Jupyter server extension (jdist.server): manager and REST handlers on real state.

A real ``jupyter server`` subprocess (its own config/data/runtime dirs, the repository's
jupyter-config enabling the extension) starts a real kernel for a notebook session; the kernel
starts a real 2-rank MPI cluster with ``%%distributed`` and trains; the tests read and act on
it through the REST API (with and without the token) and through a :class:`JdistManager` of
their own on the same runtime and run dirs. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest
from conftest import KernelSession, strip_ansi, wait_for
from labserver import REPO, JupyterServerProcess

from jdist.common.paths import clusters_dir
from jdist.common.procs import identity
from jdist.metrics import Run, RunLog
from jdist.protocol import STATE_VERSION
from jdist.server.manager import ActionError, JdistManager
from jdist.server.registry import is_stale, read_folder

API = "/jdist/api"
TRAIN = """%%distributed
import time
for step in range({steps}):
    time.sleep(0.05)
    jdist.log(step=step, loss=1.0 / (step + 1))
"""


class ServerKernel(KernelSession):
    """conftest's KernelSession on a kernel that the Jupyter server started (for a notebook)."""

    def __init__(self, server: JupyterServerProcess, kernel_id: str):  # no super(): no new kernel
        self.km = None
        self.kc = server.kernel_client(kernel_id)
        self.kernel_id = kernel_id

    def shutdown(self) -> None:
        self.kc.stop_channels()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = JupyterServerProcess(tmp_path_factory.mktemp("jserver"), app="server").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def session(server):
    (server.dirs["root"] / "work").mkdir()
    sess = server.new_session("work/train.ipynb")
    kernel = ServerKernel(server, sess["kernel"]["id"])
    kernel.run("%load_ext jdist")
    kernel.run("%%distributed -n 2 --timeout 30\nimport torch", timeout=240)
    kernel.killed = False
    yield kernel
    try:
        if not kernel.killed:  # else the server is restarting it: a cell would wait for it (30 s)
            kernel.run("%dist stop", timeout=30, allow_error=True)
    except Exception:
        pass
    kernel.shutdown()


def clusters(server):
    return server.get(f"{API}/clusters")["clusters"]


def runs(server, **kw):
    return server.get(f"{API}/runs", **kw)["runs"]


# -- without a cluster ----------------------------------------------------------------------
def test_endpoints_need_the_token(server):
    for method, path in [("GET", "clusters"), ("GET", "runs"), ("GET", "runs/20260101-000000-abcdef"),
                         ("GET", "sweeps"), ("GET", "sweeps/sweep-20260101-000000"),
                         ("POST", "clusters/jdist-1-x/interrupt"), ("POST", "clusters/jdist-1-x/stop")]:
        for token in (False, "wrong-token"):
            status, _ = server.request(method, f"{API}/{path}", token=token)
            assert status in (401, 403), (method, path, token, status)
    assert server.request("GET", f"{API}/clusters")[0] == 200


def test_unknown_things_are_404_and_bad_ids_rejected(server):
    status, body = server.request("POST", f"{API}/clusters/jdist-0-none/restart")
    assert status == 404 and "No running jdist cluster" in body["message"]
    status, body = server.request("GET", f"{API}/runs/20200101-000000-000000")
    assert status == 404 and "No run" in body["message"]
    assert server.request("GET", f"{API}/runs/..%2F..%2Fetc")[0] in (400, 404)
    assert server.request("GET", f"{API}/runs?limit=x")[0] == 400
    assert server.request("GET", f"{API}/sweeps?limit=x")[0] == 400
    assert server.request("GET", f"{API}/sweeps")[1] == {"sweeps": []}


def test_extension_enabled_by_the_shipped_config(server):
    assert "jdist.server | extension was successfully loaded" in server.log()
    cfg = json.loads((REPO / "jupyter-config" / "jupyter_server_config.d" / "jdist.json").read_text())
    assert cfg == {"ServerApp": {"jpserver_extensions": {"jdist.server": True}}}


# `jupyter server extension list` and `jupyter labextension list` showing jdist enabled: make check-wheel
# (tools/check_wheel.py, part of make test), on the installed wheel in a clean venv.


def test_stale_state_file_of_a_dead_kernel_is_dropped(server, tmp_path):
    # a process that existed and is gone: its PID cannot be alive with the same start time
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = identity(proc.pid)
    proc.wait()
    folder = clusters_dir(server.dirs["runtime"])
    folder.mkdir(parents=True, exist_ok=True)
    stale = folder / "jdist-dead-1.json"
    stale.write_text(json.dumps({"version": STATE_VERSION, "cluster_id": "jdist-dead-1", "kernel": ident,
                                 "controller": ident, "ranks": [], "config": {"n": 2}, "started_at": time.time()}))
    assert all(c["cluster_id"] != "jdist-dead-1" for c in clusters(server))  # never listed
    wait_for(lambda: not stale.exists(), what="the server to delete the stale state file")


def test_runs_from_the_run_log_with_lost_status(server):
    """A run log folder written by RunLog is listed; a 'running' run whose cluster is gone is 'lost'."""
    run = Run("20200101-000000-aaaaaa", world_size=2, backend="ddp", cluster_id="jdist-gone-1", total_steps=10)
    log = RunLog(run, server.dirs["runs"])
    log.append(run.add([{"rank": r, "seq": s, "step": s, "loss": 1.0 / (s + 1 + r), "step_time_s": 0.01,
                         "comm_time_s": 0.002, "compute_time_s": 0.008, "mem_bytes": 2**20, "mem_peak_bytes": 2**21}
                        for s in range(5) for r in range(2)]))
    listed = {r["run_id"]: r for r in runs(server, )}
    assert listed[run.run_id]["status"] == "lost"
    sparks = {s["key"]: s for s in listed[run.run_id]["sparks"]}  # one per panel that has a sparkline
    assert list(sparks) == ["loss", "time"] and sparks["loss"]["x"] == [0, 1, 2, 3, 4]
    assert sparks["loss"]["last"] == pytest.approx((1 / 5 + 1 / 6) / 2) and sparks["time"]["unit"] == "s"
    detail = server.get(f"{API}/runs/{run.run_id}")
    assert detail["status"] == "lost" and detail["steps_done"] == 5 and detail["total_steps"] == 10
    panels = {p["key"]: p for p in detail["panels"]}
    assert list(panels) == ["loss", "time", "memory", "throughput", "state"]
    (loss,) = panels["loss"]["series"]
    assert loss["x"] == [0, 1, 2, 3, 4] and loss["low"][0] == pytest.approx(0.5) and loss["high"][0] == 1.0
    memory = {s["name"]: s["values"] for s in panels["memory"]["series"]}
    assert panels["memory"]["categories"] == ["rank 0", "rank 1"]
    assert memory["current"] == [1.0, 1.0] and memory["peak"] == [2.0, 2.0]
    comm = next(s for s in panels["time"]["series"] if s["name"] == "communication")
    assert comm["values"] == [pytest.approx(0.002)] * 2
    run.status = "finished"
    log.close()
    assert {r["run_id"]: r for r in runs(server)}[run.run_id]["status"] == "finished"


# -- with a real cluster in a server kernel -------------------------------------------------
def test_lists_the_kernels_cluster(server, session):
    (c,) = clusters(server)
    assert c["kernel_id"] == session.kernel_id and c["managed"] is True
    assert c["notebook"] == "work/train.ipynb" and c["name"] == "train.ipynb"
    assert c["backend"] == "ddp" and c["n"] == 2 and c["status"] == "running"
    assert [r["rank"] for r in c["ranks"]] == [0, 1]
    assert [r["state"] for r in c["ranks"]] == ["idle", "idle"]
    assert c["hosts"] == [socket.gethostname()] and c["devices"] == ["cpu"]
    assert c["kernel_state"] == "idle" and c["launcher"] == "local-mpi"
    options = {o["flag"]: o for o in c["options"]}  # every cluster option, with its scope
    assert options["--timeout"]["value"] == "30" and options["--timeout"]["scope"] == "restart"
    assert options["--precision"]["value"] == "fp32" and options["--precision"]["scope"] == "live"
    # the same ids and pids as the kernel's own %dist status
    status = session.value("jdist.kernel.cluster.current().status()")
    assert c["cluster_id"] == status["cluster_id"]
    assert [r["pid"] for r in c["ranks"]] == [r["pid"] for r in status["ranks"]]
    # the state file is private to the user
    path = clusters_dir(server.dirs["runtime"]) / f"{c['cluster_id']}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_busy_ranks_live_run_and_interrupt_through_the_kernel(server, session):
    msg_id = session.start(TRAIN.format(steps=2000))
    c = wait_for(lambda: next((c for c in clusters(server) if all(r["state"] == "busy" for r in c["ranks"])), None),
                 what="ranks busy")
    assert c["kernel_state"] == "busy"
    run = wait_for(lambda: next((r for r in runs(server) if r["status"] == "running" and r["records"] > 20), None),
                   what="a running run")
    assert run["cluster_id"] == c["cluster_id"] and run["notebook"] == "work/train.ipynb"
    first = len(next(s for s in run["sparks"] if s["key"] == "loss")["y"])
    grown = wait_for(lambda: next(r for r in runs(server) if r["run_id"] == run["run_id"])["records"] > run["records"] + 20,
                     what="more records")
    assert grown
    detail = server.get(f"{API}/runs/{run['run_id']}")
    loss = detail["panels"][0]
    assert detail["status"] == "running" and loss["key"] == "loss" and loss["title"] == "loss"
    assert len(loss["series"][0]["y"]) >= first and detail["panels"][1]["categories"] == ["rank 0", "rank 1"]
    assert c["current_run"] in (None, run["run_id"])

    # restart/stop run in the kernel: refused while it is busy, with the reason
    for action in ("restart", "stop"):
        status, body = server.request("POST", f"{API}/clusters/{c['cluster_id']}/{action}")
        assert status == 409 and "busy" in body["message"], body

    status, body = server.request("POST", f"{API}/clusters/{c['cluster_id']}/interrupt")
    assert status == 200 and body["via"] == "kernel", body
    out = session.collect(msg_id, timeout=120)
    assert out.error and out.error["ename"] == "KeyboardInterrupt"
    assert "Interrupted: every rank received SIGINT and stopped" in strip_ansi(out.shown)
    after = wait_for(lambda: next((c for c in clusters(server) if c["kernel_state"] == "idle"
                                   and [r["state"] for r in c["ranks"]] == ["idle", "idle"]), None),
                     timeout=20, what="idle ranks after the interrupt")
    assert after["cluster_id"] == c["cluster_id"]  # same ranks, state kept
    assert session.value("len(jdist.last_run().records) > 0") is True
    final = server.get(f"{API}/runs/{run['run_id']}")
    assert final["status"] == "interrupted" and final["ended"] is not None
    assert final["records"] == session.value("len(jdist.last_run().records)")
    # the server learns that the kernel is idle again after session.value's reply (its IOPub status comes later):
    # once it has, an interrupt finds nothing to interrupt (CI once came first: 200, through the kernel)
    wait_for(lambda: next(x for x in clusters(server) if x["cluster_id"] == c["cluster_id"])["kernel_state"] == "idle",
             timeout=20, what="the server to see the kernel idle")
    status, body = server.request("POST", f"{API}/clusters/{c['cluster_id']}/interrupt")
    assert status == 409 and "idle" in body["message"], (status, body)


SWEEP = """%%distributed
import time
def quick(trial):
    x = trial.suggest_float("x", -1.0, 1.0)
    for step in range(3):
        time.sleep(0.15)
        jdist.log(step=step, loss=x * x + 1.0 / (step + 1))
    return x * x
"""


def test_sweeps_listed_live_then_done_with_their_view(server, session):
    """A real jdist.tune sweep in the server's kernel: listed while it runs (trials running on 2 slots), then done
    with its best trial, and its view (the notebook's HTML and SVG); a copy written "running" by a cluster that is
    gone is "lost"; bad and unknown names are refused."""
    session.run(SWEEP)
    msg_id = session.start("study = jdist.tune('quick', trials=6, name='srv-sweep', metric='loss', show=False)")
    live = wait_for(lambda: next((s for s in server.get(f"{API}/sweeps")["sweeps"] if s["name"] == "srv-sweep"
                                  and s["status"] == "running" and s["counts"].get("RUNNING")), None),
                    what="the sweep listed while it runs")
    assert live["slots"] == 2 and live["per_trial"] == 1 and live["trials"] == 6 and live["notebook"] == "work/train.ipynb"
    out = session.collect(msg_id, timeout=120)
    assert not out.error and "Sweep done: srv-sweep, 6 complete" in out.stdout, out.stdout
    (done,) = [s for s in server.get(f"{API}/sweeps")["sweeps"] if s["name"] == "srv-sweep"]
    assert done["status"] == "done" and done["counts"] == {"COMPLETE": 6} and done["ended"] >= done["started"]
    assert done["best_value"] == pytest.approx(session.value("study.best_value"))
    assert done["best_params"] == session.value("study.best_params") and done["metric"] == "loss"
    assert done["journal"].endswith("sweeps/srv-sweep/journal.log")
    detail = server.get(f"{API}/sweeps/srv-sweep")
    assert detail["status"] == "done" and detail["html"].count("<svg") >= 3 and ">slot 1<" in detail["html"]

    folder = server.dirs["runs"] / "sweeps" / "gone-sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({**done, "name": "gone-sweep", "status": "running",
                                                   "cluster_id": "jdist-gone-1", "ended": None, "notebook": None}))
    (lost,) = [s for s in server.get(f"{API}/sweeps")["sweeps"] if s["name"] == "gone-sweep"]
    assert lost["status"] == "lost" and lost["notebook"] is None
    assert server.get(f"{API}/sweeps/gone-sweep")["html"] == ""  # no view written: the summary alone
    assert server.request("GET", f"{API}/sweeps/nope")[0] == 404
    assert server.request("GET", f"{API}/sweeps/.hidden")[0] == 400


def test_a_rank_stopped_at_breakpoint_is_paused_in_the_sidebar(server, session):
    """--debug-ranks: while rank 1 waits in pdb for a line typed in the notebook, the REST API (the sidebar) lists
    it as paused and rank 0 as busy; once it continues, both are idle again."""
    seen: dict = {}

    def look() -> str:
        seen["states"] = wait_for(lambda: next(([r["state"] for r in c["ranks"]] for c in clusters(server)
                                                if "paused" in [r["state"] for r in c["ranks"]]), None),
                                  what="rank 1 listed as paused")
        return "c"

    out = session.run("%%distributed --debug-ranks 1\nimport torch.distributed as dist\nif rank == 1:\n"
                      "    breakpoint()\ndist.all_reduce(torch.ones(1))   # rank 0 waits here for rank 1",
                      replies=[look])
    assert out.prompts == ["(Pdb r1) "] and seen["states"] == ["busy", "paused"], (out.prompts, seen)
    wait_for(lambda: [r["state"] for c in clusters(server) for r in c["ranks"]] == ["idle", "idle"],
             what="both ranks idle after c")


def test_manager_on_the_same_state_without_a_server(server, session):
    """JdistManager in this process: sees the cluster, and interrupts the ranks through the controller."""
    manager = JdistManager(runtime_dirs=[server.dirs["runtime"]], run_dir=server.dirs["runs"])
    try:
        (c,) = asyncio.run(manager.clusters())
        assert c["managed"] is False and c["kernel_state"] is None
        assert c["notebook"] == str(server.dirs["root"] / "work" / "train.ipynb")  # JPY_SESSION_NAME
        assert [r["state"] for r in c["ranks"]] == ["idle", "idle"]
        with pytest.raises(ActionError) as err:
            asyncio.run(manager.stop(c["cluster_id"]))
        assert err.value.status == 409 and "not run by this Jupyter server" in err.value.message

        msg_id = session.start(TRAIN.format(steps=2000))
        wait_for(lambda: [r["state"] for r in asyncio.run(manager.clusters())[0]["ranks"]] == ["busy", "busy"],
                 what="busy ranks (manager)")
        # the training loop runs (its records arrive), so the SIGINT reaches running code
        wait_for(lambda: any(r["status"] == "running" and r["records"] > 4 for r in asyncio.run(manager.runs(limit=3))),
                 what="the training loop to log")
        result = asyncio.run(manager.interrupt(c["cluster_id"]))
        assert result["via"] == "ranks" and "SIGINT" in result["message"]
        out = session.collect(msg_id, timeout=60)
        assert out.error and out.error["ename"] == "KeyboardInterrupt"
        assert "Interrupted" in strip_ansi(out.shown)
        listed = asyncio.run(manager.runs(limit=3))
        assert listed[0]["status"] == "interrupted" and listed[0]["cluster_id"] == c["cluster_id"]
    finally:
        manager.close()


def test_restart_and_stop_run_in_the_idle_kernel(server, session):
    # the server learns that the kernel went idle from its IOPub messages: wait until it has
    (old,) = wait_for(lambda: [c for c in clusters(server) if c["kernel_state"] == "idle"], what="an idle kernel")
    old_file = clusters_dir(server.dirs["runtime"]) / f"{old['cluster_id']}.json"
    assert old_file.exists()
    status, body = server.request("POST", f"{API}/clusters/{old['cluster_id']}/restart")
    assert status == 200 and body["message"].startswith("Restarted 2 rank(s)"), body
    (new,) = clusters(server)
    assert new["cluster_id"] != old["cluster_id"] and new["kernel_id"] == old["kernel_id"]
    assert [r["state"] for r in new["ranks"]] == ["idle", "idle"]
    assert {r["pid"] for r in new["ranks"]}.isdisjoint({r["pid"] for r in old["ranks"]})
    assert not old_file.exists()
    # the kernel's own cluster object is the restarted one: %%distributed keeps working
    assert session.value("jdist.kernel.cluster.current().cluster_id") == new["cluster_id"]
    assert session.run("%%distributed\nprint(rank, world_size)").stdout.strip() == "0 2"
    # the old id is gone
    assert server.request("POST", f"{API}/clusters/{old['cluster_id']}/stop")[0] == 404

    # the cell's end reaches the server through IOPub a moment later (stop refuses a busy kernel: 409)
    wait_for(lambda: [c for c in clusters(server) if c["kernel_state"] == "idle"], what="the kernel idle again")
    status, body = server.request("POST", f"{API}/clusters/{new['cluster_id']}/stop")
    assert status == 200 and body["message"] == "Cluster stopped.", body
    assert clusters(server) == []
    assert session.value("jdist.kernel.cluster.current() is None") is True
    assert list(clusters_dir(server.dirs["runtime"]).glob("*.json")) == []


def test_killed_kernel_disappears_and_its_run_is_lost(server, session):
    session.run("%%distributed -n 2 --timeout 30\nimport time", timeout=240)
    (c,) = clusters(server)
    msg_id = session.start(TRAIN.format(steps=2000))
    run = wait_for(lambda: next((r for r in runs(server) if r["status"] == "running" and r["records"] > 4), None),
                   what="a running run")
    os.kill(c["kernel_pid"], signal.SIGKILL)
    session.killed = True  # nothing is left to stop in it
    wait_for(lambda: all(x["cluster_id"] != c["cluster_id"] for x in clusters(server)), timeout=60,
             what="the dead kernel's cluster to disappear")
    wait_for(lambda: not (clusters_dir(server.dirs["runtime"]) / f"{c['cluster_id']}.json").exists(),
             what="its state file to be deleted")
    assert next(r for r in runs(server) if r["run_id"] == run["run_id"])["status"] == "lost"
    # the ranks end themselves when their kernel is killed (jdist.rank watches the kernel)
    wait_for(lambda: not any(_alive(r["pid"]) for r in c["ranks"]), timeout=120, what="the ranks to exit")
    del msg_id


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- the prebuilt frontend -------------------------------------------------------------------
def test_prebuilt_labextension_is_current():
    """jdist/labextension was built from labextension/ as it is (tools/build_labextension.sh); no node needed."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import labextension_hash
    finally:
        sys.path.pop(0)
    assert labextension_hash.stored_hash() == labextension_hash.sources_hash(), (
        "jdist/labextension is out of date with labextension/: run `make labextension` and commit the output")
    pkg = json.loads((REPO / "jdist" / "labextension" / "package.json").read_text())
    assert pkg["name"] == "jdist"
    assert (REPO / "jdist" / "labextension" / pkg["jupyterlab"]["_build"]["load"]).is_file()
    src_pkg = json.loads((REPO / "labextension" / "package.json").read_text())
    assert src_pkg["version"] == pkg["version"]
    lock = (REPO / "labextension" / "yarn.lock").read_text()
    assert "@jupyter/builder@" in lock


def test_state_file_outside_a_kernel(tmp_path):
    """The reader side on files written by hand: other versions and broken files are skipped."""
    folder = clusters_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "a.json").write_text("{broken")
    (folder / "b.json").write_text(json.dumps({"version": 999, "cluster_id": "b"}))
    me = identity(os.getpid())
    (folder / "c.json").write_text(json.dumps({"version": STATE_VERSION, "cluster_id": "c", "kernel": me}))
    assert [d["cluster_id"] for _, d in read_folder(folder)] == ["c"]
    assert is_stale({"kernel": me}) is False
    assert is_stale({"kernel": {"pid": me["pid"], "create_time": me["create_time"] - 100}}) is True


def test_runs_are_read_safely_while_other_threads_update_them(tmp_path):
    """The server's pool threads list the runs while run views read the same live run; each
    brings the run up to date from its folder. Reading a Run while another thread adds to it
    raised "dictionary changed size during iteration" (an HTTP 500 in the run view)."""
    runs_dir = tmp_path / "runs"
    run = Run("20260101-000000-race00", world_size=4, backend="ddp", total_steps=100_000)
    log = RunLog(run, runs_dir)
    manager = JdistManager(runtime_dirs=[tmp_path / "runtime"], run_dir=runs_dir)
    errors: list[BaseException] = []
    calls = {"list": 0, "detail": 0}
    done = threading.Event()

    def write() -> None:
        seq = 0
        for _ in range(150):
            recs = []
            for _ in range(40):
                recs += [{"rank": r, "cell": 1, "seq": seq, "step": seq, "time": 1000.0 + seq, "loss": 1.0 / (seq + 1),
                          "step_time_s": 0.01, "comm_time_s": 0.002, "compute_time_s": 0.008, "mem_bytes": 1 << 20,
                          "mem_peak_bytes": 2 << 20} for r in range(4)]
                seq += 1
            log.append(recs)
        done.set()

    def read(kind: str, fn) -> None:
        while not done.is_set():
            try:
                fn()
                calls[kind] += 1
            except BaseException as exc:  # noqa: BLE001 - any error is the failure
                errors.append(exc)
                return

    threads = [threading.Thread(target=write),
               threading.Thread(target=read, args=("list", lambda: manager._list_runs(5, {}))),
               *[threading.Thread(target=read, args=("detail", lambda: manager._run_detail(run.run_id, {})))
                 for _ in range(2)]]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a race shows at once
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(old)
        manager.close()
        log.close()
    assert not errors, f"{len(errors)} error(s), first: {errors[0]!r}"
    assert calls["list"] and calls["detail"], calls  # the readers did run alongside the writer
