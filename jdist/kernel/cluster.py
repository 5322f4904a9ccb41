"""The kernel's cluster: an ipyparallel controller and one engine per rank, with a backend set up on each.

:class:`ClusterSession` starts the controller, has its :class:`~jdist.kernel.launch.RankLauncher`
start the engines (local MPI by default), waits for them with progress feedback and runs
``setup`` on every rank (MPI rank, device, backend process group). It keeps the rank map, the
set-up cells that ``%dist restart`` replays and the checkpoint it restores. Everything about
rank processes (deaths, stacks) goes through the launcher. What ``%dist restart`` brings back is
its :class:`~jdist.kernel.recoverylog.RecoveryLog` (``cluster.recovery``). One cluster per kernel:
:func:`current`.

Example:
    >>> from jdist.options import ClusterConfig
    >>> c = ClusterSession(ClusterConfig(n=2)); c.start()     # doctest: +SKIP
    >>> c.pull("rank")                                        # doctest: +SKIP
    [0, 1]
    >>> c.stop()                                              # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from jdist.common.controller import engine_states
from jdist.common.last_words import lines_of
from jdist.common.stacks import SETUP_DUMP_PREFIX, Frame, Sample, crash_lines, format_stack, parse_setup_dump
from jdist.common.waiting import poll_until
from jdist.errors import ClusterError
from jdist.options import ClusterConfig
from jdist.plugins import launcher_class, option_table
from jdist.protocol import PROTOCOL_VERSION, STATE_VERSION, ClusterState, RankCall, RankEntry, RankInfo, SetupConfig

from . import statefile
from .launch import RankDeath, RankLauncher, ipcontroller
from .recoverylog import RecoveryLog
from .supervise.sigint import SigintCount

#: How often the controller pings each engine (ms). It registers an engine when it first hears its
#: heart, so ipyparallel's default of 3000 ms kept every start waiting about 4 s longer (measured:
#: 2 engines registered in 6.0 s at 3000 ms, 1.5 s at 500 ms); 200 ms took the first -n 2 cell
#: from 3.2-3.8 s to 2.8-2.9 s (3 runs each; the controller's CPU: see docs/benchmarks.md). While the
#: engines register, the controller beats every 50 ms instead (launch/ipcontroller.py: the ranks
#: registered -> the kernel sees them, 0.09 s instead of 0.35 s, medians of 5).
HEARTBEAT_MS = 200
#: Missed pings before the controller drops an engine: 150 x 200 ms keeps ipyparallel's default
#: tolerance (10 x 3000 ms = 30 s) for a rank whose machine is busy.
HEARTBEAT_MISSES = 150
#: On stop, how long idle ranks get to end their processes themselves (they take ~0.05 s) before
#: ipyparallel's launcher sends SIGTERM (an engine's own shutdown on SIGTERM takes about a second).
EXIT_WAIT_S = 2.0
#: On stop of busy ranks, how long the engines get to confirm the SIGKILL their nannies send. A rank
#: killed together with its nanny (a lost node, an OOM kill of its process group) never answers: with
#: no bound, %dist stop waited for ever (tests/test_cluster.py); the launcher ends what is left.
SIGNAL_WAIT_S = 10.0
#: How much longer than ``--timeout`` the kernel waits for the ranks' set-up: the process group's own
#: timeout (the same ``--timeout``) gives a better error than the kernel's giving up, and the imports are
#: not bounded by ``--timeout`` (TensorFlow's takes 7 s on an idle 2-core machine; with ``--timeout 5``,
#: two TF ranks restarting beside other work had not set up within 30 s more, seen in a test run).
SETUP_SLACK_S = 60.0
#: The innermost frames of a rank's stack shown when its set-up did not end in time.
SETUP_FRAMES = 12
#: The last lines of the ranks' output shown when one of them ended during its set-up.
SETUP_OUTPUT_LINES = 40
#: In the cluster's private folder: the owner's PID and start time, which the controller watches.
OWNER_FILE = "owner"


#: Where the ranks' output begins in the error of a rank that ended in its set-up.
_SETUP_OUTPUT = "The ranks' output (its last lines):"


class _SetupCrash(Exception):
    """A rank's process crashed in its set-up: ``error`` says so (:meth:`ClusterSession.start` tries once more)."""

    def __init__(self, error: ClusterError):
        super().__init__(error.lines[0])
        self.error = error


def _engine_died(ar: Any) -> bool:
    """Whether ipyparallel failed ``ar`` because an engine died ("Engine 1 died while running task")."""
    try:
        ar.get(timeout=0)
    except Exception as exc:
        return any(e[0] == "EngineError" for e in getattr(exc, "elist", ()))
    return False


class ClusterSession:
    """An ipyparallel cluster of ranks with a backend set up on each (see the module doc).

    ``ranks`` holds each rank's :class:`jdist.protocol.RankInfo`; the mapping from rank to
    ipyparallel engine id comes from the ranks themselves.
    """

    def __init__(self, config: ClusterConfig):
        option_table().check(config)
        self.config = config
        self.launcher: RankLauncher | None = None
        self.ipp: Any = None  # ipyparallel.Cluster
        self.client: Any = None  # ipyparallel.Client
        self.ranks: list[RankInfo] = []
        self._engine_of_rank: dict[int, int] = {}
        self.started_at: float | None = None
        self.state_file: Path | None = None
        self.paused: set[int] = set()  # ranks stopped at breakpoint() (the sidebar shows them paused)
        #: Ranks whose part of a cell did not stop after an interrupt or a release: (its ipyparallel future,
        #: where it waited); a later cell would queue behind it (:meth:`require_free`)
        self.unfinished: dict[int, tuple[Any, str]] = {}
        self.work_dir: Path | None = None  # private (0700): process-group store, rank stack dumps
        #: What %dist restart replays before restoring a checkpoint.
        self.recovery = RecoveryLog()
        self._reaper: Any = None  # the reaper process (ranks on other hosts)
        self._reaper_plan: Path | None = None

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.client is not None

    @property
    def cluster_id(self) -> str | None:
        """The ipyparallel cluster id (new at every start), or None when not running."""
        return self.ipp.cluster_id if self.ipp is not None else None

    def start(self, progress: Callable[[str], None] | None = None) -> list[RankInfo]:
        """Start controller and engines, wait for all ranks, set up the backend on them.

        ``progress(message)`` is called with human-readable progress lines. A rank whose process crashes in
        its set-up (a fatal signal: :meth:`RankLauncher.crashed`) is said with where it crashed, and the ranks
        start once more: a crash in a library's start can be a one-off (a race in C++ code). A second crash
        fails the start.
        """
        say = progress or (lambda msg: None)
        try:
            return self._start(say)
        except _SetupCrash as crash:
            said = crash.error.lines[1:crash.error.lines.index(_SETUP_OUTPUT)]  # what ended, where it crashed
            say("\n".join([*said, "Starting the ranks once more: a crash in their set-up "
                            "can be a one-off (a second one fails the start)..."]))
        try:
            return self._start(say)
        except _SetupCrash as crash:
            raise ClusterError(*crash.error.lines[:1], "A rank crashed in the ranks' first start too (said above).",
                               *crash.error.lines[1:]) from None

    def _start(self, say: Callable[[str], None]) -> list[RankInfo]:
        import ipyparallel as ipp

        n = self.config.n
        t0 = time.perf_counter()
        self.recovery.take()  # new ranks: nothing of the old ones' to replay (recovery.restart took it first)
        self.work_dir = Path(tempfile.mkdtemp(prefix="jdist-"))  # mode 0700
        ipcontroller.write_owner(self.work_dir / OWNER_FILE, os.getpid())  # the controller watches it
        launcher = self.launcher = launcher_class(self.config.launcher)(self.config, self.work_dir)
        launcher.say = say
        try:
            launcher.probe()
            cluster = ipp.Cluster(
                engines=launcher.engine_launcher_class(),
                n=n,
                cluster_id=f"jdist-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                controller_ip=launcher.controller_ip,
                shutdown_atexit=False,  # stop() is registered instead: engines first, so it takes 1 s, not 4
                # ipyparallel logs to the kernel's stdout; at WARNING it dumps engine logs on every stop
                log_level=logging.ERROR,
                # the controller warns once per jdist data message ("unhandled iopub msg_type")
                controller_args=[f"--engines={n}", f"--owner-file={self.work_dir / OWNER_FILE}", "--log-level=ERROR",
                                 f"--HeartMonitor.period={HEARTBEAT_MS}",
                                 f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"]
                + (["--IPController.enable_curve=True"] if self.config.encrypt else []),
            )
            # ipyparallel's controller, beating quicker while the engines register (launch/ipcontroller.py)
            cluster.config.ControllerLauncher.controller_cmd = [sys.executable, "-m", ipcontroller.__name__]
            launcher.configure(cluster.config)
            cluster.update_config(cluster.config)  # the Cluster's own options the launcher set
            self.ipp = cluster
            atexit.register(self.stop)  # a kernel that exits stops its cluster
            say(f"Starting {n} MPI rank(s){launcher.where()}...")
            cluster.start_controller_sync()
            cluster.start_engines_sync(n)
            launcher.attach(cluster)
            if launcher.remote:
                self._start_reaper()
            self.client = cluster.connect_client_sync()
            with SigintCount() as sigints:  # a Ctrl-C that Python drops in a destructor is raised again
                self._wait_for_engines(say, t0, sigints.check)
                say(f"{n} rank(s) registered after {time.perf_counter() - t0:.1f} s; "
                    f"setting up {self.config.backend}...")
                self._setup_ranks(sigints.check)
        except BaseException:
            self.stop()
            raise
        self.started_at = time.time()
        self.state_file = statefile.write(self.state())  # lets the Jupyter server list this cluster; best effort
        kinds = sorted({r["device"] for r in self.ranks})
        say(
            f"Ready: {n} rank(s), backend {self.backend_label()}, device(s) {', '.join(kinds)} "
            f"({time.perf_counter() - t0:.1f} s)."
        )
        return self.ranks

    def backend_label(self) -> str:
        """The backend with the values of its own options: ``deepspeed (zero 3, offload none)``."""
        from jdist.plugins import backend_spec

        own = backend_spec(self.config.backend).options
        values = ", ".join(f"{o.name} {self.config.get(o.name, o.default)}" for o in own)
        return f"{self.config.backend} ({values})" if values else self.config.backend

    def _start_reaper(self) -> None:
        """Ranks on other hosts: a reaper ends the controller, the launcher and the job step if this
        kernel dies without stopping them (:mod:`jdist.kernel.reaper`)."""
        from . import reaper

        assert self.work_dir is not None and self.launcher is not None
        self._reaper_plan = self.work_dir / "reaper.json"
        self._write_reaper_plan()
        self._reaper = reaper.start(self._reaper_plan)

    def _write_reaper_plan(self) -> None:
        from . import reaper

        assert self.launcher is not None
        pids = [self.ipp.controller.process.pid, *self.launcher.processes()]
        reaper.write_plan(self._reaper_plan, os.getpid(), pids, self.launcher.cleanup_commands())

    def _wait_for_engines(self, say: Callable[[str], None], t0: float, check: Callable[[], None]) -> None:
        """Until every rank registered; ``check`` at each look raises a Ctrl-C that Python dropped."""
        launcher, n = self.launcher, self.config.n
        assert launcher is not None
        seen = [-1]

        def registered() -> bool:
            check()
            have = len(self.client.ids)
            if have < n and have != seen[0]:
                say(f"  {have}/{n} ranks registered ({time.perf_counter() - t0:.1f} s)")
            seen[0] = have
            dead = launcher.exited_early() if have < n else None
            if dead is not None:
                raise ClusterError(f"The launch failed with {have}/{n} ranks registered ({launcher.program} or a "
                                   "rank ended). What ended, and the launch's output:", dead)
            return have >= n

        if not poll_until(registered, self.config.start_timeout):
            raise ClusterError(
                f"Only {seen[0]}/{n} ranks registered within {self.config.start_timeout:g} s. "
                "Try fewer ranks (-n), or a longer --start-timeout."
            )

    def _setup_ranks(self, check: Callable[[], None]) -> None:
        """Every rank's set-up (:func:`jdist.rank.bootstrap.setup`); ``check`` at each look raises a Ctrl-C that
        Python dropped."""
        import ipyparallel as ipp

        from jdist.common.procs import identity

        assert self.launcher is not None
        engines = list(self.client.ids)
        view = self.client[engines]  # results come back in this order
        controller = identity(self.ipp.controller.process.pid)
        cfg = SetupConfig(
            backend=self.config.backend, gpus=self.config.gpus, timeout=self.config.timeout, port=self.config.port,
            options=option_table().rank_options(self.config), work_dir=str(self.work_dir),
            cluster_id=self.cluster_id or "jdist",
            # local ranks end themselves (and the controller) if this process dies without stopping
            # them; with ranks on other hosts the reaper does (_start_reaper)
            owner=None if self.launcher.remote else {
                "host": socket.gethostname(), "pid": os.getpid(),
                "controller": [controller["pid"], controller["create_time"]]},
            network=self.launcher.network(), report_env=list(self.launcher.report_env),
        )
        ar = view.apply_async(RankCall("setup"), cfg)
        wait = self.config.timeout + SETUP_SLACK_S
        ended: list[str] = []
        poll_until(lambda: check() or ar.ready() or self._ended_in_setup(ended), wait)
        if not ended and ar.ready() and _engine_died(ar):
            poll_until(lambda: self._ended_in_setup(ended), 2.0)  # its shell writes the exit status a moment later
        if ended:  # MPI cannot go on without it: the others wait for it, or were ended, so theirs is no cause
            error = ClusterError(f"Setting up backend {self.config.backend!r} on the ranks failed: a rank's process "
                                 "ended.", *self._ended_lines(ended[0]))
            if self.launcher.crashed():
                raise _SetupCrash(error)
            raise error
        try:
            infos = ar.get(timeout=0)
        except ipp.error.TimeoutError as exc:
            raise ClusterError(*self._setup_timed_out(len(engines) - ar.progress, len(engines), wait)) from exc
        except Exception as exc:
            raise ClusterError(f"Setting up backend {self.config.backend!r} on the ranks failed: {exc}") from exc
        versions = {info.get("protocol") for info in infos}
        if versions != {PROTOCOL_VERSION}:
            raise ClusterError(f"The ranks run a jdist that speaks protocol {sorted(map(str, versions))}, this kernel "
                               f"{PROTOCOL_VERSION}: install the same jdist for the kernel and the ranks.")
        worlds = sorted({info["world_size"] for info in infos})
        if worlds != [self.config.n]:
            raise ClusterError(
                f"The {self.config.n} ranks started as {len(infos) // max(1, worlds[0])} MPI world(s) of size "
                f"{'/'.join(map(str, worlds))}, not one of {self.config.n}: the launcher did not give them a "
                "process manager they share (with Slurm, srun needs --mpi=pmi2 and an MPI built with PMI2; "
                "jdist passes it).")
        self._engine_of_rank = {info["rank"]: eid for eid, info in zip(engines, infos)}
        self.ranks = sorted(infos, key=lambda i: i["rank"])
        self.launcher.attach_client(self.client, self._engine_of_rank)
        self.launcher.watch(self.ranks)
        if self.launcher.remote:
            self._write_reaper_plan()  # now with the Slurm job step

    def _ended_in_setup(self, ended: list[str]) -> bool:
        """Whether a rank's process (or the engine launcher) ended during the set-up; what ended, with the ranks'
        output, is appended to ``ended``."""
        assert self.launcher is not None
        text = self.launcher.exited_early("during its set-up")
        if text:
            ended.append(text)
        return bool(text)

    def _ended_lines(self, text: str) -> list[str]:
        """What ended (the launcher's lines), where each rank that crashed was, and the output's last lines (much
        of it is ipyparallel's own log)."""
        assert self.launcher is not None
        lines = text.splitlines()
        head = list(itertools.takewhile(lambda line: line.startswith("rank ") or line.endswith(" exited"), lines))
        launcher = self.launcher
        crashes = [line for rank, report in sorted(launcher.crash_reports().items(), key=lambda kv: kv[0] or 0)
                   for line in [*lines_of(rank, launcher.last_words(rank)), *crash_lines(rank, report)]]
        return [*head, *crashes, _SETUP_OUTPUT, *lines[len(head):][-SETUP_OUTPUT_LINES:]]

    def _setup_timed_out(self, pending: int, n: int, waited: float) -> list[str]:
        """The lines of the error when set-up did not end in time: how many ranks, and where each waited
        at its newest stack dump (:func:`jdist.rank.bootstrap.watch_setup` writes one every ``--timeout`` s)."""
        lines = [f"Setting up backend {self.config.backend!r} on the ranks did not end within {waited:g} s "
                 f"(--timeout {self.config.timeout:g} and {SETUP_SLACK_S:g} s more): {pending} of {n} rank(s) "
                 "still at it. Start the ranks again (run the cell or the command again); give a longer --timeout if "
                 "set-up is this slow here."]
        dumps = sorted(self.work_dir.glob(f"{SETUP_DUMP_PREFIX}*.txt")) if self.work_dir is not None else []
        for rank, pid, frames, count in sorted(filter(None, (parse_setup_dump(p.read_text(errors="replace"))
                                                             for p in dumps))):
            ours = [i for i, (file, _, _) in enumerate(frames) if "/jdist/rank/" in file.replace(os.sep, "/")]
            frames = frames[:ours[-1] + 1] if ours else frames  # from the set-up's entry in, not the engine's loop
            lines += [f"Rank {rank} (process {pid}), {max(1, count) * self.config.timeout:g} s into its set-up "
                      "(innermost call last):",
                      format_stack(frames[:SETUP_FRAMES]) if frames else "  (its stack was not written)"]
        if not dumps and self.launcher is not None and self.launcher.output().strip():
            lines += ["The ranks' output (with their stacks, written every --timeout s):",
                      *self.launcher.output().splitlines()[-40:]]
        return lines

    def controller_pid(self) -> int | None:
        """The PID of this cluster's ipyparallel controller (started by this process), or None."""
        controller = getattr(self.ipp, "controller", None)
        return getattr(controller, "pid", None)

    def stop(self, busy: bool = False) -> None:
        """Stop engines and controller (teardown on the ranks first, best effort). Idempotent.

        ``busy``: the ranks still run code (``jdist run`` ending them on a second Ctrl-C): no
        teardown, which would wait for them, only the launcher's signals. Ranks the controller sees busy
        (still in a cell that did not stop after an interrupt) are stopped the same way: a teardown would
        wait for them (5 s), then ipyparallel's signals, which they may ignore (measured: 20 s more). Ranks whose
        processes have all ended (the launcher says so; MPI and Slurm end the job after a rank's death) are
        neither asked nor signalled: the engines of a Slurm step killed with their nannies never confirmed the
        signal, and the stop waited its 10 s bound."""
        client, cluster, launcher = self.client, self.ipp, self.launcher
        gone = False  # every rank's process has ended (after a death: MPI or Slurm ended the job)
        if launcher is not None and self.ranks:
            try:
                gone = len(set(launcher.deaths())) >= len(self.ranks)
            except Exception:  # the launcher cannot tell: ask the ranks as usual
                pass
        if client is not None and not busy and not gone:
            try:
                busy = "busy" in engine_states(client).values()
            except Exception:  # no answer from the controller: the gentle way, with its timeouts
                pass
        self.client = self.ipp = self.launcher = None
        atexit.unregister(self.stop)
        statefile.remove(self.state_file)
        self.state_file = None
        n_ranks, self.ranks, self._engine_of_rank, self.unfinished = len(self.ranks), [], {}, {}
        work_dir, self.work_dir = self.work_dir, None
        reaper_proc, self._reaper = self._reaper, None
        if client is not None and not busy and not gone:
            try:
                client[:].apply_async(RankCall("teardown")).get(timeout=5)
                # idle ranks end their processes themselves, at once (no reply comes back; the
                # client stays open until they did, or the request could be dropped unsent)
                client[:].apply_async(RankCall("exit_process"))
                if launcher is not None and launcher.wait_ended(n_ranks, EXIT_WAIT_S):
                    launcher.ranks_ended()  # else ipyparallel's SIGTERM below ends them, slowly
            except Exception:
                pass  # engines may be dead or busy; stopping them below releases everything
        if client is not None and busy and not gone:
            try:  # through the controller (each engine's nanny): also ranks on other hosts
                client.send_signal(signal.SIGKILL, block=False).result(SIGNAL_WAIT_S)
            except Exception:
                pass  # an engine whose nanny is gone never answers; the others got their signal
            try:  # mpiexec notices its killed ranks only ~2 s later (measured): end it once they are gone
                if launcher is not None and launcher.wait_ended(n_ranks, EXIT_WAIT_S):
                    launcher.ranks_ended()
            except Exception:
                pass  # mpiexec's SIGTERM, then SIGKILL after 5 s, below
        if client is not None:
            client.close()
        if launcher is not None:
            launcher.stopping()
        if cluster is not None:
            # engines first, then the controller: stopped together (ipyparallel's stop_cluster), the
            # engines outlive their controller and take about 3 s more to exit
            cluster.stop_engines_sync()
            cluster.stop_controller_sync()
            # the controller keeps an engine-id file per cluster id (ours are never reused) and never
            # removes it: ipyparallel 9 defines Hub._cleanup_engine_state_file but calls it nowhere
            (Path(cluster.profile_dir) / "log" / f"engines{cluster.cluster_id}.json").unlink(missing_ok=True)
        if launcher is not None:
            launcher.stop()
        if work_dir is not None:
            shutil.rmtree(work_dir, ignore_errors=True)  # the reaper's plan with it: it has nothing to do
        if reaper_proc is not None:
            reaper_proc.terminate()
            reaper_proc.wait(5)

    # -- handing a cluster over (jdist run --keep, %dist attach) -------------------------------
    def detach(self) -> None:
        """Forget the cluster without stopping it: a kernel attached it and owns it now (its ranks,
        controller, launcher and private folder stay; so does the state file, which the kernel rewrote)."""
        atexit.unregister(self.stop)
        statefile.forget(self.state_file)
        if self.client is not None:
            self.client.close()
        self.client = self.ipp = self.launcher = None
        self.state_file = self.work_dir = None
        self.ranks, self._engine_of_rank, self.unfinished = [], {}, {}

    @classmethod
    def attach(cls, state: dict[str, Any], work_dir: Path) -> ClusterSession:
        """Take over a running cluster that its owner (``jdist run --keep``) offers: from its state
        file (``state``) and private folder. The ranks keep their variables and from now on end
        when this process does; this process writes the state file the sidebar reads."""
        import json

        import ipyparallel as ipp

        from .launch.mpi import engine_set_launcher

        table = option_table()
        given = {k: v for k, v in state["config"].items() if k in table.by_name and v is not None}
        self = cls(table.config(given))
        self.work_dir = Path(work_dir)
        saved = json.loads(Path(state["cluster_file"]).read_text())
        saved["engines"]["class"] = engine_set_launcher()  # jdist's class: not importable by name
        self.ipp = ipp.Cluster.from_dict(saved, shutdown_atexit=False, log_level=logging.ERROR)
        try:
            self.launcher = launcher_class(self.config.launcher)(self.config, self.work_dir)
            self.launcher.attach(self.ipp)
            self.client = self.ipp.connect_client_sync()
            self.ranks = [RankInfo(**{k: v for k, v in entry.items() if k != "engine_id"})  # type: ignore[typeddict-item]
                          for entry in state["ranks"]]
            self._engine_of_rank = {entry["rank"]: entry["engine_id"] for entry in state["ranks"]}
            if not poll_until(lambda: set(self._engine_of_rank.values()) <= set(self.client.ids), 10):
                raise ClusterError("The ranks of the cluster to attach are not all registered with its controller.")
            self.launcher.attach_client(self.client, self._engine_of_rank)
            self.launcher.watch(self.ranks)
            ipcontroller.write_owner(self.work_dir / OWNER_FILE, os.getpid())  # the controller's owner now
            self.call("set_owner", os.getpid())
        except BaseException:
            self.detach()
            raise
        atexit.register(self.stop)
        self.started_at = state.get("started_at") or time.time()
        self.state_file = statefile.write(self.state())
        return self

    def set_paused(self, rank: int, paused: bool) -> None:
        """Rank ``rank`` stopped at / went on from ``breakpoint()``: the state file says so (the sidebar)."""
        before = set(self.paused)
        (self.paused.add if paused else self.paused.discard)(rank)
        if self.paused != before and self.state_file is not None:
            self.state_file = statefile.write(self.state())

    def require_free(self, ranks: Sequence[int] | None, what: str, narrow: str = "--targets") -> None:
        """Raise a :class:`ClusterError` naming the ranks of ``ranks`` (None: all) still in an earlier cell that
        did not stop: ``what`` (e.g. "This cell") would wait behind it, so it is not sent. ``narrow``: the
        option that picks other ranks. Asks nothing of the ranks: the cell's futures say whether their part ended."""
        from .supervise.report import rank_ranges

        self.unfinished = {r: (f, where) for r, (f, where) in self.unfinished.items() if not f.done()}
        busy = {r: self.unfinished[r][1] for r in (sorted(self._engine_of_rank) if ranks is None else ranks)
                if r in self.unfinished}
        if busy:
            raise ClusterError(
                f"{what} did not run: {rank_ranges(busy)} {'is' if len(busy) == 1 else 'are'} still in an earlier "
                "cell that did not stop, and it would wait behind it. Run %dist restart to get the ranks back (their "
                f"variables are lost), or {narrow} another rank. Where the earlier cell had them when it ended:",
                *(f"  rank {r}: {where}" for r, where in sorted(busy.items())))

    def restart(self, progress: Callable[[str], None] | None = None) -> list[RankInfo]:
        """Stop and start again with the same configuration (all rank state is lost)."""
        self.stop()
        return self.start(progress)

    # -- using the ranks -------------------------------------------------------------------
    def _require(self) -> Any:
        if self.client is None:
            raise ClusterError("No jdist cluster is running. Start one with %%distributed -n 2 (or --gpus N).")
        return self.client

    def engine_of(self, rank: int) -> int:
        return self._engine_of_rank[rank]

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
            raise self._gone(gone)
        return [self._engine_of_rank[r] for r in ranks]

    @staticmethod
    def _gone(ranks: Sequence[int]) -> ClusterError:
        return ClusterError(
            f"Rank(s) {', '.join(map(str, ranks))} are gone: their processes died. "
            "Run %dist restart to start fresh ranks (their variables are lost)."
        )

    def _send(self, ranks: Sequence[int] | None, send: Callable[[Any, list[int]], Any]) -> Any:
        """``send(client, engine ids)`` for ``ranks`` after :meth:`engine_ids`' check. ipyparallel's IO thread
        may unregister a dead engine between that check and the send (its lookup then raises ``KeyError``):
        that is the same ClusterError as a death the check found."""
        client = self._require()
        engines = self.engine_ids(ranks)
        try:
            return send(client, engines)
        except KeyError as exc:
            if not exc.args or exc.args[0] not in engines:
                raise
            raise self._gone([r for r, e in self._engine_of_rank.items() if e == exc.args[0]]) from None

    def rank_of_engine(self, engine_id: int) -> int:
        return {e: r for r, e in self._engine_of_rank.items()}[engine_id]

    def execute(self, code: str, ranks: Sequence[int] | None = None) -> Any:
        """Send ``code`` to run on ``ranks`` (default all); returns the ipyparallel AsyncResult."""
        return self._send(ranks, lambda client, engines: self._started(client[engines]).execute(
            code, silent=False, block=False))

    def apply_async(self, fn: Callable[..., Any], *args: Any, ranks: Sequence[int] | None = None) -> Any:
        """Send the picklable ``fn(*args)`` to ``ranks`` without waiting; the ipyparallel AsyncResult."""
        return self._send(ranks, lambda client, engines: self._started(client[engines]).apply_async(fn, *args))

    def _started(self, view: Any) -> Any:
        if self.launcher is not None:
            self.launcher.cell_started()
        return view

    def apply(self, fn: Callable[..., Any], *args: Any, ranks: Sequence[int] | None = None,
              timeout: float | None = 30) -> list[Any]:
        """Call the picklable ``fn(*args)`` on ``ranks`` (default all); the results in rank order."""
        return self._send(ranks, lambda client, engines: client[engines].apply_async(fn, *args)).get(timeout=timeout)

    def call(self, name: str, *args: Any, ranks: Sequence[int] | None = None, timeout: float | None = 30) -> list[Any]:
        """Run ``jdist.rank.rpc.<name>(*args)`` on ``ranks``; the results in rank order."""
        return self.apply(RankCall(name), *args, ranks=ranks, timeout=timeout)

    def reply(self, rank: int, msg_type: str, content: dict[str, Any]) -> None:
        """Send ``content`` to a rank that waits for it, on its engine's control channel (answered on the
        rank's control thread while its cell runs: :func:`jdist.rank.channel.on_control`); no wait."""
        self.control(rank, msg_type, content)

    def control(self, rank: int, msg_type: str, content: dict[str, Any]) -> Any:
        """Send ``content`` as ``msg_type`` on ``rank``'s engine control channel; the reply's future."""
        return self._send([rank], lambda client, engines: client._send_control_request(
            targets=engines, msg_type=msg_type, content=content, block=False))

    def interrupt(self, ranks: Sequence[int] | None = None, timeout: float = 10.0) -> None:
        """Send SIGINT to the rank processes through the controller (KeyboardInterrupt in their code);
        ``ranks`` None: all, empty: none. Waits at most ``timeout`` s for the engines to confirm: the
        caller's grace period then names the ranks that did not stop, rather than waiting forever."""
        if ranks is not None and not list(ranks):
            return
        sent = self._send(ranks, lambda client, engines: client.send_signal(signal.SIGINT, targets=engines, block=False))
        try:
            sent.result(timeout)
        except TimeoutError:
            pass

    def pull(self, name: str, ranks: Sequence[int] | None = None) -> list[Any]:
        """The value of ``name`` from each rank's namespace, in rank order."""
        self.require_free(ranks, f"%dist pull {name}", "--rank")
        return self.call("get_global", name, ranks=ranks)

    def push(self, name: str, value: Any, ranks: Sequence[int] | None = None) -> None:
        """Set ``name`` to ``value`` in each rank's namespace (``%dist restart`` pushes it again)."""
        self.require_free(ranks, f"%dist push {name}", "--rank")
        self._send(ranks, lambda client, engines: client[engines].push({name: value}, block=True))
        self.recovery.note_push(name, value, list(ranks) if ranks is not None else None)

    def apply_live(self, changes: dict[str, Any]) -> list[str]:
        """Change live options (``jdist.options.Scope.LIVE``) on the running cluster: those the ranks
        apply (``applied_by="ranks"``) are sent to every rank at once; the config keeps them all.
        Returns the lines the changes print (their options' ``message``)."""
        table = option_table()
        new = self.config.replace(**changes)
        table.check(new)
        on_ranks = {name: value for name, value in changes.items() if table.option(name).applied_by == "ranks"}
        if on_ranks:
            self.call("apply_options", on_ranks)
        self.config = new
        return table.live_messages(changes)

    # -- faults ----------------------------------------------------------------------------
    def stacks(self, ranks: Sequence[int] | None = None, timeout: float = 2.0) -> dict[int, list[Frame]]:
        """The main thread's Python stack of each rank (innermost first), also while it is
        blocked in C++. Ranks that did not answer within ``timeout`` map to an empty list."""
        self._require()
        assert self.launcher is not None
        wanted = [info for info in self.ranks if ranks is None or info["rank"] in ranks]
        return self.launcher.stacks(wanted, timeout)

    def samples(self, ranks: Sequence[int] | None = None, timeout: float = 1.0) -> dict[int, Sample]:
        """Each rank's stack and progress counters (:class:`jdist.common.stacks.Sample`; the hang watchdog)."""
        self._require()
        assert self.launcher is not None
        wanted = [info for info in self.ranks if ranks is None or info["rank"] in ranks]
        return self.launcher.samples(wanted, timeout)

    def dead_ranks(self) -> list[int]:
        """Ranks whose process has ended, the first to end first (cheap: every poll of a cell)."""
        return self.launcher.deaths() if self.launcher is not None else []

    def wait_all_ended(self, timeout: float) -> bool:
        """After a death (MPI ends the others): wait until every rank's process has ended, as the launcher sees it
        (on other hosts, each rank's exit line comes after the shell around it removed its MPI segments), at most
        ``timeout`` s; whether they all did. A new job started on a host before then can meet what the old one
        left there."""
        from jdist.common.waiting import poll_until

        return poll_until(lambda: len(set(self.dead_ranks())) >= len(self.ranks), timeout, interval=0.05)

    def death_report(self, dead: Sequence[int]) -> RankDeath:
        """Which rank died first and why (it takes the others down: MPI ends the whole job). An engine whose
        controller is gone ends by itself once it has missed the controller's heartbeat for about 35 s
        (ipyparallel's 50 checks, each 0.7 s here): then the controller's end is the cause."""
        import dataclasses

        from jdist.common.procs import pid_alive

        assert self.launcher is not None
        death = self.launcher.death(dead)
        pid = self.controller_pid()
        if pid is not None and not pid_alive(pid):
            death = dataclasses.replace(death, cause=(
                f"its controller (ipyparallel's, PID {pid}) had ended, and an engine leaves once the controller's "
                f"heartbeat has been gone for about 35 s (the rank: {death.cause})"))
        return death

    def state(self) -> ClusterState:
        """What the state file says of this started cluster, for the Jupyter server (:mod:`jdist.kernel.statefile`)."""
        from jdist import __version__
        from jdist.common.procs import identity
        from jdist.metrics import default_run_dir

        ipp = self.ipp
        return ClusterState(
            version=STATE_VERSION,
            jdist=__version__,
            cluster_id=ipp.cluster_id,
            host=socket.gethostname(),
            launcher=self.config.launcher,
            kernel=statefile.kernel_identity(),
            python=sys.executable,
            controller=identity(ipp.controller.process.pid),
            client_file=str(ipp.controller.connection_files["client"]),
            cluster_file=str(ipp.cluster_file),
            config=self.config.as_dict(),
            options=option_table().describe(self.config),  # type: ignore[typeddict-item]
            ranks=[RankEntry(**info, engine_id=self.engine_of(info["rank"])) for info in self.ranks],
            started_at=self.started_at or time.time(),
            written_at=time.time(),
            run_dir=str(default_run_dir()),
            paused=sorted(self.paused),
        )

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
            "config": self.config.as_dict(),
            "backend": self.backend_label(),  # with its own options' values, as the start line says it
            "uptime_s": time.time() - (self.started_at or time.time()),
            "cluster_id": self.cluster_id,
            "ranks": ranks,
        }


_current: ClusterSession | None = None


def current() -> ClusterSession | None:
    """The kernel's running cluster, or None."""
    return _current if _current is not None and _current.running else None


def set_current(cluster: ClusterSession | None) -> None:
    global _current
    _current = cluster


__all__ = ["ClusterSession", "current", "set_current"]
