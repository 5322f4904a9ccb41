"""Ranks on two hosts: ``--hosts`` over ssh and ``--slurm``, on the two-node test bed.

The bed (tools/testbed.py) makes two nodes on this machine from network, UTS, PID and mount
namespaces, each with its own sshd and slurmd (node1 also runs slurmctld and munged). The
kernel under test runs on node1, like a kernel on an HPC login node; this test process drives
it over ipc sockets in the shared build folder. Nothing is mocked: real ssh, real Slurm, real
MPI across a veth pair, real gloo between the hosts.

Skipped, with one line saying why, where the bed cannot be made (not root, no namespaces,
Slurm/sshd not installed: ``make test`` installs them with tools/install_testbed.sh).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import KernelSession, Panel, strip_ansi, wait_for

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import testbed  # noqa: E402

from jdist.kernel.launch import ipcontroller  # noqa: E402

pytestmark = pytest.mark.cluster
STATE = ROOT / "build" / "testbed"


@pytest.fixture(scope="module")
def bed():
    why = testbed.unavailable()
    if why:
        pytest.skip(f"multi-node tests: {why}")
    b = testbed.Testbed(STATE)
    t0 = time.perf_counter()
    b.up()
    b.up_seconds = time.perf_counter() - t0
    yield b
    b.down()


class NodeKernel(KernelSession):
    """A Jupyter kernel started on a node of the bed (nsenter), reached over ipc sockets."""

    def __init__(self, bed: Any, node: str, name: str, prefix: tuple[str, ...] = (),
                 extra_env: dict[str, str] | None = None):
        from jupyter_client.manager import KernelManager

        self.bed = bed
        base = STATE / "kernels" / name
        for sub in ("ipython", "runs", "runtime"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(IPYTHONDIR=str(base / "ipython"), JDIST_RUN_DIR=str(base / "runs"),
                   JUPYTER_RUNTIME_DIR=str(base / "runtime"), PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(ROOT / "tests"))
        env.update(extra_env or {})

        class OnNode(KernelManager):
            def format_kernel_cmd(self, extra_arguments: Any = None) -> list[str]:
                return bed.command(node, [*prefix, *super().format_kernel_cmd(extra_arguments)], cwd=str(ROOT))

        km = OnNode(kernel_name="python3", transport="ipc", ip=str(base / "runtime" / "kernel-ipc"),
                    connection_file=str(base / "runtime" / "kernel.json"))
        km.kernel_spec.interrupt_mode = "message"  # the launched process is nsenter, not the kernel
        km.start_kernel(env=env)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        self.km, self.kc = km, kc

    def pid(self) -> int:
        """The kernel's PID as this machine numbers it (the child of nsenter)."""
        nsenter = self.km.provisioner.process.pid
        return int(Path(f"/proc/{nsenter}/task/{nsenter}/children").read_text().split()[0])


@pytest.fixture(scope="module")
def login(bed):
    """A kernel on node1 with jdist loaded."""
    k = NodeKernel(bed, "node1", "login")
    k.run("%load_ext jdist")
    yield k
    k.run("%dist stop", allow_error=True)
    k.shutdown()


def on_node(bed: Any, node: str, script: str) -> str:
    proc = bed.run(node, ["sh", "-c", script], timeout=30)
    return proc.stdout


def engines_on(bed: Any, node: str) -> list[str]:
    """PIDs (in the node's numbering) of ipyparallel engines running on ``node``."""
    out = on_node(bed, node, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
                             "grep -q '^[^ ]*python[^ ]* -c .*ipyparallel.engine' && basename $p; done; true")
    return out.split()


def shm_on(bed: Any, node: str) -> list[str]:
    """MPI shared-memory segments in ``node``'s /dev/shm."""
    return [name for name in on_node(bed, node, "ls /dev/shm").split() if name.startswith("mpich_shm_")]


TRAIN = """\
import torch, torch.nn as nn
torch.manual_seed(0)
model = jdist.prepare(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
for step in range(20):
    x = torch.randn(16, 8, generator=g)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    jdist.log(step=step, loss=loss)
import socket
weights = float(sum(p.detach().sum() for p in model.parameters()))
where = (rank, socket.gethostname(), local_rank, os.environ.get("GLOO_SOCKET_IFNAME"))
"""


SLOT_OBJECTIVE = """%%distributed
import socket, torch.distributed as dist
def on_host(trial):
    x = trial.suggest_float("x", -1.0, 1.0)
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)                          # slot ranks 0 + 1: the slot is the default group
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("slot", [dist.get_world_size(), t.item()])
    return x * x
"""


def ready(out: Any) -> str:
    """The start time the cell printed ("ready after 3.8 s")."""
    m = re.search(r"Ready: .*\(([\d.]+) s\)", out.stdout)
    return f"ready after {m.group(1)} s" if m else "no start time printed"


def check_training(k: KernelSession, n: int) -> list[tuple]:
    counts = k.value(f"[jdist.last_run().count(r) for r in range({n})]")
    assert counts == [20] * n, counts  # every rank's records came back over the network
    k.run("import os\n%dist pull weights\n%dist pull where")
    weights = k.value("weights")
    assert len(weights) == n and max(weights) - min(weights) < 1e-5, weights  # DDP kept the replicas equal
    return [tuple(w) for w in k.value("where")]


#: The controller's command line names its module (ipyparallel's controller, run by jdist's entry point).
CONTROLLER = ipcontroller.__name__
#: Listeners that are not jdist's own: the launchers' (documented in docs/multinode.md) and the bed's daemons.
NOT_JDIST = ("mpiexec.hydra", "hydra_pmi_proxy", "srun", "sshd", "slurmd", "slurmctld", "slurmstepd", "munged")


def listeners(bed: Any, node: str) -> list[tuple[str, str]]:
    """(local address:port, process name) of every listening TCP socket on ``node``."""
    out = on_node(bed, node, "ss -ltnpH")
    rows = []
    for line in out.splitlines():
        parts = line.split()
        users = re.findall(r'\("([^"]+)",pid=(\d+)', line)
        m = re.search(r'users:\(\("([^"]+)",pid=(\d+)', line)
        name = m.group(1) if m else "?"
        launcher = [u for u, _ in users if u in NOT_JDIST]
        if launcher:  # hydra's control port, inherited by the ranks it forks on its own host
            name = launcher[0]
        elif m and name.startswith("python"):
            cmd = on_node(bed, node, f"tr '\\0' ' ' < /proc/{m.group(2)}/cmdline")
            name = ("controller" if CONTROLLER in cmd else "rank" if "ipyparallel.engine" in cmd
                    else "debugpy" if "/debugpy/" in cmd else cmd[:60])
        rows.append((parts[3], name))
    return rows


def test_slurm_job_step_trains_ddp_with_two_ranks_per_node(bed, login):
    out = login.run(f"%%distributed --slurm -N 2 -n 4 --timeout 30\nimport os\n{TRAIN}", timeout=240)
    assert "Slurm job step" in out.stdout, out.stdout
    where = check_training(login, 4)
    assert [(r, h, lr) for r, h, lr, _ in where] == [(0, "node1", 0), (1, "node1", 1), (2, "node2", 0),
                                                       (3, "node2", 1)]
    # the job step came back from the ranks (RankInfo["launcher"]) to the launcher, which cancels it if need be
    assert login.value("__import__('jdist.kernel.cluster', fromlist=['x']).current().launcher.step")

    # a sweep: slots of 2 ranks are one per node (a slot's ranks share a host: its group meets on the node's
    # loopback); within a trial the slot is the default group; the 4-rank world group is back afterwards
    login.run(SLOT_OBJECTIVE)
    bad = login.run("jdist.tune('on_host', trials=2, per_trial=4)", allow_error=True)
    assert bad.error and "Slot 0 (ranks 0, 1, 2, 3) would span hosts node1, node2" in bad.error["evalue"], bad.error
    assert "Use per_trial=1 or 2" in bad.error["evalue"]
    login.run("study = jdist.tune('on_host', trials=6, per_trial=2, show=False)", timeout=120)
    seen = login.value("sorted({(t.user_attrs['jdist_slot'], t.user_attrs['host'], tuple(t.user_attrs['slot'])) "
                       "for t in study.trials if t.state.name == 'COMPLETE'})")
    assert seen == [(0, "node1", (2, 1.0)), (1, "node2", (2, 1.0))], seen
    login.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t); after = (dist.get_world_size(), t.item())")
    login.run("%dist pull after")
    assert [tuple(a) for a in login.value("after")] == [(4, 4.0)] * 4

    # Slurm ends the whole step (scancel, the time limit, a node failure): slurmstepd kills every process of it, the
    # shells around the ranks and their watchers too. The error says what Slurm said; the stop does not wait for
    # ranks that are gone; the next ranks on the nodes remove what the killed ones left
    step = login.value("__import__('jdist.kernel.cluster', fromlist=['x']).current().launcher.step")
    files = "ls /tmp | grep -E '^jdist-(shm|stderr)-'; true"
    left = {node: set(shm_on(bed, node)) | set(on_node(bed, node, files).split()) for node in bed.nodes}
    assert all(len(left[node]) == 1 + 2 * 3 for node in bed.nodes), left  # a segment; per rank a note, stderr, .pos
    msg = login.start("%%distributed\nprint('waiting', flush=True)\n__import__('time').sleep(60)")
    login.wait_for_stdout(msg, "waiting", timeout=30)
    bed.run("node1", ["scancel", "--signal=KILL", step])
    killed = login.collect(msg, timeout=60)
    text = strip_ansi(killed.traceback)
    # (slurmstepd's "*** STEP 1.0 ON node1 CANCELLED AT ... ***" reaches srun's output in some runs, not in others)
    assert re.search(rf"rank \d died: Slurm ended the job step (\(STEP {re.escape(step)} ON node\d CANCELLED AT |"
                     rf"{re.escape(step)} \(srun: \"Force Terminated\")", text), text
    assert all(left[node] <= set(shm_on(bed, node)) | set(on_node(bed, node, files).split()) for node in bed.nodes)
    t0 = time.perf_counter()
    login.run("%dist stop")  # (it skips ranks that are gone: it waited 10 s for their nannies' answer)
    gone_s = time.perf_counter() - t0
    login.run("%%distributed --slurm -N 2 -n 2 --timeout 30\nx = 1", timeout=240)  # a rank on each node
    now = {node: set(shm_on(bed, node)) | set(on_node(bed, node, files).split()) for node in bed.nodes}
    assert not any(left[node] & now[node] for node in bed.nodes), (left, now)
    assert all(len(now[node]) == 1 + 3 for node in bed.nodes), now  # the new rank's own
    t0 = time.perf_counter()
    login.run("%dist stop")
    stop_s = time.perf_counter() - t0
    wait_for(lambda: not on_node(bed, "node1", "squeue -h").strip(), timeout=15, what="no Slurm job left")
    assert not engines_on(bed, "node1") and not engines_on(bed, "node2")
    print(f"\n--slurm 2 nodes x 2 ranks: {ready(out)}, start+cell {out.elapsed:.1f} s, stop {stop_s:.2f} s; "
          f"%dist stop after the step was cancelled: {gone_s:.2f} s")


def test_all_ranks_on_the_other_node(bed, login):
    login.run("%%distributed --hosts node2:2 --timeout 30\nimport os\n" + TRAIN, timeout=240)
    where = check_training(login, 2)
    assert [(r, h, lr) for r, h, lr, _ in where] == [(0, "node2", 0), (1, "node2", 1)]
    login.run("%dist stop")


def encrypted(login) -> bool:
    """Whether the current cluster's controller gave its engines a CurveZMQ key (``--encrypt``)."""
    profile = login.value("__import__('jdist.kernel.cluster', fromlist=['x']).current().ipp.profile_dir")
    info = list((Path(profile) / "security").glob("ipcontroller-jdist-*-engine.json"))
    return bool(info) and all("curve_serverkey" in p.read_text() and '"curve_serverkey": null' not in p.read_text()
                              for p in info)


def test_restart_and_auto_restart_with_remote_ranks_keep_the_controller_traffic_encrypted(bed, login):
    # its own cluster, not the SHARED one below: %dist restart replays every set-up cell the cluster ran
    # (the shared one's include the debugger test's breakpoint cells), and a rank dies here. --encrypt here, so
    # that the SHARED cluster has the default (and a restart is seen to keep the encryption)
    login.run("%%distributed --hosts node1:1,node2:1 --timeout 30 --auto-restart --encrypt\nimport os, time\n"
              "import torch.distributed as dist\ndist.barrier()\nbase = 41")
    login.run("%dist pull base")
    assert login.value("base") == [41, 41]
    assert encrypted(login)
    login.run("%dist restart")  # replays the set-up cell on new ranks, on both hosts again
    login.run("%dist pull base\nfrom jdist.kernel import cluster as _c\n"
              "hosts = [r['host'] for r in _c.current().ranks]")
    assert login.value("base") == [41, 41] and login.value("hosts") == ["node1", "node2"]
    assert encrypted(login)
    # rank 1 on node2 writes to fd 2 and crashes in C at once: what it wrote (left in a file of node2 by the rank)
    # and its stack come back over ssh in hydra's output
    out = login.run("%%distributed\nimport ctypes\nif rank == 1:\n    os.write(2, b'fatal: remote last words\\n')\n"
                    "    ctypes.string_at(0)\ntime.sleep(60)", allow_error=True, timeout=120)
    shown = strip_ansi(out.stdout + out.stderr + out.shown)
    assert "rank 1 died: killed by SIGSEGV" in shown and "restarting (--auto-restart)" in shown, shown
    assert "Rank 1's last output on stderr, not shown before it died:\n  fatal: remote last words\n" \
           "Rank 1 crashed (Fatal Python error: Segmentation fault) here, innermost call last:\n" \
           "  cell line 4, in <module>" in shown, shown
    login.run("%dist pull base")
    assert login.value("base") == [41, 41]
    # a healthy --hosts cluster's %dist stop ends the ranks on both nodes (the remote one over ssh)
    t0 = time.perf_counter()
    login.run("%dist stop")
    stop_s = time.perf_counter() - t0
    wait_for(lambda: not engines_on(bed, "node2") and not engines_on(bed, "node1"), timeout=15,
             what="no engine left on either node")
    print(f"\n--hosts 2 nodes x 1 rank: stop {stop_s:.2f} s")


def test_the_bed_names_each_node_on_127_0_1_1_like_debian(bed):
    # gloo's classic trap: a rank that resolved its own name would use loopback between hosts
    assert on_node(bed, "node2", "getent hosts node2").split()[0] == "127.0.1.1"
    assert on_node(bed, "node1", "getent hosts node2").split()[0] == "198.18.0.2"


@pytest.mark.parametrize("line, says", [
    ("--hosts nosuchhost:1,node2:1", "Host 'nosuchhost' does not resolve here"),
    ("--hosts node2:1 -n 3", "has room for 1 rank(s), but -n 3 asks for 3"),
    ("--hosts node2:1 --iface nosuch0", "--iface nosuch0: no such interface"),
    ("--hosts node2:1 --ip 10.9.9.9", "--ip 10.9.9.9 is not an address of this machine"),
    ("--slurm -N 3 -n 2", "-N 3: give 1 to 2 nodes for -n 2"),
])
def test_bad_multi_node_input_is_one_line_before_anything_starts(bed, login, line, says):
    out = login.run(f"%%distributed {line}\npass", allow_error=True, timeout=60)
    shown = strip_ansi(out.shown)
    assert says in shown, shown
    assert "Traceback" not in shown and len(shown.strip().splitlines()) == 1, shown
    assert not engines_on(bed, "node1") and not engines_on(bed, "node2")


def test_a_host_ssh_cannot_reach_is_named(bed, login):
    # node2 answers on 198.18.0.2:22 only; its name on another address would be a host ssh cannot reach
    out = login.run("%%distributed --hosts 198.18.0.2:1,198.18.0.9:1 --ip 198.18.0.1\npass", allow_error=True,
                    timeout=120)
    shown = strip_ansi(out.shown)
    assert "host 198.18.0.9: ssh cannot reach it" in shown and "host 198.18.0.2" not in shown, shown


#: The tests from here to the killed-rank test run on one ``--hosts`` cluster: each starts with a cell
#: giving these same options (a ``%%distributed`` cell with the running cluster's options reuses it), so
#: each also runs alone, and the suite starts the ranks once. Nothing in between stops the cluster or
#: kills a rank; the killed-rank test comes last, and then stops it and checks that nothing is left.
#: They come after the other tests of the ``login`` kernel: the debugger test attaches the notebook's
#: Debugger panel to that kernel, which stays traced (slower, more CPU) for the rest of its life.
SHARED = "--hosts node1:1,node2:1 --timeout 30"


def test_hosts_over_ssh_trains_ddp_across_two_nodes(bed, login):
    out = login.run(f"%%distributed {SHARED}\nimport os\n{TRAIN}", timeout=240)
    assert "over ssh" in out.stdout, out.stdout
    where = check_training(login, 2)
    assert [(r, h, lr) for r, h, lr, _ in where] == [(0, "node1", 0), (1, "node2", 0)]
    assert {iface for *_, iface in where} == {"jdtb1", "jdtb2"}  # never lo between hosts
    # the dashboard's per-rank panels and the run log name each rank's host
    assert login.value("jdist.last_run().hosts") == {0: "node1", 1: "node2"}
    bars = login.value("[p['categories'] for p in __import__('jdist.metrics.panels', fromlist=['p'])"
                       ".panels(jdist.last_run()) if p['kind'] == 'bars']")
    assert bars and all(b == ["rank 0 node1", "rank 1 node2"] for b in bars), bars
    run_dir = Path(login.value("str(jdist.last_run().path)"))
    assert '"hosts": {\n  "0": "node1"' in (run_dir / "meta.json").read_text()
    status = strip_ansi(login.run("%dist status").stdout)
    assert re.search(r"node1", status) and re.search(r"node2", status), status
    doctor = login.run("%dist doctor").stdout  # each host's interfaces, the one the group uses, its clock
    assert re.search(r"ranks: rank 0 node1 pid \d+ cpu, rank 1 node2 pid \d+ cpu", doctor), doctor
    for node, iface in (("node1", "jdtb1"), ("node2", "jdtb2")):
        assert re.search(rf"network, host {node}: .*{iface} [\d.]+.*; the process group's interface: {iface}", doctor)
    assert re.search(r"clocks against the kernel's: node1 [+-][\d.]+ ms \(\+-[\d.]+ ms\), node2 [+-][\d.]+ ms", doctor)
    # a resize past the hosts' room is one line, before anything stops (jdist.kernel.resize.check)
    refused = login.run("%dist resize -n 3", allow_error=True)
    assert ("%dist resize -n 3: --hosts node1:1,node2:1 has room for 2 rank(s), but -n 3 asks for 3" in refused.shown
            and login.value("__import__('jdist.kernel.cluster', fromlist=['c']).current().running")), refused.shown
    print(f"\n--hosts 2 nodes x 1 rank: {ready(out)}, start+cell {out.elapsed:.1f} s")
    # the cluster stays for the tests below (SHARED); the killed-rank test stops it


def test_listeners_bind_only_the_chosen_address_or_loopback(bed, login):
    login.run(f"%%distributed {SHARED}\nimport torch.distributed as dist\n"
              "dist.barrier()")
    table = {node: listeners(bed, node) for node in bed.nodes}
    print("\nlisteners while a --hosts cluster runs:")
    for node, rows in table.items():
        for addr, name in sorted(rows, key=lambda r: r[1]):
            print(f"  {node:6} {name:16} {addr}")
    ours = [(node, addr, name) for node, rows in table.items() for addr, name in rows if name not in NOT_JDIST]
    assert any(name == "controller" for _, _, name in ours) and any(name == "rank" for _, _, name in ours), ours
    allowed = {"node1": ("198.18.0.1:", "127.0.0.1:", "[::1]:"), "node2": ("198.18.0.2:", "127.0.0.1:", "[::1]:")}
    wide = [(node, addr, name) for node, addr, name in ours if not addr.startswith(allowed[node])]
    assert not wide, f"jdist listeners on all interfaces or another address: {wide}"


def test_the_session_key_is_never_on_a_command_line_or_in_a_launchers_environment(bed, login):
    import json

    login.run(f"%%distributed {SHARED}\nx = 1")
    profile = Path(login.value("__import__('jdist.kernel.cluster', fromlist=['x']).current().ipp.profile_dir"))
    files = list((profile / "security").glob("ipcontroller-jdist-*-engine.json"))
    assert files and oct(files[0].stat().st_mode & 0o777) == "0o600"
    key = json.loads(files[0].read_text())["key"]
    assert len(key) > 16
    seen = 0
    for node in bed.nodes:
        pids = on_node(bed, node, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
                                  "grep -qE 'ipyparallel|hydra|mpiexec|srun' && basename $p; done; true").split()
        for pid in pids:
            text = on_node(bed, node, f"cat /proc/{pid}/cmdline /proc/{pid}/environ 2>/dev/null | tr '\\0' ' '")
            seen += bool(text)
            assert key not in text and "IPP_CONNECTION_INFO" not in text, (node, pid, text[:300])
    assert seen >= 4  # the controller, hydra and both ranks were looked at


def _hang_and_stacks(bed, login):
    login.run(f"%%distributed {SHARED}\nimport torch, time\n"
              "import torch.distributed as dist")
    out = login.run("%%distributed --watchdog 3\nx = torch.ones(1)\nif rank == 1:\n    dist.all_reduce(x)",
                    allow_error=True, timeout=120)
    tb = strip_ansi(out.traceback)
    assert out.error["ename"] == "HangError", out.shown
    assert "rank 1: waiting in all_reduce (cell line 3)" in tb, tb
    assert "rank 0: finished the cell" in tb and "process group was re-created" in tb, tb
    login.run("%%distributed --watchdog 30\nx = torch.ones(1)\ndist.all_reduce(x)\nassert x.item() == 2")
    stacks = strip_ansi(login.run("%dist stacks").stdout)
    assert stacks.count("idle (no cell running)") == 2, stacks


def test_a_hang_across_hosts_names_each_rank_and_stacks_come_over_the_network(bed, login):
    _hang_and_stacks(bed, login)


#: Cell code (indented for an ``if`` block): a thread that prints "blocked in all_reduce" once the
#: main thread's stack is inside torch.distributed's all_reduce.
TELL_WHEN_BLOCKED = (
    "    import sys, threading\n"
    "    def _tell(main=threading.main_thread().ident):\n"
    "        while True:\n"
    "            f, names = sys._current_frames().get(main), []\n"
    "            while f is not None: names.append(f.f_code.co_name); f = f.f_back\n"
    "            if 'all_reduce' in names: print('blocked in all_reduce', flush=True); return\n"
    "            time.sleep(0.01)\n"
    "    threading.Thread(target=_tell, daemon=True).start()\n"
)


def test_interrupt_releases_a_remote_rank_blocked_in_a_collective(bed, login):
    login.run(f"%%distributed {SHARED}\nimport torch, time\n"
              "import torch.distributed as dist\ncounter = 0")
    msg = login.start("%%distributed --output all\nif rank == 1:\n" + TELL_WHEN_BLOCKED +
                      "    dist.all_reduce(torch.ones(1))\n"
                      "while True:\n    counter += 1\n    if counter == 20: print('looping', flush=True)\n"
                      "    time.sleep(0.01)")
    # rank 1 (node2) says it waits in the all_reduce, from its own stack; rank 0 loops
    login.wait_for_stdout(msg, "[rank 1] blocked in all_reduce", "[rank 0] looping")
    login.km.interrupt_kernel()
    out = login.collect(msg, timeout=100)
    assert out.error["ename"] == "KeyboardInterrupt", out.shown
    assert "variables on the ranks are kept" in out.shown and "re-created" in out.shown, out.shown
    login.run("%dist pull counter")
    assert login.value("counter")[0] > 10
    login.run("%%distributed\nx = torch.ones(1)\ndist.all_reduce(x)\nassert x.item() == 2")


def test_an_error_on_one_host_releases_the_rank_waiting_on_the_other(bed, login):
    login.run(f"%%distributed {SHARED}\nimport torch\nimport torch.distributed as dist\n"
              "model = jdist.prepare(torch.nn.Linear(2, 1))")
    out = login.run("%%distributed\nif rank == 1:\n    raise ValueError('bad shard on node2')\n"
                    "dist.all_reduce(torch.ones(1))", allow_error=True, timeout=120)
    tb = strip_ansi(out.traceback)
    assert out.error["ename"] == "RankError" and "raise ValueError('bad shard on node2')" in tb, tb
    assert "rank 0: released because rank 1 failed (it was waiting in all_reduce (cell line 3))" in tb, tb
    assert "process group was re-created on all ranks" in tb, tb
    # a post-mortem on the failed rank on node2, typed in the notebook on node1
    out = login.run("%dist debug", replies=["p __import__('socket').gethostname(), rank", "q"])
    text = strip_ansi(out.stdout)
    assert out.prompts == ["(Pdb r1) ", "(Pdb r1) "] and "Post-mortem on rank 1: ValueError: bad shard on node2" in text
    assert "('node2', 1)" in text, text
    # breakpoint() stops rank 1 on node2 while rank 0 on node1 waits in an all_reduce; `c` goes on
    out = login.run("%%distributed --debug-ranks 1\nv = torch.ones(1) * (rank + 1)\nif rank == 1:\n    breakpoint()\n"
                    "dist.all_reduce(v)\nsummed = v.item()", replies=["p __import__('socket').gethostname()", "c"],
                    timeout=120)
    assert out.prompts == ["(Pdb r1) ", "(Pdb r1) "] and "'node2'" in strip_ansi(out.stdout), out.stdout
    login.run("%dist pull summed")
    assert login.value("summed") == [3.0, 3.0]
    # JupyterLab's Debugger panel: a gutter breakpoint stops rank 1 on node2 (its debugpy listens on node2's
    # loopback only; the panel's requests travel on the engine's control channel)
    cell = "%%distributed --debug-ranks 1\nimport socket\nhere = socket.gethostname()\ndist.all_reduce(torch.ones(1))"
    panel = Panel(login)
    panel("initialize", clientID="jupyterlab", adapterID="python", pathFormat="path", linesStartAt1=True)
    panel("attach")
    try:
        path = panel("dumpCell", code=cell)["body"]["sourcePath"]
        panel("setBreakpoints", source={"path": path}, breakpoints=[{"line": 4}])
        panel("configurationDone")
        msg_id = login.start(cell)
        thread = panel.wait_event("stopped", timeout=120)["body"]["threadId"]
        frame = panel("stackTrace", threadId=thread)["body"]["stackFrames"][0]
        assert (frame["source"]["path"], frame["line"]) == (path, 4), frame
        assert panel("evaluate", expression="here", frameId=frame["id"], context="repl")["body"]["result"] == "'node2'"
        wide = [(addr, name) for addr, name in listeners(bed, "node2")
                if name not in NOT_JDIST and not addr.startswith(("198.18.0.2:", "127.0.0.1:", "[::1]:"))]
        assert not wide, f"listeners on all interfaces or another address while debugpy runs: {wide}"
        assert any(name == "debugpy" and addr.startswith("127.0.0.1:") for addr, name in listeners(bed, "node2"))
        assert panel("continue", threadId=1)["success"]
        assert not login.collect(msg_id, timeout=120).error
    finally:
        panel("disconnect", restart=False, terminateDebuggee=False)
    login.run("%%distributed\nx = torch.ones(1)\ndist.all_reduce(x)\nassert x.item() == 2")


def test_a_killed_remote_rank_is_detected_and_named(bed, login):
    login.run(f"%%distributed {SHARED}\nimport os, time\npid = os.getpid()")
    login.run("%dist pull pid")
    remote_pid = login.value("pid")[1]  # rank 1's PID on node2 (node2's numbering)
    msg = login.start("%%distributed\nprint('training', flush=True)\nfor i in range(600):\n    time.sleep(0.1)\n"
                      "    jdist.log(step=i)")
    login.wait_for_stdout(msg, "training", timeout=30)
    t0 = time.perf_counter()
    bed.run("node2", ["kill", "-9", str(remote_pid)])
    out = login.collect(msg, timeout=60)
    detect_s = time.perf_counter() - t0
    text = strip_ansi(out.stdout + out.stderr + out.traceback)
    assert "rank 1" in text and "SIGKILL" in text and "node2" in text, text
    print(f"\nkilled remote rank reported after {detect_s:.2f} s")
    login.run("%dist stop", allow_error=True)
    wait_for(lambda: not engines_on(bed, "node1") and not engines_on(bed, "node2"), timeout=15,
             what="no engine left")
    # the killed rank's MPI shared memory too (the shell around it removes what it noted)
    wait_for(lambda: not any(shm_on(bed, node) for node in bed.nodes), timeout=5,
             what=f"no MPI segment left ({[shm_on(bed, node) for node in bed.nodes]} at first)")


def test_elastic_goes_on_on_the_node_left_when_the_other_nodes_rank_is_killed(bed, login):
    """--elastic 1:2 over ssh: node2's rank SIGKILLed mid-cell; the error names it and node2, the cluster goes on at
    once with node1's rank from the newest checkpoint (in a folder both nodes see), and the next cell trains; then
    %dist resize --hosts grows it back onto node2."""
    ckpt = STATE / "kernels" / "login" / "elastic-ck"
    login.run(f"%%distributed --hosts node1:1,node2:1 --timeout 30 --elastic 1:2\nimport os, time, torch\n"
              f"model = jdist.prepare(torch.nn.Linear(2, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              f"jdist.checkpoint_every(5, {str(ckpt)!r}, model=model, optimizer=opt)\npid = os.getpid()")
    login.run("%dist pull pid")
    remote_pid = login.value("pid")[1]
    msg = login.start("%%distributed\nfor i in range(1, 600):\n    loss = model(torch.ones(1, 2)).sum()\n"
                      "    opt.zero_grad(); loss.backward(); opt.step(); jdist.log(step=i, loss=loss.item())\n"
                      "    if i == 12:\n        print('trained', flush=True)\n    time.sleep(0.05)")
    login.wait_for_stdout(msg, "trained", timeout=60)
    bed.run("node2", ["kill", "-9", str(remote_pid)])
    out = login.collect(msg, timeout=120)
    text = strip_ansi(out.stdout + out.stderr + out.traceback)
    assert "rank 1 died" in text and "node2" in text, text
    assert "jdist: node2 went away (rank(s) 1 with it): went on with 1 rank(s) on node1 (--elastic 1:2)." in text, text
    assert re.search(r"restored \S+step-000000\d\d \(step \d+\) into model, opt", text), text
    out = login.run("%%distributed --output all\nimport socket\nloss = model(torch.ones(1, 2)).sum()\n"
                    "opt.zero_grad(); loss.backward(); opt.step()\nprint('on', socket.gethostname(), world_size)")
    assert out.stdout.count("on node1 1") == 1 and "node2" not in out.stdout, out.stdout
    # node2 is back: the cluster grows to it again, with the training as it is now
    out = login.run("%dist resize --hosts node1:1,node2:1", timeout=240)
    assert "Resized 1 -> 2 ranks in " in out.stdout and "hosts: node1:1,node2:1" in out.stdout, out.stdout
    out = login.run("%%distributed --output all\nimport socket\nprint('on', socket.gethostname(), world_size)")
    assert "on node1 2" in out.stdout and "on node2 2" in out.stdout, out.stdout
    login.run("%dist stop", allow_error=True)


def left_after_kill(bed: Any) -> list[str]:
    """What a killed kernel's cluster left on the nodes: engines, controller, launchers, reaper, a Slurm job,
    MPI shared memory."""
    found = [f"{node}: engine" for node in bed.nodes for _ in engines_on(bed, node)]
    procs = on_node(bed, "node1", "ps -eo args")
    found += [f"node1: {p}" for p in (CONTROLLER, "srun", "mpiexec", "jdist.kernel.reaper") if p in procs]
    if on_node(bed, "node1", "squeue -h").strip():
        found.append("a Slurm job")
    found += [f"{node}: {name}" for node in bed.nodes for name in shm_on(bed, node)]
    return found


def nothing_left(bed: Any, timeout: float) -> None:
    """Wait until :func:`left_after_kill` finds nothing; the error says what was still there."""
    left: list[str] = []

    def clean() -> bool:
        left[:] = left_after_kill(bed)
        return not left

    try:
        wait_for(clean, timeout=timeout, interval=0.1, what="nothing left on the nodes after the kernel's SIGKILL")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {left}") from None


def test_a_sigkilled_kernel_leaves_nothing_on_either_node(bed):
    """--slurm; hydra over ssh (as --hosts starts ranks) is the --k8s test's, which also deletes its job."""
    where = "--slurm -N 2 -n 2"
    k = NodeKernel(bed, "node1", "doomed")
    k.run("%load_ext jdist")
    k.run(f"%%distributed {where} --timeout 30\nx = 1", timeout=240)
    assert engines_on(bed, "node2")
    t0 = time.perf_counter()
    os.kill(k.pid(), signal.SIGKILL)
    nothing_left(bed, timeout=10)
    print(f"\n{where}: nothing left {time.perf_counter() - t0:.1f} s after the kernel's SIGKILL")
    k.kc.stop_channels()
    k.km.cleanup_resources()


def test_slurm_inside_an_allocation_is_a_job_step_of_it(bed):
    # the kernel runs under salloc, as in a JupyterHub/batch session on an HPC centre
    k = NodeKernel(bed, "node1", "allocation", prefix=("salloc", "-N", "2", "-n", "2", "--quiet"))
    try:
        k.run("%load_ext jdist\nimport os")
        job = k.value("os.environ['SLURM_JOB_ID']")
        k.run("%%distributed --slurm -n 2 --timeout 30\nimport os\n" + TRAIN, timeout=240)
        where = check_training(k, 2)
        assert [(r, h) for r, h, *_ in where] == [(0, "node1"), (1, "node2")]
        step = k.value("__import__('jdist.kernel.cluster', fromlist=['x']).current().launcher.step")
        assert step.startswith(f"{job}.")
        k.run("%dist stop")
        wait_for(lambda: step not in on_node(bed, "node1", f"squeue -h -s -j {job} -o %i").split(), timeout=15,
                 what="the job step ended")
        assert on_node(bed, "node1", f"squeue -h -j {job} -o %T").strip() == "RUNNING"  # the allocation stays
    finally:
        k.run("%dist stop", allow_error=True)
        k.shutdown()
    wait_for(lambda: not on_node(bed, "node1", "squeue -h").strip(), timeout=20, what="the allocation released")


CLI_SCRIPT = """import os, socket, sys, time, torch, torch.distributed as dist, jdist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    jdist.log(step=step, loss=loss.detach())
    time.sleep(0.05)  # long enough for each node's load to be sampled
if "--fail" in sys.argv and socket.gethostname() == "node2":
    raise ValueError(f"bad shard on {socket.gethostname()}")
print(f"rank {rank} done on {socket.gethostname()}", flush=True)
"""


def run_cli(bed: Any, name: str, launch: tuple[str, ...], hosts: dict[int, str], fail: bool,
            env: dict[str, str] | None = None) -> None:
    """jdist run with the same launcher options as a cell: records from both hosts, nothing left on either
    node; with ``fail`` (the script raises on node2 after training), the failure named with its host."""
    import json

    base = STATE / "cli" / name
    base.mkdir(parents=True, exist_ok=True)
    (base / "train.py").write_text(CLI_SCRIPT)
    env = dict(os.environ, JDIST_RUN_DIR=str(base / "runs"), JUPYTER_RUNTIME_DIR=str(base / "runtime"), **(env or {}))
    cmd = [sys.executable, "-m", "jdist", "run", *launch, "--timeout", "30", "--no-live", "train.py"]
    out = bed.run("node1", [*cmd, *(["--fail"] if fail else [])], timeout=240, env=env, cwd=base)
    if fail:
        assert out.returncode == 1, out.stderr
        assert "ValueError: bad shard on node2" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
        assert "rank 0 done on node1" in out.stdout
    from jdist.metrics import list_runs, read_run

    run = read_run(list_runs(base / "runs")[0])
    assert run.status == ("failed" if fail else "finished"), run.status
    assert run.hosts == hosts and sorted(run.history["rank"].unique()) == sorted(hosts)
    assert sorted(run.host_load()) == ["node1", "node2"]  # each node's lowest rank sampled its load
    from jdist.metrics.panels import panels

    (table,) = [p for p in panels(run) if p["key"] == "hosts"]
    assert sorted(row[0] for row in table["rows"]) == ["node1", "node2"]
    assert sorted(row[1] for row in table["rows"]) == ["1", "1"] if len(hosts) == 2 else ["2", "2"]
    if fail:
        entries = json.loads((list_runs(base / "runs")[0] / "errors.json").read_text())
        assert entries[0]["host"] == "node2" and entries[0]["kind"] == "exception"
    wait_for(lambda: not engines_on(bed, "node1") and not engines_on(bed, "node2"), timeout=15,
             what="no engine left on either node")
    assert not on_node(bed, "node1", "squeue -h").strip()


def test_jdist_run_from_a_login_node_across_two_nodes(bed):
    """jdist run --slurm (two ranks per node). jdist run over ssh (hydra, as --hosts starts ranks) with a
    failure on node2 is the --k8s test's."""
    run_cli(bed, "slurm", ("--slurm", "-N", "2", "-n", "4"), {0: "node1", 1: "node1", 2: "node2", 3: "node2"},
            fail=False)


def test_k8s_pods_on_both_nodes_train_keep_state_name_a_lost_pod_and_leave_nothing(bed):
    """``--k8s``: the Kubernetes API is a fake (tests/k8sapi.py; no API server can run here), served inside
    node1 where the kernel runs, as a notebook pod reaches its cluster's API; the MPI Operator (the
    notebook's MPIJob), Kubeflow Trainer (jdist run's TrainJob) and the kubelet are emulated on the bed
    (PodEmulator): pod i on node i+1, its sshd the node's, its DNS name
    in the nodes' /etc/hosts. Everything else is real: the job, the ssh key from its Secret, hydra over
    ssh, the connection file copied over ssh, gloo across the nodes, a lost pod, the reaper, jdist run."""
    from k8sapi import FakeKubernetes, PodEmulator

    fake = FakeKubernetes(netns_pid=bed.pid1("node1"))
    pods = PodEmulator(fake, bed)
    options = (f"--k8s -N 2 -n 2 --image registry.example/jdist:test --namespace ml --pod-python {sys.executable} "
               f"--ip {bed.nodes['node1']}")
    line = f"%%distributed {options} --timeout 30"
    with fake:
        fake.kubeconfig(STATE / "kubeconfig", namespace="ml")
        k = NodeKernel(bed, "node1", "k8s", extra_env={"KUBECONFIG": str(STATE / "kubeconfig")})
        try:
            k.run("%load_ext jdist")
            out = k.run(f"{line}\nimport os\n{TRAIN}", timeout=240)
            [job] = fake.list("mpijobs", "ml")
            name = job["metadata"]["name"]
            assert f"Creating MPIJob {name} in namespace ml: 2 pod(s) of 1 rank(s)" in out.stdout, out.stdout
            assert f"in 2 pod(s) of MPIJob {name} (namespace ml)" in out.stdout, out.stdout
            where = check_training(k, 2)
            assert [(r, h) for r, h, *_ in where] == [(0, "node1"), (1, "node2")]
            # the state stays between cells; the job is the one created
            k.run("%%distributed\nagain = float(sum(p.detach().sum() for p in model.parameters()))")
            k.run("%dist pull again")
            assert k.value("again") == k.value("weights")

            # a pod lost mid-cell (OOMKilled): one rank death that names the pod and why
            msg = k.start("%%distributed\nimport time\nprint('training', flush=True)\nfor i in range(600):\n"
                          "    time.sleep(0.1)\n    jdist.log(step=i)")
            k.wait_for_stdout(msg, "training", timeout=30)
            pods.kill_pod(f"{name}-worker-1", "ml", phase="Failed", containerStatuses=[{
                "name": "rank", "image": "registry.example/jdist:test", "imageID": "", "ready": False,
                "restartCount": 0, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}])
            text = strip_ansi((lambda o: o.stdout + o.stderr + o.traceback)(k.collect(msg, timeout=60)))
            assert f"rank 1 died: pod {name}-worker-1 ended: container rank was OOMKilled" in text, text
            print(f"\n--k8s, a pod lost mid-cell:\n{text}")

            # the kernel SIGKILLed, its job still there: its reaper deletes it (the heartbeat pod would, a minute
            # later); a cluster stopped from the kernel (%dist stop, jdist run's end below) deletes its job too
            assert len(fake.list("mpijobs", "ml")) == 1
            os.kill(k.pid(), signal.SIGKILL)
            wait_for(lambda: not fake.list("mpijobs", "ml"), timeout=20, what="the job deleted after the kernel's SIGKILL")
            nothing_left(bed, timeout=15)

            # jdist run takes the same options (the front ends share the launcher's), here on the other engine, a
            # TrainJob (Kubeflow Trainer and JobSet emulated: their pod names, hostnames and Secret); a failure names
            # its host; the job is deleted when the run ends
            run_cli(bed, "k8s", (*options.split(), "--k8s-runtime", "trainjob"), {0: "node1", 1: "node2"}, fail=True,
                    env={"KUBECONFIG": str(STATE / "kubeconfig")})
            assert len(fake.requests_of("POST", "/mpijobs")) == 1 and len(fake.requests_of("POST", "/trainjobs")) == 1
            assert not fake.list("trainjobs", "ml") and not fake.list("pods", "ml")
        finally:
            k.kc.stop_channels()
            k.km.cleanup_resources()
