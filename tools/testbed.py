#!/usr/bin/env python3
"""A two-node test bed on one Linux machine, for jdist's multi-node tests (needs root).

Each node is a network namespace plus its own UTS (hostname), PID and mount namespaces:
a private ``/tmp``, ``/run`` and ``/dev/shm``, its own boot id (MPI tells hosts apart by it), an
``/etc/hosts`` that names both nodes, and a veth pair between the nodes with addresses
in 198.18.0.0/24 (the benchmarking range); as on Debian, a node's own name resolves to
``127.0.1.1`` there (the other node's name to its address). Each node runs an sshd (key auth, listening on
its own address only) and a slurmd; node1 also runs slurmctld and munged (its socket sits
in the shared state folder, the way HPC nodes share one auth domain). The rest of the
filesystem is shared, like an HPC centre's home: the same Python path on every node.

Inside the nodes, ``ssh node2`` and ``srun`` work with no option: the bed binds its own
``/etc/ssh/ssh_config`` and ``/etc/slurm/slurm.conf`` over the system ones (nothing
outside the nodes changes, and ``~/.ssh`` is never touched).

    python tools/testbed.py up [--state DIR]        # ~1-3 s; prints the nodes
    python tools/testbed.py run node1 -- hostname  # a command "on" a node
    python tools/testbed.py down [--state DIR]     # ends every process of both nodes

From Python (the tests)::

    bed = Testbed(Path("build/testbed")); bed.up()
    bed.run("node2", ["hostname"]).stdout   # 'node2\\n'
    bed.down()

:func:`unavailable` says in one line why a bed cannot be made here (not root, no
namespaces, Slurm/sshd/munge not installed: ``tools/install_testbed.sh`` installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

NODES = {"node1": "198.18.0.1", "node2": "198.18.0.2"}
NETNS = "jdist-tb{tag}-{node}"  # tag: from the state folder, so beds of two checkouts never clash
VETH = "jdtb{index}"
CPUS_PER_NODE = 2
DAEMONS = ("/usr/sbin/sshd", "/usr/sbin/slurmd", "/usr/sbin/slurmctld", "/usr/sbin/munged", "/usr/bin/srun",
           "/usr/bin/ssh", "/usr/bin/ssh-keygen")
DEFAULT_STATE = Path(__file__).resolve().parent.parent / "build" / "testbed"


def unavailable() -> str | None:
    """Why a bed cannot be made on this machine (one line with the fix), or None."""
    if sys.platform != "linux":
        return "the multi-node test bed needs Linux namespaces"
    if os.geteuid() != 0:
        return "the multi-node test bed needs root (network and PID namespaces)"
    missing = [path for path in DAEMONS if not os.access(path, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} not installed: run tools/install_testbed.sh (Debian: slurm, munge, openssh)"
    for tool in ("ip", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} not found (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount", "--uts", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"namespaces cannot be made here ({probe.stderr.strip() or probe.returncode})"
    return None


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


class Testbed:
    """Two nodes (see the module doc); ``state`` is a folder on the shared filesystem."""

    def __init__(self, state: Path = DEFAULT_STATE):
        self.state = Path(state).resolve()
        self.nodes = dict(NODES)

    # -- paths -----------------------------------------------------------------------------
    def netns(self, node: str) -> str:
        """The network namespace of ``node`` (named after this bed's state folder)."""
        import hashlib

        return NETNS.format(tag=hashlib.sha1(str(self.state).encode()).hexdigest()[:6], node=node)

    @property
    def info_file(self) -> Path:
        return self.state / "nodes.json"

    def pid1(self, node: str) -> int:
        """The node's init process (its PID 1) as this machine numbers it."""
        return int(json.loads(self.info_file.read_text())[node])

    def command(self, node: str, argv: Sequence[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """``argv`` to run on ``node`` (nsenter into its namespaces)."""
        return ["nsenter", "-t", str(self.pid1(node)), "-n", "-m", "-u", "-p", f"--wd={cwd or os.getcwd()}",
                "--", *argv]

    def run(self, node: str, argv: Sequence[str], timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``node`` and wait (text output captured unless given otherwise)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.command(node, argv, kw.pop("cwd", None)), timeout=timeout, **kw)

    def popen(self, node: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        return subprocess.Popen(self.command(node, argv, kw.pop("cwd", None)), **kw)

    # -- up and down ------------------------------------------------------------------------
    def up(self, timeout: float = 60) -> None:
        """Make both nodes and start their daemons; returns once ssh and Slurm answer."""
        why = unavailable()
        if why:
            raise RuntimeError(why)
        self.down()
        t0 = time.monotonic()
        self._write_config()
        for node in self.nodes:
            _sh("ip", "netns", "add", self.netns(node))
        ns1, ns2 = (self.netns(node) for node in self.nodes)
        _sh("ip", "link", "add", VETH.format(index=1), "netns", ns1, "type", "veth",
            "peer", "name", VETH.format(index=2), "netns", ns2)
        pids: dict[str, int] = {}
        try:  # a start that fails half-way ends what it started (a node left running broke the next bed)
            for index, (node, addr) in enumerate(self.nodes.items(), start=1):
                ns = self.netns(node)
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", VETH.format(index=index))
                _sh("ip", "-n", ns, "link", "set", VETH.format(index=index), "up")
                log = open(self.state / "log" / f"init-{node}.log", "ab")
                # ip netns exec -> a new mount namespace; unshare: hostname, PID 1, private mounts
                proc = subprocess.Popen(
                    ["ip", "netns", "exec", ns, "unshare", "--uts", "--pid", "--fork", "--mount", "--mount-proc",
                     "--propagation", "private", sys.executable, str(Path(__file__).resolve()), "_init", node,
                     "--state", str(self.state)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                pids[node] = self._child_of(proc.pid, timeout=10)
                self.info_file.write_text(json.dumps(pids))  # as each node starts: down() ends it
            self._wait_ready(t0 + timeout)
        except BaseException:
            self.down()
            raise

    @staticmethod
    def _child_of(pid: int, timeout: float) -> int:
        """The node's PID 1: the process that ``unshare --fork`` (under ``ip netns exec``) started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                children = []
            if children and b"_init" in Path(f"/proc/{children[0]}/cmdline").read_bytes():
                return int(children[0])
            if children:  # ip netns exec has exec'ed unshare; its child is the node's init
                pid = int(children[0])
                continue
            time.sleep(0.01)
        raise RuntimeError("the test bed node did not start (see build/testbed/log/init-*.log)")

    def _wait_ready(self, deadline: float) -> None:
        waiting = "the nodes' init"
        while time.monotonic() < deadline:
            if all((self.state / "run" / f"ready-{node}").exists() for node in self.nodes):
                waiting = "ssh node1 -> node2"
                probe = self.run("node1", ["ssh", "-o", "BatchMode=yes", "node2", "hostname"], timeout=10)
                if probe.returncode == 0 and probe.stdout.strip() == "node2":
                    waiting = "slurmd on both nodes"
                    sinfo = self.run("node1", ["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
                    states = dict(line.split() for line in sinfo.stdout.splitlines() if line.strip())
                    if sinfo.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes):
                        return
            time.sleep(0.1)
        logs = "\n".join(f"-- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in sorted((self.state / "log").glob("*.log")))
        self.down()
        raise RuntimeError(f"test bed: {waiting} not ready in time.\n{logs}")

    def down(self) -> None:
        """End both nodes (SIGKILL to each PID 1 ends every process in it) and remove the namespaces."""
        if self.info_file.exists():
            for pid in json.loads(self.info_file.read_text()).values():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.info_file.unlink()
        for node in self.nodes:
            ns = self.netns(node)
            if Path(f"/run/netns/{ns}").exists():
                _sh("ip", "netns", "del", ns, check=False)
        for sub in ("run", "slurm", "munge"):
            shutil.rmtree(self.state / sub, ignore_errors=True)

    # -- configuration ----------------------------------------------------------------------
    def _write_config(self) -> None:
        s = self.state
        for sub in ("log", "run", "slurm", "munge", "ssh"):
            (s / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(s / "munge", 0o700)
        os.chmod(s / "ssh", 0o700)
        for node in self.nodes:  # as Debian writes it: the node's own name on 127.0.1.1 (gloo's classic trap)
            (s / f"hosts-{node}").write_text(f"127.0.0.1 localhost\n127.0.1.1 {node}\n" + "".join(
                f"{a} {n}\n" for n, a in self.nodes.items() if n != node))
        key = s / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        ssh = s / "ssh"
        for name, kind in (("id_ed25519", "user"), ("host_ed25519", "host")):
            if not (ssh / name).exists():
                _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"jdist-testbed-{kind}", "-f", str(ssh / name))
        shutil.copy(ssh / "id_ed25519.pub", ssh / "authorized_keys")
        host_pub = (ssh / "host_ed25519.pub").read_text().split()
        (ssh / "known_hosts").write_text("".join(f"{n},{a} {host_pub[0]} {host_pub[1]}\n"
                                                 for n, a in self.nodes.items()))
        (ssh / "ssh_config").write_text(
            "Host *\n"
            f"  IdentityFile {ssh / 'id_ed25519'}\n"
            f"  UserKnownHostsFile {ssh / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n")
        for node, addr in self.nodes.items():
            (ssh / f"sshd_config-{node}").write_text(
                f"ListenAddress {addr}\nHostKey {ssh / 'host_ed25519'}\n"
                f"AuthorizedKeysFile {ssh / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "UsePAM no\nStrictModes no\nPidFile /run/sshd.pid\nAcceptEnv *\nPermitUserEnvironment no\n")
        nodes, count = ",".join(self.nodes), len(self.nodes)
        first, last = list(self.nodes.values())[0], list(self.nodes.values())[-1]
        assert first.rsplit(".", 1)[0] == last.rsplit(".", 1)[0]
        (s / "slurm.conf").write_text(f"""\
ClusterName=jdisttb
SlurmctldHost=node1({first})
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={s / 'munge' / 'munge.socket'}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={s / 'slurm'}
SlurmdSpoolDir=/tmp/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile={s / 'log' / 'slurmctld.log'}
SlurmdLogFile={s / 'log'}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SchedulerType=sched/builtin
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MessageTimeout=5
JobAcctGatherType=jobacct_gather/none
NodeName=node[1-{count}] NodeAddr={first.rsplit('.', 1)[0]}.[1-{count}] CPUs={CPUS_PER_NODE} State=UNKNOWN
PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")


def _init(node: str, state: Path) -> None:
    """PID 1 of a node: private mounts, daemons, then reap children until killed."""

    def sh(*argv: str) -> None:
        subprocess.run(list(argv), check=True)

    sh("hostname", node)
    sh("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run")
    # a private /tmp, but what the nodes share stays visible: the project (its .venv) and the bed's
    # state may live under /tmp (a CI clone): bind them back over the new /tmp
    keep = sorted({p for p in (Path(__file__).resolve().parent.parent, state, Path(sys.prefix).resolve())
                   if p.is_relative_to("/tmp")})
    keep = [p for p in keep if not any(p != q and p.is_relative_to(q) for q in keep)]
    if keep:
        os.makedirs("/run/host-tmp")
        sh("mount", "--bind", "/tmp", "/run/host-tmp")
    sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/tmp")
    for path in keep:
        os.makedirs(path, exist_ok=True)
        sh("mount", "--bind", str(Path("/run/host-tmp") / path.relative_to("/tmp")), str(path))
    if keep:
        sh("umount", "-l", "/run/host-tmp")  # the rest of the machine's /tmp stays out of sight
    sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/dev/shm")  # MPI's segments: per host, as on machines
    os.makedirs("/run/sshd", mode=0o755)
    boot_id = Path("/run/boot_id")
    boot_id.write_text(str(uuid.uuid4()) + "\n")
    sh("mount", "--bind", str(boot_id), "/proc/sys/kernel/random/boot_id")
    sh("mount", "--bind", str(state / f"hosts-{node}"), "/etc/hosts")
    sh("mount", "--bind", str(state / "ssh" / "ssh_config"), "/etc/ssh/ssh_config")
    slurm_conf = Path("/etc/slurm/slurm.conf")
    if slurm_conf.exists():
        sh("mount", "--bind", str(state / "slurm.conf"), str(slurm_conf))
    else:  # bind a tmpfs over /etc/slurm holding the bed's file (the host's /etc stays as it is)
        Path("/run/etc-slurm").mkdir()
        shutil.copy(state / "slurm.conf", "/run/etc-slurm/slurm.conf")
        sh("mount", "--bind", "/run/etc-slurm", "/etc/slurm")
    # slurmd wants a cgroup v1 "systemd" hierarchy; a private one keeps the host's cgroups untouched
    sh("mount", "-t", "tmpfs", "none", "/sys/fs/cgroup")
    os.makedirs("/sys/fs/cgroup/systemd")
    sh("mount", "-t", "cgroup", "-o", "none,name=systemd", "cgroup", "/sys/fs/cgroup/systemd")
    log = state / "log"
    daemons = [["/usr/sbin/sshd", "-D", "-e", "-f", str(state / "ssh" / f"sshd_config-{node}")]]
    if node == "node1":
        daemons.insert(0, ["/usr/sbin/munged", "-F", "-f", f"--socket={state / 'munge' / 'munge.socket'}",
                           f"--key-file={state / 'munge' / 'munge.key'}", "--pid-file=/run/munged.pid",
                           f"--log-file={log / 'munged.log'}", "--seed-file=/tmp/munged.seed"])
        daemons.append(["/usr/sbin/slurmctld", "-D", "-i", "-f", "/etc/slurm/slurm.conf"])
    else:
        deadline = time.monotonic() + 10
        while not (state / "munge" / "munge.socket").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    daemons.append(["/usr/sbin/slurmd", "-D", "-N", node, "-f", "/etc/slurm/slurm.conf"])
    for argv in daemons:
        out = open(log / f"{Path(argv[0]).name}-{node}.out", "ab")
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        if argv[0].endswith("munged"):
            deadline = time.monotonic() + 10
            while not (state / "munge" / "munge.socket").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
    (state / "run" / f"ready-{node}").write_text("")
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    while True:  # reap orphans (this is the node's PID 1)
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="jdist's two-node test bed (see tools/testbed.py)")
    parser.add_argument("action", choices=["up", "down", "run", "check", "_init"])
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    args = parser.parse_args(argv)
    if args.action == "_init":
        _init(args.rest[0], args.state.resolve())
        return 0
    if args.action == "check":
        why = unavailable()
        print(why or "the test bed can be made here")
        return 1 if why else 0
    bed = Testbed(args.state)
    if args.action == "up":
        t0 = time.perf_counter()
        bed.up()
        print(f"test bed up in {time.perf_counter() - t0:.1f} s: "
              + ", ".join(f"{n} {a} (pid {bed.pid1(n)})" for n, a in bed.nodes.items()))
    elif args.action == "down":
        bed.down()
    else:
        node, rest = args.rest[0], args.rest[1:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        return subprocess.call(bed.command(node, rest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
