"""Ranks on other hosts: ``--hosts``/``--hostfile`` (MPICH hydra over ssh) and ``--slurm`` (srun).

Both are ipyparallel's own ``MPIEngineSetLauncher`` with another ``mpi_cmd``: MPICH's
``mpiexec.hydra -launcher ssh -hosts ...`` or ``srun --mpi=pmi2 --kill-on-bad-exit=1``. The
kernel's host may run none of the ranks, so nothing here uses a PID of a rank:

* **Death:** a shell around each engine prints ``jdist-rank-exit <rank> <status>`` when the
  engine ends; hydra and srun bring that line back in their output, which ipyparallel writes
  to a file on this host. A launcher process that ended means every rank it had ended.
  hydra ends the job when one rank dies; srun does with ``--kill-on-bad-exit``.
* **Stacks and samples:** the signal goes through ipyparallel's signed control channel
  (``Client.send_signal``); the rank's guard thread reads its main thread's stack and sends
  it back as an IOPub data message (:data:`jdist.protocol.SAMPLE_KEY`).
* **Nothing left behind:** a reaper process on this host (:mod:`jdist.kernel.reaper`) ends the
  controller, the launcher and the Slurm job step if the kernel dies without stopping them;
  engines exit by themselves once the controller's heartbeat is gone
  (:data:`ENGINE_HEARTBEAT_MISSES`).

Engines read the controller's connection file (0600) from the profile folder: the hosts must
share that filesystem (the usual HPC home), and the session key is never in an environment
that hydra or srun copy over the network.

Their options are theirs: ``--hosts``/``--hostfile`` (ssh), ``--slurm``/``-N`` (slurm) and
``--ip``/``--iface`` (both), with their checks (:meth:`SSHLauncher.check`...).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Sequence

from jdist.common.last_words import POS_SUFFIX, STDERR_ENV, UNSHOWN_SH, from_output, split_report
from jdist.common.network import (
    address_of,
    interface_of,
    interfaces,
    is_loopback,
    resolve,
    route_source,
)
from jdist.common.procs import popen_alive
from jdist.common.stacks import SAMPLE_SIGNAL, Frame, Sample, parse_sample
from jdist.common.waiting import poll_until
from jdist.errors import ClusterError
from jdist.options import ClusterConfig, Option, Scope
from jdist.plugins import backend_spec
from jdist.protocol import SAMPLE_KEY, NetworkPlan, RankInfo, sample_parent_id

from .api import RankDeath, RankLauncher
from .mpi import (CRASH_SIGNALS, cause_of_exit, engine_argv, engine_set_launcher, engine_shell, how_it_ended,
                  mpiexec_path)

#: The shell around each remote engine: passes signals on, then prints the rank's exit status
#: (128+N: killed by signal N) into the launcher's output, which comes back to the kernel's host.
#: The rank notes its MPI shared-memory segments in ``$JDIST_SHM_NOTE`` (a file of its host); they
#: are removed after the engine ended, however it ended: a leftover segment with the name a later
#: job picks makes that job fail in ``MPI_Init``. hydra ends the survivors of a dead rank by
#: killing their whole process group (this shell too), so a watcher in a session of its own
#: removes them (it ends with the engine, within 0.2 s), and the rank's stderr file once this shell is gone.
SHM_CLEANUP = ('if [ -f "$JDIST_SHM_NOTE" ]; then while read -r seg; do rm -f "$seg"; done < "$JDIST_SHM_NOTE"; '
               'rm -f "$JDIST_SHM_NOTE"; fi')
#: What the shells of this host that ended with their watcher left: Slurm ends a step whole with SIGKILL
#: (``scancel --signal=KILL``, past ``KillWait`` at a time limit), every process of it, the watchers included.
#: Each rank that starts on the host removes the noted segments and the stderr files of this user's shells that
#: are gone (their PID, the last part of the name, is not running, or is this shell's own: a predecessor's). The
#: files are named after the host too, so a ``$TMPDIR`` that hosts share is safe.
LEFT_BY_KILLED = (
    'h=$(uname -n); t="${TMPDIR:-/tmp}"; '
    'for f in "$t"/jdist-shm-"$h"-* "$t"/jdist-stderr-"$h"-*; do '
    'pid=${f##*-}; pid=${pid%.pos}; case "$pid" in ""|*[!0-9]*) continue;; esac; '
    'case "$f" in "$t/jdist-shm-$h-$pid"|"$t/jdist-stderr-$h-$pid"|"$t/jdist-stderr-$h-$pid.pos") ;; *) continue;; '
    'esac; [ -O "$f" ] || continue; '
    'if [ "$pid" != "$$" ] && kill -0 "$pid" 2>/dev/null; then continue; fi; '
    'n="$t/jdist-shm-$h-$pid"; if [ -f "$n" ]; then while read -r seg; do rm -f "$seg"; done < "$n"; fi; '
    'rm -f "$n" "$t/jdist-stderr-$h-$pid" "$t/jdist-stderr-$h-$pid' + POS_SUFFIX + '"; done 2>/dev/null; ')
#: The rank's fd 2 goes to a file of its host (:mod:`jdist.common.last_words`): what it had not forwarded when
#: it ended comes back as ``jdist-rank-stderr <rank> <line>`` lines before the exit line. A rank SIGKILLed while its
#: host's count of out-of-memory kills (``/proc/vmstat``, every memory limit's too) rose has `` oom`` on that line.
OOM_COUNT = "$(sed -n s/^oom_kill.//p /proc/vmstat 2>/dev/null)"
REMOTE_WRAPPER = engine_shell(
    before=(LEFT_BY_KILLED + f'oom0="{OOM_COUNT}"; ' + 'JDIST_SHM_NOTE="$t/jdist-shm-$h-$$"; export JDIST_SHM_NOTE; '
            f'{STDERR_ENV}="$t/jdist-stderr-$h-$$"; export {STDERR_ENV}; '),
    started=("setsid sh -c 'while kill -0 $1 2>/dev/null; do sleep 0.2; done; " + SHM_CLEANUP.replace("'", "'\\''")
             + "; while kill -0 $2 2>/dev/null; do sleep 0.2; done; "
             + f"rm -f \"${STDERR_ENV}\" \"${STDERR_ENV}{POS_SUFFIX}\""
             + "' jdist-shm-watch $child $$ </dev/null >/dev/null 2>&1 & "),
    after=(SHM_CLEANUP + '; rank=${PMI_RANK:-${SLURM_PROCID:--1}}; ' + UNSHOWN_SH
           + f'; oom=""; oom1="{OOM_COUNT}"; if [ "$code" = 137 ] && [ -n "$oom0" ] && [ "${{oom1:-0}}" -gt "$oom0" ]; '
           'then oom=" oom"; fi; echo "jdist-rank-exit $rank $code$oom"; exit $code'),
)
EXIT_LINE = re.compile(rb"^jdist-rank-exit (-?\d+) (\d+)( oom)?\s*$", re.M)


def _output_of(launcher: Any, start: int = 0) -> bytes:
    """An engine launcher's output from byte ``start``: its file, or, once ipyparallel has stopped it (and
    moved the file into memory), what it kept."""
    path = getattr(launcher, "output_file", None)
    try:
        with open(path or "", "rb") as f:
            f.seek(start)
            return f.read()
    except OSError:
        try:
            return launcher.get_output(remove=False).encode()[start:]
        except Exception:  # only detail for a message
            return b""


def _last_words(output: str, rank: int | None) -> str:
    """From the ``jdist-rank-stderr <rank>`` lines the shell around the rank's engine printed into the launcher's
    ``output`` after it ended: what came before its crash report."""
    return split_report(from_output(output).get(rank, ""))[0] if rank is not None else ""


def _crash_reports(output: str) -> dict[int | None, str]:
    """Each rank's crash report in the launcher's ``output`` (:meth:`RemoteMPILauncher.crash_reports`)."""
    reports: dict[int | None, str] = {rank: split_report(text)[1] for rank, text in from_output(output).items()}
    reports = {rank: report for rank, report in reports.items() if report}
    return reports or {None: output}


def _first_exit(output: str) -> tuple[int, int] | None:
    """The rank and exit status of the first exit line in the launcher's ``output`` (hydra and srun end the other
    ranks after it).

    >>> _first_exit("hello\\njdist-rank-exit 1 139\\njdist-rank-exit 0 143\\n"), _first_exit("hello")
    ((1, 139), None)
    """
    m = EXIT_LINE.search(output.encode())
    return (int(m.group(1)), int(m.group(2))) if m else None


#: How long a launcher may take to end the job by itself once a rank's exit line came back (s).
EXITED_GRACE_S = 0.5
#: A remote engine ends itself after this many missed controller heartbeats (each check waits the
#: controller's period + 0.5 s: 10 x 0.7 s = 7 s after the controller is gone, while it is idle).
ENGINE_HEARTBEAT_MISSES = 10
#: How long a host check (ssh + python) may take.
PROBE_TIMEOUT_S = 20.0

IP = Option("ip", ("--ip",), "With ranks on other hosts: the address of this machine (and of rank 0's host for the "
            "process group) that the others reach; jdist's listeners bind it (default: the address of the route "
            "to the first host).", Scope.RESTART, type=str, metavar="ADDR")
IFACE = Option("iface", ("--iface",), "With ranks on other hosts: the network interface for jdist's traffic and "
               "gloo/NCCL on every host (default: the one that routes to rank 0).", Scope.RESTART, type=str,
               metavar="NAME")
HOSTS = Option("hosts", ("--hosts",), "Run the ranks on these hosts over ssh (MPICH hydra): gpu1:4,gpu2:4 gives 4 "
               "ranks per host (-n/--gpus default to the total); the same Python path on each, a shared home "
               "(docs/multinode.md).", Scope.RESTART, type=str, metavar="HOST:N,...", implies=True)
HOSTFILE = Option("hostfile", ("--hostfile",), "Like --hosts, from a file: one host[:ranks] per line.", Scope.RESTART,
                  type=str, metavar="FILE", implies=True)
SLURM = Option("slurm", ("--slurm",), "Run the ranks as a Slurm job step (srun --mpi=pmi2): inside an allocation "
               "as it is; outside one, give srun's own options in quotes, e.g. --slurm \"-p gpu -A proj -t 60\".",
               Scope.RESTART, type=str, metavar="\"SRUN OPTIONS\"", const="", implies=True)
NODES = Option("nodes", ("-N", "--nodes"), "With --slurm: the number of nodes (srun -N); with --k8s: of pods, each "
               "with an equal share of the ranks.", Scope.RESTART, type=int, metavar="NODES")


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``--hosts`` (or a hostfile's lines) as ``[(host, ranks)]``; a host without ``:N`` gets 1.

    >>> parse_hosts("gpu1:4,gpu2:4")
    [('gpu1', 4), ('gpu2', 4)]
    >>> parse_hosts("node1, node2:2")
    [('node1', 1), ('node2', 2)]
    >>> parse_hosts("gpu1:x")
    Traceback (most recent call last):
    ...
    ValueError: --hosts: 'gpu1:x' is not host or host:N (N ranks, at least 1); e.g. --hosts gpu1:4,gpu2:4.
    """
    out = []
    for item in text.replace("\n", ",").split(","):
        item = item.split("#", 1)[0].strip()
        if not item:
            continue
        host, _, count = item.partition(":")
        if not host or any(c.isspace() for c in host) or (count and not (count.isdigit() and int(count) >= 1)):
            raise ValueError(f"--hosts: {item!r} is not host or host:N (N ranks, at least 1); "
                             "e.g. --hosts gpu1:4,gpu2:4.")
        out.append((host, int(count) if count else 1))
    if not out:
        raise ValueError("--hosts: no host given; e.g. --hosts gpu1:4,gpu2:4.")
    return out


def read_hostfile(path: str) -> list[tuple[str, int]]:
    """A hostfile's hosts (one ``host[:N]`` per line, ``#`` comments), as :func:`parse_hosts`."""
    try:
        text = open(os.path.expanduser(path)).read()
    except OSError as exc:
        raise ValueError(f"--hostfile {path}: {exc.strerror}; give a file with one host[:ranks] per line.") from None
    try:
        return parse_hosts(text)
    except ValueError as exc:
        raise ValueError(f"--hostfile {path}: {str(exc).removeprefix('--hosts: ')}") from None


class RemoteMPILauncher(RankLauncher):
    """What ``--hosts`` and ``--slurm`` share (see the module doc); subclasses say the command."""

    remote: ClassVar[bool] = True
    options: ClassVar[tuple[Option, ...]] = (IP, IFACE)

    @classmethod
    def check(cls, config: ClusterConfig) -> None:
        ip = config.get("ip")
        if ip is not None:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"--ip {ip!r} is not an IP address; give one of this machine's "
                                 "addresses, e.g. --ip 10.1.2.3 (or --iface NAME).") from None

    def __init__(self, config: ClusterConfig, work_dir: Path):
        super().__init__(config, work_dir)
        self._address: str | None = None
        self._ranks: list[RankInfo] = []
        self._exits: dict[int, int] = {}  # rank -> exit status, in the order they came
        self._oom: set[int] = set()  # ranks whose exit line said the out-of-memory killer acted
        self._read = 0  # bytes of the launcher output already scanned
        self._all_ended = False
        self.client: Any = None
        self.engine_of_rank: dict[int, int] = {}

    # -- starting ---------------------------------------------------------------------------
    def mpi_cmd(self) -> list[str]:
        raise NotImplementedError

    def first_host(self) -> str | None:
        """A host the ranks run on, another than this one if there is (the controller listens on the
        address that reaches it)."""
        return None

    @property
    def controller_ip(self) -> str:
        assert self._address is not None, "probe() chooses the address"
        return self._address

    def network(self) -> NetworkPlan:
        return NetworkPlan(controller_ip=self.controller_ip, ip=self.option("ip"), iface=self.option("iface"))

    def choose_address(self) -> str:
        """``--ip``, else ``--iface``'s address, else the address of the route to the first host."""
        ip, iface = self.option("ip"), self.option("iface")
        if ip:
            if interface_of(ip) is None:
                raise ClusterError(f"--ip {ip} is not an address of this machine; its addresses are on "
                                   f"{', '.join(interfaces())} (--iface NAME picks one).")
            return ip
        if iface:
            addr = address_of(iface)
            if addr is None:
                raise ClusterError(f"--iface {iface}: no such interface with an IPv4 address here; "
                                   f"choose one of {', '.join(interfaces())}.")
            return addr
        host = self.first_host()
        if host is None:
            raise ClusterError("Could not tell which address the ranks reach this machine at: give --ip ADDR "
                               "or --iface NAME.")
        try:
            addr = route_source(resolve(host))
        except OSError as exc:
            raise ClusterError(f"Host {host!r} does not resolve here ({exc.strerror or exc}); check the name, "
                               "or give --ip/--iface.") from None
        if is_loopback(addr) and self.spans_other_hosts():
            raise ClusterError(f"{host!r} resolves to this machine's loopback address; the ranks of other hosts "
                               f"cannot reach it. Give --ip ADDR or --iface NAME (interfaces: "
                               f"{', '.join(interfaces())}).")
        return addr

    def spans_other_hosts(self) -> bool:
        """Whether some rank may run on another host than this one."""
        return True

    def engine_launcher_class(self) -> type:
        return engine_set_launcher()

    def python(self) -> str:
        """The Python that runs the ranks on their hosts: this one, at the same path."""
        return sys.executable

    def configure(self, ipp_config: Any) -> None:
        # engines read the connection file (0600, a shared home): the HMAC key never travels in an
        # environment that hydra or srun copy to the other hosts in clear text
        ipp_config.Cluster.send_engines_connection_env = False
        ipp_config.MPILauncher.mpi_cmd = self.mpi_cmd()
        ipp_config.MPILauncher.mpi_args = []
        ipp_config.MPILauncher.environment = {"MPI4PY_RC_FINALIZE": "false"}
        ipp_config.MPIEngineSetLauncher.engine_cmd = [
            "/bin/sh", "-c", REMOTE_WRAPPER, "jdist-rank", self.python(),
            *engine_argv(backend_spec(self.config.backend).preimport),
        ]
        ipp_config.MPIEngineSetLauncher.engine_args = [
            f"--IPEngine.max_heartbeat_misses={ENGINE_HEARTBEAT_MISSES}", "--log-level=ERROR",
        ]

    def output(self) -> str:
        """What the launcher printed so far (ranks' stdout/stderr, hydra's or srun's messages), read
        from its output file every time (ipyparallel's ``get_output`` keeps its first reading), or, once
        ipyparallel has stopped the launcher, what it kept of the file (:func:`_output_of`)."""
        return b"".join(map(_output_of, self.output_launchers())).decode("utf-8", "replace")

    def exited_early(self, when: str = "before it registered") -> str | None:
        if not self.engine_launcher_ended():
            return None
        poll_until(lambda: self.output().strip(), 1.0)  # ipyparallel writes what it printed last a moment later
        output = self.output()
        first = _first_exit(output)
        ended = f"rank {first[0]} {how_it_ended(first[1])} {when}\n" if first else ""
        return ended + (output.strip()[-3000:] or "(no output)")

    def crashed(self) -> bool:
        first = _first_exit(self.output())
        return first is not None and first[1] - 128 in CRASH_SIGNALS

    # -- while the ranks run ----------------------------------------------------------------
    def attach_client(self, client: Any, engine_of_rank: dict[int, int]) -> None:
        self.client = client
        self.engine_of_rank = dict(engine_of_rank)

    def watch(self, ranks: Sequence[RankInfo]) -> None:
        self._ranks = list(ranks)
        self._exits, self._oom, self._read, self._all_ended = {}, set(), 0, False

    def _scan(self) -> None:
        for launcher in self.output_launchers():
            chunk = _output_of(launcher, self._read)
            cut = chunk.rfind(b"\n") + 1  # whole lines only
            self._read += cut
            for m in EXIT_LINE.finditer(chunk[:cut]):
                self._exits.setdefault(int(m.group(1)), int(m.group(2)))
                if m.group(3):
                    self._oom.add(int(m.group(1)))
        if self.engine_launcher_ended():
            self._all_ended = True

    def deaths(self) -> list[int]:
        self._scan()
        dead = [r for r in self._exits if r >= 0]
        if self._all_ended:
            dead += [info["rank"] for info in self._ranks if info["rank"] not in self._exits]
        return dead

    def death(self, dead: Sequence[int], wait: float = 2.0) -> RankDeath:
        """The first rank whose exit line came back, and its status. The launcher ends the job (hydra, srun
        with --kill-on-bad-exit); if it has not after ``wait`` s, or :data:`EXITED_GRACE_S` once the rank's exit
        line is here, it is told to. (hydra waits for the dead engine's nanny, which holds its output open
        while it tells the controller: 2 s and more on the two-node bed.)"""
        first = dead[0] if dead else None

        def ended() -> bool:
            self._scan()
            return self._all_ended

        self._scan()
        if not poll_until(ended, min(wait, EXITED_GRACE_S) if first in self._exits else wait):
            for launcher in self.engine_launchers():
                try:
                    launcher.signal(signal.SIGTERM)
                except Exception:  # already gone
                    pass
        code = self._exits.get(first) if first is not None else None
        host = next((info["host"] for info in self._ranks if info["rank"] == first), None)
        output = self.output()
        # the launcher ended the job: its word says why (a time limit...), if it came before any rank's exit line
        # (srun --kill-on-bad-exit cancels its step after a rank died, and slurmstepd says CANCELLED then too)
        data = output.encode()
        exit_line = EXIT_LINE.search(data)
        said = self.ended_by(data[:exit_line.start()].decode("utf-8", "replace") if exit_line else output)
        if code is None:
            cause = said or "the rank's process or its host went away (no exit status came back)"
        else:
            cause = cause_of_exit(code, first in self._oom) + (f": {said}" if said else "")
        if host and not said:  # (the launcher's line names the host)
            cause += f" on host {host}"
        reports = _crash_reports(output)
        return RankDeath(first, cause, output.strip()[-2000:], code, crash=reports.get(first, reports.get(None, "")),
                         last_words=_last_words(output, first), oom=first in self._oom)

    def ended_by(self, output: str) -> str | None:
        """What the launcher said of a job it ended (ranks killed with their shells, or told to end), from its
        ``output``; None if nothing."""
        return None

    def last_words(self, rank: int | None) -> str:
        return _last_words(self.output(), rank)

    def crash_reports(self) -> dict[int | None, str]:
        """A rank here writes its crash report to its stderr file (after its last words), which the shell around
        it prints with its rank; before its set-up, to the launcher's output, all ranks together (the key None)."""
        return _crash_reports(self.output())

    def samples(self, ranks: Sequence[RankInfo], timeout: float = 2.0) -> dict[int, Sample]:
        """The sample signal through the controller; each rank's guard sends its sample back over IOPub."""
        from jdist.codec import decode_data

        client = self.client
        if client is None:
            return {info["rank"]: Sample() for info in ranks}
        wanted = {}
        for info in ranks:
            md = client.metadata[sample_parent_id(info["rank"])]
            md["data"].pop(SAMPLE_KEY, None)
            if info["rank"] in self.engine_of_rank:
                wanted[info["rank"]] = md
        try:
            client.send_signal(SAMPLE_SIGNAL, targets=[self.engine_of_rank[r] for r in wanted], block=False)
        except Exception:  # engines gone: no samples
            return {info["rank"]: Sample() for info in ranks}
        out: dict[int, Sample] = {}

        def read() -> bool:
            for r, md in wanted.items():
                if r not in out and SAMPLE_KEY in md["data"]:
                    out[r] = parse_sample(decode_data(md["data"][SAMPLE_KEY]))
            return len(out) >= len(wanted)

        poll_until(read, timeout, interval=0.005)
        return {info["rank"]: out.get(info["rank"], Sample()) for info in ranks}

    def stacks(self, ranks: Sequence[RankInfo], timeout: float = 2.0) -> dict[int, list[Frame]]:
        """Each rank's main-thread stack, read by its guard thread (under the GIL, which a blocked
        collective releases) and sent back over the network."""
        return {r: list(sample.frames) for r, sample in self.samples(ranks, timeout).items()}

    def ranks_ended(self) -> None:
        """hydra and srun end by themselves once every rank has ended: give them a moment first."""
        poll_until(lambda: not any(popen_alive(getattr(el, "process", None)) for el in self.engine_launchers()), 2.0,
                   interval=0.02)

    def processes(self) -> list[int]:
        """PIDs on this host that the reaper ends if the kernel dies: the launcher processes."""
        return [el.process.pid for el in self.engine_launchers() if getattr(el, "process", None) is not None]

    def cleanup_commands(self) -> list[list[str]]:
        """Commands the reaper runs after ending :meth:`processes` (e.g. ``scancel`` of the job step)."""
        return []

    # -- probing hosts ------------------------------------------------------------------------
    def check_hosts(self, hosts: Sequence[str], run: Any, ranks: dict[str, int] | None = None) -> None:
        """Every host runs this Python with jdist, ipyparallel and mpi4py, sees the profile folder
        (a shared filesystem) and, with ``--gpus``, has a GPU for each of its ``ranks``;
        ``run(host, argv)`` runs a command there. One line per problem."""
        profile = Path(os.environ.get("IPYTHONDIR") or Path.home() / ".ipython")
        script = ("import sys, os, importlib.util as u; "
                  "missing = [m for m in ('jdist', 'ipyparallel', 'mpi4py', 'torch') if u.find_spec(m) is None]; "
                  f"print('missing=' + ','.join(missing)); print('shared=' + str(os.path.isdir({str(profile)!r})))")
        if self.config.gpus:
            script += "; import torch; print('gpus=' + str(torch.cuda.device_count()))"
        argv = [sys.executable, "-c", script]

        def check(host: str) -> str | None:
            try:
                proc = run(host, argv)
            except subprocess.TimeoutExpired:
                return f"host {host} did not answer within {PROBE_TIMEOUT_S:.0f} s"
            out = proc.stdout or ""
            if "missing=" not in out:
                err = (proc.stderr or "").strip().splitlines()
                reason = err[-1] if err else f"exit status {proc.returncode}"
                if "No such file" in reason or proc.returncode == 127:
                    return (f"host {host} has no {sys.executable}: install the same environment at the same path "
                            "on every host (docs/multinode.md)")
                return f"host {host}: {reason}"
            values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
            if values.get("missing"):
                return (f"host {host}: {sys.executable} lacks {values['missing']}; install jdist into that "
                        "environment on every host")
            if values.get("shared") != "True":
                return (f"host {host} does not see {profile}: the hosts must share the home (or IPYTHONDIR) "
                        "with this machine, where the controller's connection file is")
            want = (ranks or {}).get(host, 0)
            if self.config.gpus and want and int(values.get("gpus", "0") or 0) < want:
                return (f"host {host} has {values.get('gpus', '0')} visible CUDA GPU(s) for its {want} rank(s) of "
                        f"--gpus: give it fewer ranks (host:N), or use -n for CPU ranks")
            return None

        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            problems = [p for p in pool.map(check, hosts) if p]
        if problems:
            raise ClusterError("; ".join(problems) + ".")


def _is_this_host(host: str) -> bool:
    """Whether ``host`` names this machine (its hostname, or an address that resolves to one of its own)."""
    import socket

    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addr = resolve(host)
    except OSError:
        return False
    return is_loopback(addr) or interface_of(addr) is not None


class SSHLauncher(RemoteMPILauncher):
    """``--hosts``/``--hostfile``: MPICH's hydra starts the ranks over ssh (``-launcher ssh``)."""

    name = "ssh"
    program = "mpiexec (hydra over ssh)"
    options = (HOSTS, HOSTFILE, IP, IFACE)

    @classmethod
    def complete(cls, given: dict[str, Any]) -> None:
        """``-n`` defaults to the hosts' total; a hostfile is read now (one clear line, not an error of mpiexec later)."""
        if not (given.get("hosts") or given.get("hostfile")):
            return
        hosts = parse_hosts(given["hosts"]) if given.get("hosts") else read_hostfile(given["hostfile"])
        if "n" not in given:
            given.update(n=sum(count for _, count in hosts), gpus=False)

    @classmethod
    def check(cls, config: ClusterConfig) -> None:
        hosts, hostfile = config.get("hosts"), config.get("hostfile")
        if hosts is None and hostfile is None:
            raise ValueError("--launcher ssh needs the hosts: give --hosts gpu1:4,gpu2:4 or --hostfile FILE.")
        if hosts is not None:
            total = sum(count for _, count in parse_hosts(hosts))  # names a malformed list
            if total < config.n:
                raise ValueError(f"--hosts {hosts} has room for {total} rank(s), but {config.ranks_flag} asks "
                                 f"for {config.n}: add ranks per host (host:N) or leave {config.ranks_flag.split()[0]} out.")
        super().check(config)

    def hosts(self) -> list[tuple[str, int]]:
        if self.option("hosts"):
            return parse_hosts(self.option("hosts"))
        if self.option("hostfile"):
            return read_hostfile(self.option("hostfile"))
        raise ClusterError("--launcher ssh needs --hosts or --hostfile.")

    def first_host(self) -> str | None:
        names = [h for h, _ in self.hosts()]
        return next((h for h in names if not _is_this_host(h)), names[0])

    def spans_other_hosts(self) -> bool:
        return any(not _is_this_host(h) for h, _ in self.hosts())

    def where(self) -> str:
        return f" on {', '.join(dict.fromkeys(h for h, _ in self.hosts()))} over ssh"

    def probe(self) -> None:
        mpiexec_path()
        hydra = Path(mpiexec_path()).with_name("mpiexec.hydra")
        if not hydra.exists():
            raise ClusterError(f"No mpiexec.hydra next to {mpiexec_path()}: install MPICH into this environment "
                               f"({sys.executable} -m pip install mpich mpi4py).")
        if shutil.which("ssh") is None:
            raise ClusterError("--hosts starts ranks over ssh, and no ssh client is installed here.")
        self._address = self.choose_address()

        def run(host: str, argv: list[str]) -> subprocess.CompletedProcess:
            return subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(PROBE_TIMEOUT_S)}",
                                   host, shlex.join(argv)], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)

        def reach(host: str, argv: list[str]) -> subprocess.CompletedProcess:
            if _is_this_host(host):  # hydra starts this host's ranks itself, without ssh
                return subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                                      stdin=subprocess.DEVNULL)
            proc = run(host, argv)
            if proc.returncode == 255:  # ssh's own failure
                err = (proc.stderr or "").strip().splitlines()
                raise_for = err[-1] if err else "ssh failed"
                proc.stdout = ""
                proc.stderr = (f"ssh cannot reach it ({raise_for}); check the name, that `ssh {host}` works "
                               "without a password (keys), and its host key")
            return proc

        per_host: dict[str, int] = {}
        for host, count in self.hosts():
            per_host[host] = per_host.get(host, 0) + count
        self.check_hosts(list(per_host), reach, per_host)

    def mpi_cmd(self) -> list[str]:
        hydra = str(Path(mpiexec_path()).with_name("mpiexec.hydra"))
        spec = ",".join(f"{h}:{n}" for h, n in self.hosts())
        cmd = [hydra, "-launcher", "ssh", "-hosts", spec]
        if self.option("iface"):
            cmd += ["-iface", self.option("iface")]
        return cmd


class SlurmLauncher(RemoteMPILauncher):
    """``--slurm``: one Slurm job step, ``srun --mpi=pmi2`` (inside an allocation, or asking for one)."""

    name = "slurm"
    program = "srun"
    options = (SLURM, NODES, IP, IFACE)
    #: the job step the ranks run in comes back from them
    report_env = ("SLURM_JOB_ID", "SLURM_STEP_ID")

    @classmethod
    def check(cls, config: ClusterConfig) -> None:
        nodes = config.get("nodes")
        if nodes is not None and not 1 <= nodes <= config.n:
            raise ValueError(f"-N {nodes}: give 1 to {config.n} nodes for {config.ranks_flag}.")
        super().check(config)

    def __init__(self, config: ClusterConfig, work_dir: Path):
        super().__init__(config, work_dir)
        self.step: str | None = None  # "<job>.<step>", from the ranks
        self.own_job = "SLURM_JOB_ID" not in os.environ  # srun asked for the allocation itself

    def where(self) -> str:
        nodes = self.option("nodes")
        return " as a Slurm job step (srun" + (f" -N {nodes}" if nodes else "") + ")"

    def srun_args(self) -> list[str]:
        return shlex.split(self.option("slurm") or "")

    def probe(self) -> None:
        for tool in ("srun", "scontrol"):
            if shutil.which(tool) is None:
                raise ClusterError(f"--slurm: {tool} is not on PATH here; run the kernel on a Slurm login node "
                                   "(or load the Slurm module), or use --hosts.")
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        if ping.returncode != 0 or "UP" not in ping.stdout:
            said = (ping.stdout + ping.stderr).strip()
            raise ClusterError(f"--slurm: the Slurm controller does not answer ({said}).")
        self._address = self.choose_address()

    @functools.cached_property
    def allocated_nodes(self) -> list[str]:
        """The nodes of the allocation the kernel runs in ([] outside one)."""
        nodelist = os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            return []
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                               timeout=PROBE_TIMEOUT_S)
        return names.stdout.split() if names.returncode == 0 else []

    def spans_other_hosts(self) -> bool:
        nodes = self.allocated_nodes
        return not nodes or any(not _is_this_host(n) for n in nodes)

    def first_host(self) -> str | None:
        """Inside an allocation: its first node that is not this one; outside: the Slurm controller's host."""
        nodes = self.allocated_nodes
        if nodes:
            return next((n for n in nodes if not _is_this_host(n)), nodes[0])
        conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
        m = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", conf.stdout, re.M)
        return (m.group(2) or m.group(1)) if m else None

    def mpi_cmd(self) -> list[str]:
        cmd = ["srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "--job-name=jdist"]
        if self.option("nodes"):
            cmd += ["-N", str(self.option("nodes"))]
        return cmd + self.srun_args()

    def watch(self, ranks: Sequence[RankInfo]) -> None:
        super().watch(ranks)
        steps = {step_of(info) for info in ranks} - {None}
        self.step = steps.pop() if len(steps) == 1 else None

    def ended_by(self, output: str) -> str | None:
        """Slurm's word on a step it ended (cancelled, at the time limit, for a node failure or preemption): the
        ranks got SIGTERM, or SIGKILL with the shells around them (no exit status came back). slurmstepd's line
        when it reached srun (not always), else srun's ``Force Terminated``.

        >>> SlurmLauncher.ended_by(None, "srun: error: node2: tasks 2-3: Killed\\nslurmstepd-node1: error: "
        ...                                "*** JOB 7 ON node1 CANCELLED AT 2026-11-29T02:25:47 DUE TO TIME LIMIT ***")
        'Slurm ended the job (JOB 7 ON node1 CANCELLED AT 2026-11-29T02:25:47 DUE TO TIME LIMIT; ask for more time: --slurm "-t MINUTES", or a longer allocation)'
        >>> SlurmLauncher.ended_by(None, "srun: error: node1: tasks 0-1: Killed\\nsrun: Force Terminated StepId=7.0")
        'Slurm ended the job step 7.0 (srun: "Force Terminated": it was cancelled, reached its time limit or lost a node)'
        """
        said = re.findall(r"\*\*\* ((JOB|STEP) \S+ ON \S+ (?:CANCELLED|FAILED)[^*]*?) \*\*\*", output)
        if said:
            text, kind = said[-1]
            more = '; ask for more time: --slurm "-t MINUTES", or a longer allocation' if "TIME LIMIT" in text else ""
            return f"Slurm ended the {'job step' if kind == 'STEP' else 'job'} ({text}{more})"
        forced = re.search(r"^srun: Force Terminated (?:job step |StepId=)?(\S+)", output, re.M)
        if forced:
            return (f'Slurm ended the job step {forced.group(1)} (srun: "Force Terminated": it was cancelled, reached '
                    "its time limit or lost a node)")
        return None

    def cleanup_commands(self) -> list[list[str]]:
        """SIGTERM to the step's tasks first (srun itself would end them with SIGKILL, leaving their
        MPI shared memory behind), then cancel the step (the job, when srun asked for it)."""
        if self.step is None:
            return []
        job = self.step.split(".")[0]
        return [["scancel", "--signal=TERM", self.step], ["scancel", job if self.own_job else self.step]]

    def stop(self) -> None:
        """Cancel the job step if it outlived srun (srun killed); the job too when srun asked for it."""
        if self.step is not None:
            job = self.step.split(".")[0]
            steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True,
                                   timeout=PROBE_TIMEOUT_S)
            if self.step in steps.stdout.split():
                subprocess.run(self.cleanup_commands()[-1], capture_output=True, timeout=PROBE_TIMEOUT_S)
        self.step = None


def step_of(info: RankInfo) -> str | None:
    """``"<job>.<step>"``: the Slurm job step a rank runs in (from its ``RankInfo["launcher"]``).

    >>> step_of({"launcher": {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0"}})
    '12.0'
    """
    env = info.get("launcher") or {}
    job, step = env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")
    return f"{job}.{step}" if job and step else None
