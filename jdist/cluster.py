"""Cluster lifecycle on ipyparallel: MPI-launched engines, one per rank.

:class:`DistributedCluster` starts an ipyparallel controller on loopback and N engines
under ``mpiexec`` (taken from the running environment, not from PATH), waits for them
with progress feedback, and runs :func:`jdist.rank.setup` on every engine (MPI rank,
device pinning, backend process group). One cluster per kernel: :func:`current`.

Example:
    >>> from jdist.cluster import ClusterConfig, DistributedCluster
    >>> c = DistributedCluster(ClusterConfig(n=2)); c.start()     # doctest: +SKIP
    >>> c.pull("rank")                                            # doctest: +SKIP
    [0, 1]
    >>> c.stop()                                                  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from .backends import available_backends, get_backend

#: Values of ``--precision`` (autocast dtype; fp16 adds a GradScaler).
PRECISIONS = ("fp32", "bf16", "fp16")

#: Largest rank count accepted for local CPU ranks (each rank is a Python process with torch).
MAX_LOCAL_RANKS = 64


class ClusterError(RuntimeError):
    """A cluster could not be started or used; the message says what to do."""


@dataclass(frozen=True)
class ClusterConfig:
    """What ``%%distributed`` options ask for.

    ``n`` ranks; ``gpus`` True pins one CUDA device per rank (NCCL), else CPU ranks (gloo).
    ``timeout``: process-group timeout in seconds. ``start_timeout``: seconds to wait for
    engines to register. ``threads``: torch threads per CPU rank (None: cores / ranks).
    ``precision``: autocast dtype of prepared models, fp32/bf16/fp16 (changeable while running).
    ``watchdog``: seconds without progress, while every running rank waits in a collective,
    after which a cell counts as hung (0: off). ``auto_restart``: after the ranks died,
    restart them and restore the newest automatic checkpoint. ``port``: fixed TCP port of
    the process-group rendezvous (None: a private file store, no listening socket).
    """

    n: int
    gpus: bool = False
    backend: str = "ddp"
    timeout: float = 60.0
    start_timeout: float = 120.0
    threads: int | None = None
    precision: str = "fp32"
    watchdog: float = 30.0
    auto_restart: bool = False
    port: int | None = None

    def validate(self) -> None:
        """Raise ValueError with the fix for impossible settings (before anything starts)."""
        if self.n < 1:
            raise ValueError(f"-n/--gpus must be at least 1 (got {self.n}); e.g. -n 2.")
        if not self.gpus and self.n > MAX_LOCAL_RANKS:
            raise ValueError(f"-n {self.n} is more than {MAX_LOCAL_RANKS} local ranks; use -n {MAX_LOCAL_RANKS} or fewer.")
        missing = get_backend(self.backend).unavailable()  # get_backend names the valid choices
        if missing:
            raise ValueError(missing)
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be positive seconds (got {self.timeout}).")
        if self.watchdog < 0:
            raise ValueError(f"--watchdog must be seconds >= 0 (0 turns it off; got {self.watchdog:g}).")
        if self.port is not None:
            if not 1024 <= self.port <= 65535:
                raise ValueError(f"--port {self.port}: use a port from 1024 to 65535, or leave --port out.")
            holder = port_in_use(self.port)
            if holder:
                raise ValueError(f"--port {self.port} is in use on this machine ({holder}). "
                                 "Choose another --port, or leave --port out (no port is needed on one machine).")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision {self.precision!r}: use one of {', '.join(PRECISIONS)}.")
        if self.gpus:
            have = visible_gpus()
            if have < self.n:
                raise ValueError(
                    f"--gpus {self.n} asks for {self.n} GPUs but this machine has {have} visible CUDA GPU(s). "
                    f"Use -n {self.n} to run {self.n} CPU ranks with gloo"
                    + (f", or --gpus {have}." if have else ".")
                )


def visible_gpus() -> int:
    """CUDA devices visible to this process (0 without torch or CUDA); does not initialise CUDA."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def port_in_use(port: int) -> str | None:
    """Who holds TCP ``port`` on this machine (e.g. ``"PID 123, python"``), None if it is free."""
    import psutil

    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("", port))
        return None
    except OSError:
        pass
    finally:
        probe.close()
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f"PID {conn.pid}, {psutil.Process(conn.pid).name()}"
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        pass
    return "held by another process"


def oom_kills() -> int | None:
    """The kernel's out-of-memory kill count for this process's cgroup (None if unknown)."""
    try:
        cgroup = Path("/proc/self/cgroup").read_text().strip().split("::")[-1]
        for line in (Path("/sys/fs/cgroup") / cgroup.lstrip("/") / "memory.events").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def mpiexec_path() -> str:
    """The ``mpiexec`` of the running environment (``sys.prefix/bin``), else the one on PATH."""
    candidate = Path(sys.prefix) / "bin" / "mpiexec"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise ClusterError(
        f"No mpiexec found in {candidate.parent} or on PATH. Install MPI into this environment: "
        f"{sys.executable} -m pip install mpich mpi4py"
    )


#: Shell around each engine: forwards the launcher's signals, then records the exit status.
#: (A background job of a non-interactive shell starts with SIGINT ignored; the engine
#: installs its own SIGINT handler, so interrupts still work.)
RANK_WRAPPER = (
    '"$@" & child=$!; '
    "for sig in TERM HUP INT USR1 USR2; do trap \"kill -$sig $child 2>/dev/null\" $sig; done; "
    "while :; do wait $child; code=$?; kill -0 $child 2>/dev/null || break; done; "
    "echo $code > {exit_file}; exit $code"
)


def _engine_launcher_class() -> type:
    """ipyparallel's MPI engine launcher, reading mpiexec's output leniently.

    The ranks share one output file; gforker may split a multi-byte character between
    two writes (gloo's error text ends in an emoji), and ipyparallel's strict UTF-8 read
    would then fail inside its stop callback.
    """
    from ipyparallel.cluster.launcher import MPIEngineSetLauncher

    class JdistMPIEngineSetLauncher(MPIEngineSetLauncher):
        def get_output(self, remove: bool = False) -> str:
            if self._output is None and self.output_file:
                try:
                    with open(self.output_file, "rb") as f:
                        self._output = f.read().decode("utf-8", errors="replace")
                except FileNotFoundError:
                    pass
            return super().get_output(remove=remove)

    return JdistMPIEngineSetLauncher


def local_mpiexec() -> str:
    """The launcher for ranks on this machine: MPICH's ``mpiexec.gforker`` when present.

    Hydra (plain ``mpiexec``) keeps a control port open on every interface for the whole
    job, whatever its options; gforker runs the ranks on one host and listens nowhere.
    """
    mpiexec = mpiexec_path()
    gforker = Path(mpiexec).with_name("mpiexec.gforker")
    return str(gforker) if gforker.exists() else mpiexec


class DistributedCluster:
    """An ipyparallel cluster of MPI ranks with a backend set up on each.

    The mapping from rank to ipyparallel engine id comes from the ranks themselves
    (``ranks`` holds each rank's :func:`jdist.rank.info`).
    """

    def __init__(self, config: ClusterConfig):
        config.validate()
        self.config = config
        self.cluster: Any = None  # ipyparallel.Cluster
        self.client: Any = None  # ipyparallel.Client
        self.ranks: list[dict[str, Any]] = []
        self._engine_of_rank: dict[int, int] = {}
        self.started_at: float | None = None
        self.state_file: Path | None = None  # for the Jupyter server extension (jdist.server.state)
        self.work_dir: Path | None = None  # private (0700): process-group store, rank stack dumps
        #: What %dist restart replays before restoring a checkpoint: ("cell", code, ranks)
        #: for cells that ended without error and logged nothing, ("push", name, value, ranks).
        self.history: list[tuple[Any, ...]] = []
        #: The ranks' last jdist.checkpoint_every settings and newest saved checkpoint.
        self.checkpoint: dict[str, Any] = {}
        self._deaths: list[int] = []  # ranks whose process ended, in order (filled by the death watch)
        self._unwatched: list[dict[str, Any]] = []  # ranks the death watch cannot see (checked by PID)

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.client is not None

    @property
    def cluster_id(self) -> str | None:
        """The ipyparallel cluster id (new at every start), or None when not running."""
        return self.cluster.cluster_id if self.cluster is not None else None

    def start(self, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """Start controller and engines, wait for all ranks, set up the backend on them.

        ``progress(message)`` is called with human-readable progress lines.
        """
        import ipyparallel as ipp

        say = progress or (lambda msg: None)
        n = self.config.n
        t0 = time.perf_counter()
        cluster = ipp.Cluster(
            engines=_engine_launcher_class(),
            n=n,
            cluster_id=f"jdist-{os.getpid()}-{uuid.uuid4().hex[:8]}",
            controller_ip="127.0.0.1",
            # ipyparallel logs to the kernel's stdout; at WARNING it dumps engine logs on every stop
            log_level=logging.ERROR,
            # the controller warns once per jdist data message ("unhandled iopub msg_type")
            controller_args=["--log-level=ERROR"],
        )
        cluster.config.MPILauncher.mpi_cmd = [local_mpiexec()]
        # MPICH's default UCX netmod listens on every interface: keep it on loopback
        cluster.config.MPILauncher.environment = {
            "UCX_NET_DEVICES": os.environ.get("UCX_NET_DEVICES", "lo"),
            # a rank told to exit must not wait in MPI_Finalize for peers that may be gone
            "MPI4PY_RC_FINALIZE": "false",
        }
        self.cluster = cluster
        self.history, self.checkpoint = [], {}
        self.work_dir = Path(tempfile.mkdtemp(prefix="jdist-"))  # mode 0700
        # mpiexec reports only one exit status, often of a rank it killed while cleaning up:
        # a shell around each engine writes the rank's own status (128+N: killed by signal N).
        # mpiexec signals only its direct children (these shells): they pass signals on.
        exit_file = shlex.quote(str(self.work_dir)) + '/exit-"${PMI_RANK:-unknown}"'
        cluster.config.MPIEngineSetLauncher.engine_cmd = ["/bin/sh", "-c", RANK_WRAPPER.format(exit_file=exit_file),
                                                          "jdist-rank", sys.executable, "-m", "ipyparallel.engine"]
        try:
            say(f"Starting {n} MPI rank(s)...")
            cluster.start_controller_sync()
            cluster.start_engines_sync(n)
            client = cluster.connect_client_sync()
            self.client = client
            self._wait_for_engines(say, t0)
            say(f"{n} rank(s) registered after {time.perf_counter() - t0:.1f} s; setting up {self.config.backend}...")
            self._setup_ranks()
        except BaseException:
            self.stop()
            raise
        self.started_at = time.time()
        from .server import state

        self.state_file = state.write(self)  # lets the Jupyter server list this cluster; best effort
        kinds = sorted({r["device"] for r in self.ranks})
        say(
            f"Ready: {n} rank(s), backend {self.config.backend}, device(s) {', '.join(kinds)} "
            f"({time.perf_counter() - t0:.1f} s)."
        )
        return self.ranks

    def _wait_for_engines(self, say: Callable[[str], None], t0: float) -> None:
        n = self.config.n
        deadline = time.monotonic() + self.config.start_timeout
        last = -1
        while True:
            have = len(self.client.ids)
            if have >= n:
                return
            if have != last:
                say(f"  {have}/{n} ranks registered ({time.perf_counter() - t0:.1f} s)")
                last = have
            dead = self._dead_launcher_output()
            if dead is not None:
                raise ClusterError(f"mpiexec exited before all ranks registered ({have}/{n}). Its output:\n{dead}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"Only {have}/{n} ranks registered within {self.config.start_timeout:.0f} s. "
                    "Try fewer ranks (-n), or a longer --start-timeout."
                )
            time.sleep(0.05)

    def _dead_launcher_output(self) -> str | None:
        """The output of an engine launcher (mpiexec) that has exited, else None."""
        for launcher in (self.cluster.engines or {}).values():
            if launcher.state == "after" or not _process_alive(getattr(launcher, "process", None)):
                try:
                    return launcher.get_output(remove=False).strip() or "(no output)"
                except OSError:
                    return "(no output captured)"
        return None

    def _setup_ranks(self) -> None:
        from . import rank as rank_runtime

        view = self.client[:]
        controller = self.cluster.controller.process
        cfg = {
            **asdict(self.config),
            "work_dir": str(self.work_dir),
            # the ranks end themselves (and the controller) if this process dies without stopping them
            "owner": {"host": socket.gethostname(), "pid": os.getpid(),
                      "controller": [controller.pid, controller.create_time()]},
        }
        ar = view.apply_async(rank_runtime.setup, cfg)
        try:
            infos = ar.get(timeout=self.config.timeout + 30)
        except Exception as exc:
            raise ClusterError(f"Setting up backend {self.config.backend!r} on the ranks failed: {exc}") from exc
        self._engine_of_rank = {info["rank"]: eid for eid, info in zip(ar._targets, infos)}
        self.ranks = sorted(infos, key=lambda i: i["rank"])
        self._watch_deaths()

    def _watch_deaths(self) -> None:
        """Note which rank process ends first (a thread waits on pidfds of this machine's ranks)."""
        import select
        import threading

        fds = {}
        self._deaths, self._unwatched = [], []
        for info in self.ranks:
            try:
                fds[os.pidfd_open(info["pid"])] = info["rank"]
            except (OSError, AttributeError):  # no pidfd support: dead_ranks checks it by PID
                self._unwatched.append(info)
        deaths = self._deaths

        def watch() -> None:
            pending = dict(fds)
            while pending:
                ready, _, _ = select.select(list(pending), [], [])
                for fd in sorted(ready, key=lambda f: pending[f]):
                    deaths.append(pending.pop(fd))
                    os.close(fd)

        threading.Thread(target=watch, name="jdist-death-watch", daemon=True).start()

    def stop(self) -> None:
        """Stop engines and controller (teardown on the ranks first, best effort). Idempotent."""
        client, cluster = self.client, self.cluster
        self.client = self.cluster = None
        if self.state_file is not None:
            self.state_file.unlink(missing_ok=True)
            self.state_file = None
        self.ranks, self._engine_of_rank = [], {}
        self._deaths, self._unwatched = [], []
        work_dir, self.work_dir = self.work_dir, None
        if client is not None:
            try:
                from . import rank as rank_runtime

                client[:].apply_async(rank_runtime.teardown).get(timeout=5)
            except Exception:
                pass  # engines may be dead or busy; stopping them below releases everything
            client.close()
        if cluster is not None:
            cluster.stop_cluster_sync()
            # the controller keeps an engine-id file per cluster id; ours are never reused
            state = Path(cluster.profile_dir) / "log" / f"engines{cluster.cluster_id}.json"
            state.unlink(missing_ok=True)
        if work_dir is not None:
            shutil.rmtree(work_dir, ignore_errors=True)

    def restart(self, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """Stop and start again with the same configuration (all rank state is lost)."""
        self.stop()
        return self.start(progress)

    # -- using the ranks -------------------------------------------------------------------
    def _require(self) -> Any:
        if self.client is None:
            raise ClusterError("No jdist cluster is running. Start one with %%distributed -n 2 (or --gpus N).")
        return self.client

    def engine_ids(self, ranks: Sequence[int] | None = None) -> list[int]:
        """Engine ids for ``ranks`` (all ranks if None).

        ValueError naming the valid ranks for unknown ones; ClusterError if their processes died.
        """
        client = self._require()
        if ranks is None:
            ranks = sorted(self._engine_of_rank)
        bad = [r for r in ranks if r not in self._engine_of_rank]
        if bad:
            raise ValueError(
                f"No rank {', '.join(map(str, bad))} in this cluster; ranks are 0..{self.config.n - 1}."
            )
        alive = set(client.ids)
        dead = set(self.dead_ranks())
        gone = [r for r in ranks if self._engine_of_rank[r] not in alive or r in dead]
        if gone:
            raise ClusterError(
                f"Rank(s) {', '.join(map(str, gone))} are gone: their processes died. "
                "Run %dist restart to start fresh ranks (their variables are lost)."
            )
        return [self._engine_of_rank[r] for r in ranks]

    def rank_of_engine(self, engine_id: int) -> int:
        return {e: r for r, e in self._engine_of_rank.items()}[engine_id]

    def execute(self, code: str, ranks: Sequence[int] | None = None) -> Any:
        """Send ``code`` to run on ``ranks`` (default all); returns the ipyparallel AsyncResult."""
        view = self._require()[self.engine_ids(ranks)]
        return view.execute(code, silent=False, block=False)

    def apply(self, fn: Callable[..., Any], *args: Any, ranks: Sequence[int] | None = None,
              timeout: float | None = 30) -> list[Any]:
        """Call ``fn(*args)`` on ``ranks`` and return the results in rank order."""
        view = self._require()[self.engine_ids(ranks)]
        return view.apply_async(fn, *args).get(timeout=timeout)

    def interrupt(self, ranks: Sequence[int] | None = None) -> None:
        """Send SIGINT to the rank processes (KeyboardInterrupt in their running code)."""
        self._require().send_signal(signal.SIGINT, targets=self.engine_ids(ranks), block=True)

    def pull(self, name: str, ranks: Sequence[int] | None = None) -> list[Any]:
        """The value of ``name`` from each rank's namespace, in rank order."""
        return self.apply(_get_global, name, ranks=ranks)

    def push(self, name: str, value: Any, ranks: Sequence[int] | None = None) -> None:
        """Set ``name`` to ``value`` in each rank's namespace."""
        view = self._require()[self.engine_ids(ranks)]
        view.push({name: value}, block=True)

    # -- faults ----------------------------------------------------------------------------
    def stacks(self, ranks: Sequence[int] | None = None, timeout: float = 2.0) -> dict[int, list[tuple[str, int, str]]]:
        """The main thread's Python stack of each rank (innermost first), also while it is
        blocked in C++ (faulthandler on SIGUSR1, sent by PID). Ranks that did not answer
        within ``timeout`` map to an empty list."""
        from . import guard

        self._require()
        assert self.work_dir is not None
        wanted = [info for info in self.ranks if ranks is None or info["rank"] in ranks]
        files = {}
        for info in wanted:
            path = self.work_dir / f"rank-{info['rank']}.txt"
            if path.exists():
                path.write_text("")  # the rank appends: start from an empty file
            files[info["rank"]] = path
            try:
                os.kill(info["pid"], guard.STACKS_SIGNAL)
            except ProcessLookupError:
                pass
        out: dict[int, list[tuple[str, int, str]]] = {}
        deadline = time.monotonic() + timeout
        while len(out) < len(wanted) and time.monotonic() < deadline:
            time.sleep(0.02)
            for info in wanted:
                r = info["rank"]
                if r not in out and files[r].exists():
                    frames = guard.parse_stacks(files[r].read_text(), info["main_thread"])
                    if frames:
                        out[r] = frames
        return {info["rank"]: out.get(info["rank"], []) for info in wanted}

    def _end_survivors(self) -> None:
        """MPI cannot go on without a rank: end the others now (by PID) rather than leave it to mpiexec."""
        import psutil

        for info in self.ranks:
            try:
                proc = psutil.Process(info["pid"])
                if "ipyparallel.engine" in " ".join(proc.cmdline()):  # still our engine, not a reused PID
                    proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        deadline = time.monotonic() + 1.0  # until they have ended, so status says dead for every rank
        while len(self.dead_ranks()) < len(self.ranks) and time.monotonic() < deadline:
            time.sleep(0.01)

    def dead_ranks(self) -> list[int]:
        """Ranks whose process has ended, the first to end first (this machine's ranks only).

        Cheap enough for every poll of a running cell: the death watch thread keeps the list.
        """
        return list(self._deaths) + [info["rank"] for info in self._unwatched if not _pid_alive(info["pid"])]

    def death_report(self, dead: Sequence[int], oom_before: int | None = None, wait: float = 2.0) -> dict[str, Any]:
        """Which rank died first and why (it takes the others down: MPI ends the whole job).

        The cause comes from the rank's own exit status, written by the shell around its
        engine. Returns ``{"rank", "cause", "detail"}`` (detail: mpiexec's output so far).
        ``oom_before``: :func:`oom_kills` taken earlier; a higher count now means the
        kernel's out-of-memory killer acted.
        """
        deadline = time.monotonic() + wait
        self._end_survivors()
        text = ""
        for launcher in (self.cluster.engines or {}).values() if self.cluster is not None else []:
            try:
                text += launcher.get_output(remove=False)
            except Exception:  # only detail for the message: never let it hide the death itself
                pass
        first = dead[0] if dead else None
        code = None
        exit_file = self.work_dir / f"exit-{first}" if self.work_dir is not None else None
        while exit_file is not None and time.monotonic() < deadline and not exit_file.exists():
            time.sleep(0.02)
        try:
            code = int(exit_file.read_text()) if exit_file is not None else None
        except (OSError, ValueError):
            pass
        oom_now = oom_kills()
        if oom_before is not None and oom_now is not None and oom_now > oom_before:
            cause = "killed by the out-of-memory killer (the machine ran out of memory)"
        elif code == 128 + signal.SIGKILL:
            cause = "killed by SIGKILL (kill -9, or the out-of-memory killer)"
        elif code is not None and code > 128:
            num = code - 128
            cause = f"killed by {signal.Signals(num).name}" if num in signal.valid_signals() else f"killed by signal {num}"
        elif code is not None:
            cause = f"the process exited with code {code} (os._exit or sys.exit in the cell, or a crash)"
        else:
            cause = "the process ended (cause unknown)"
        return {"rank": first, "cause": cause, "detail": text.strip()[-2000:]}

    def set_precision(self, precision: str) -> None:
        """Change the autocast precision on every rank (prepared models included), no restart."""
        new = replace(self.config, precision=precision)
        new.validate()
        self._require()[:].apply_sync(_set_rank_precision, precision)
        self.config = new

    def status(self) -> dict[str, Any]:
        """Config, uptime and per-rank info with ``state`` busy/idle/dead (from the controller)."""
        states = engine_states(self._require())
        dead = set(self.dead_ranks())
        ranks = []
        for info in self.ranks:
            eid = self._engine_of_rank[info["rank"]]
            state = "dead" if info["rank"] in dead else states.get(eid, "dead")
            ranks.append({**info, "engine_id": eid, "state": state})
        return {
            "config": asdict(self.config),
            "uptime_s": time.time() - (self.started_at or time.time()),
            "cluster_id": self.cluster_id,
            "ranks": ranks,
        }


def _set_rank_precision(precision: str) -> None:
    from jdist import training  # on the rank (torch is there)

    training.set_precision(precision)


def engine_states(client: Any) -> dict[int, str]:
    """``busy`` or ``idle`` per registered engine id, from the controller's queue status.

    Engines missing from the result are dead (the controller unregistered them). Works with
    any ipyparallel ``Client`` of the cluster: the kernel's own (``status``) or the Jupyter
    server extension's.
    """

    def busy_engines() -> set[int]:
        queue = client.queue_status()
        return {e for e, q in queue.items() if isinstance(q, dict) and (q.get("queue") or q.get("tasks"))}

    busy = busy_engines()
    if busy and not client.outstanding:
        # The controller books a reply slightly after the client got it: ask again once.
        time.sleep(0.1)
        busy = busy_engines()
    return {eid: "busy" if eid in busy else "idle" for eid in client.ids}


def _process_alive(proc: Any) -> bool:
    """psutil.Process still running and not a zombie (None counts as alive: not started yet)."""
    import psutil

    if proc is None:
        return True
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _get_global(name: str) -> Any:
    from IPython import get_ipython

    ns = get_ipython().user_ns
    if name not in ns:
        raise NameError(f"name {name!r} is not defined on this rank")
    return ns[name]


_current: DistributedCluster | None = None


def current() -> DistributedCluster | None:
    """The kernel's running cluster, or None."""
    return _current if _current is not None and _current.running else None


def set_current(cluster: DistributedCluster | None) -> None:
    global _current
    _current = cluster


__all__ = [
    "ClusterConfig",
    "ClusterError",
    "DistributedCluster",
    "available_backends",
    "current",
    "engine_states",
    "mpiexec_path",
    "set_current",
    "visible_gpus",
]
