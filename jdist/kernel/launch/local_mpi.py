"""``--launcher local-mpi`` (the default): MPI ranks on the kernel's machine, listening nowhere.

The ranks are ipyparallel engines started by ipyparallel's ``MPIEngineSetLauncher`` with
MPICH's ``mpiexec.gforker`` from the running environment (not from PATH): Hydra, plain
``mpiexec``, keeps a control port open on every interface for the whole job, whatever its
options; gforker runs the ranks on one host and listens nowhere. MPI's UCX is kept on ``lo``.

Because the ranks are local processes, this launcher watches them by PID: a thread waits on
their pidfds and notes which ended first; each engine runs under a small shell that writes its
own exit status into the cluster's private folder (mpiexec reports one status only, often of a
rank it killed while cleaning up); stacks come from samples (``SIGUSR2``: the guard's thread writes the
main thread's frames into that folder) or, for a rank that does not answer one, are dumped by ``SIGUSR1``
(faulthandler, see :mod:`jdist.rank.guard`); the kernel's cgroup tells an out-of-memory kill.

What the engines write to their own stdout and stderr (ipyparallel's engine log, C++ messages,
fatal errors; a cell's output goes to the notebook over IOPub instead) goes straight into the
engine launcher's output file, which jdist reads for start-up errors and causes of death, not
through gforker: gforker forwards a rank's output byte by byte and closes that rank's pipe at the
first byte above 127 (``fputc`` compared with a signed ``char``: MPICH's ``labelout.c``), so every
later write of the rank failed with ``BrokenPipeError``. gloo's "Connection closed by peer" text
ends in an emoji, and ipyparallel's engine logs it when a rank is released from a collective;
after that each cell printed a ``--- Logging error ---`` traceback.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from jdist.common.last_words import POS_SUFFIX, STDERR_ENV, unshown
from jdist.common.procs import alive, identity, mpi_shm_segments, orphaned_mpi_shm, pid_alive
from jdist.common.stacks import (CRASH_FILE, SAMPLE_SIGNAL, STACKS_SIGNAL, Frame, Sample, parse_faulthandler,
                                 parse_sample)
from jdist.common.waiting import poll_until
from jdist.plugins import backend_spec
from jdist.protocol import ProcessIdentity, RankInfo

from .api import RankDeath, RankLauncher
from .mpi import (CRASH_SIGNALS, cause_of_exit, engine_argv, engine_set_launcher, engine_shell, how_it_ended,
                  mpiexec_path)

#: The environment variable that names the engine launcher's output file to the shell around each engine.
OUTPUT_ENV = "JDIST_ENGINE_OUTPUT"
#: The shell around each engine: writes the engine's stdout and stderr to the launcher's output file
#: (appending, as mpiexec does; not through gforker's pipes: see the module doc) and records the
#: rank's own exit status in the cluster's folder.
RANK_WRAPPER = engine_shell(
    before=(f'if [ -n "${OUTPUT_ENV}" ]; then exec >>"${OUTPUT_ENV}" 2>&1; fi; unset {OUTPUT_ENV}; '
            f'{STDERR_ENV}={{stderr_file}}; export {STDERR_ENV}; rm -f "${STDERR_ENV}" "${STDERR_ENV}{POS_SUFFIX}"; '),
    after="echo $code > {exit_file}; exit $code")


def local_mpiexec() -> str:
    """MPICH's ``mpiexec.gforker`` next to :func:`mpiexec_path` when present (it listens nowhere)."""
    mpiexec = mpiexec_path()
    gforker = Path(mpiexec).with_name("mpiexec.gforker")
    return str(gforker) if gforker.exists() else mpiexec


def oom_kills() -> int | None:
    """The kernel's out-of-memory kills seen from here: the host's (``oom_kill`` of ``/proc/vmstat``, which counts
    those of every memory limit too) plus this process's cgroup's (cgroup v2 ``memory.events``), so that either
    moving shows; None where neither can be read (not Linux). Only a rise between two reads means anything."""
    total, found = 0, False
    for read in (_vmstat_oom_kills, _cgroup_oom_kills):
        try:
            count = read()
        except (OSError, ValueError, IndexError):
            continue
        if count is not None:
            total, found = total + count, True
    return total if found else None


def _vmstat_oom_kills() -> int | None:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return None


def _cgroup_oom_kills() -> int | None:
    cgroup = Path("/proc/self/cgroup").read_text().strip().split("::")[-1]
    for line in (Path("/sys/fs/cgroup") / cgroup.lstrip("/") / "memory.events").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return None


def local_engine_set_launcher() -> type:
    """ipyparallel's MPI engine launcher (:func:`~jdist.kernel.launch.mpi.engine_set_launcher`) that names
    its output file to the ranks (:data:`OUTPUT_ENV`; :data:`RANK_WRAPPER` writes there)."""

    class JdistLocalMPIEngineSetLauncher(engine_set_launcher()):  # type: ignore[misc]
        def get_env(self) -> dict[str, str]:
            return {**super().get_env(), OUTPUT_ENV: self.output_file}

    return JdistLocalMPIEngineSetLauncher


#: Largest rank count accepted for CPU ranks on this machine (each rank is a Python process with torch);
#: launchers that spread ranks over hosts have no such limit.
MAX_LOCAL_RANKS = 64


class LocalMPILauncher(RankLauncher):
    """MPI ranks on this machine (see the module doc)."""

    name = "local-mpi"

    @classmethod
    def check(cls, config: Any) -> None:
        """More than :data:`MAX_LOCAL_RANKS` CPU ranks on one machine are refused.

        >>> from jdist.options import ClusterConfig
        >>> LocalMPILauncher.check(ClusterConfig(n=128))
        Traceback (most recent call last):
        ...
        ValueError: -n 128 is more than 64 ranks on this machine; use -n 64 or fewer, or spread them over hosts (--hosts, --slurm).
        """
        if not config.gpus and config.n > MAX_LOCAL_RANKS:
            raise ValueError(f"-n {config.n} is more than {MAX_LOCAL_RANKS} ranks on this machine; use -n "
                             f"{MAX_LOCAL_RANKS} or fewer, or spread them over hosts (--hosts, --slurm).")

    def __init__(self, config: Any, work_dir: Path):
        super().__init__(config, work_dir)
        self._ranks: list[RankInfo] = []
        self._procs: list[Any] = []  # psutil.Process of each rank (watch)
        self._deaths: list[int] = []  # ranks whose process ended, in order (filled by the watch thread)
        self._shm: set[str] = set()  # the job's MPI shared-memory segments (removed at stop)
        self._unwatched: list[RankInfo] = []  # ranks without a pidfd (checked by PID)
        self._oom_before: int | None = None
        self._job: dict[int, ProcessIdentity] = {}  # every process seen under mpiexec (ended at stop)
        self._noted_at = 0.0

    def probe(self) -> None:
        mpiexec_path()

    def engine_launcher_class(self) -> type:
        return local_engine_set_launcher()

    def configure(self, ipp_config: Any) -> None:
        for path in orphaned_mpi_shm():  # a dead job's segment that this job could attach (see there)
            with contextlib.suppress(OSError):
                path.unlink()
        # the engines read the controller's connection file from the (local) profile directory, so
        # they start together with the controller instead of after it wrote its connection info
        ipp_config.Cluster.send_engines_connection_env = False
        ipp_config.MPILauncher.mpi_cmd = [local_mpiexec()]
        ipp_config.MPILauncher.environment = {
            # MPICH's default UCX netmod listens on every interface: keep it on loopback
            "UCX_NET_DEVICES": os.environ.get("UCX_NET_DEVICES", "lo"),
            # a rank told to exit must not wait in MPI_Finalize for peers that may be gone
            "MPI4PY_RC_FINALIZE": "false",
        }
        # mpiexec reports only one exit status, often of a rank it killed while cleaning up:
        # a shell around each engine writes the rank's own status (128+N: killed by signal N).
        # mpiexec signals only its direct children (these shells): they pass signals on.
        # It also names the file the rank's fd 2 goes to (jdist.common.last_words), read here if the rank dies.
        exit_file = shlex.quote(str(self.work_dir)) + '/exit-"${PMI_RANK:-unknown}"'
        stderr_file = shlex.quote(str(self.work_dir)) + '/stderr-"${PMI_RANK:-unknown}"'
        ipp_config.MPIEngineSetLauncher.engine_cmd = [
            "/bin/sh", "-c", RANK_WRAPPER.format(exit_file=exit_file, stderr_file=stderr_file), "jdist-rank",
            sys.executable, *engine_argv(backend_spec(self.config.backend).preimport),
        ]

    def note_job(self) -> None:
        """Remember every process under mpiexec by PID and start time: :meth:`stop` ends any that
        outlive the job (a rank stuck in ``MPI_Init`` when a start fails ignores mpiexec's end)."""
        import psutil

        for launcher in self.engine_launchers():
            proc = getattr(launcher, "process", None)
            if proc is None:
                continue
            try:
                children = proc.children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                if child.pid not in self._job:
                    try:
                        self._job[child.pid] = identity(child.pid)
                    except psutil.Error:
                        pass

    def job_processes(self) -> list[ProcessIdentity]:
        """The processes of the MPI job noted so far (:meth:`note_job`)."""
        return list(self._job.values())

    def exited_early(self, when: str = "before it registered") -> str | None:
        now = time.monotonic()
        if now - self._noted_at >= 0.25:  # while the ranks start: the processes to end if the start fails
            self._noted_at = now
            self.note_job()
        exits = self._rank_exits()
        if not exits and not self.engine_launcher_ended():
            return None  # a rank that ended before MPI_Init leaves mpiexec waiting on the others
        ended = "".join(f"rank {rank} {how_it_ended(code)} {when}\n" for rank, code in sorted(exits.items()))
        if self.engine_launcher_ended():
            ended += f"{self.program} exited\n"
        try:
            return ended + (self.output().strip() or "(no output)")
        except OSError:
            return ended + "(no output captured)"

    def crashed(self) -> bool:
        return any(code is not None and code - 128 in CRASH_SIGNALS for code in self._rank_exits().values())

    def _rank_exits(self) -> dict[int, int | None]:
        """The ranks whose shell wrote their exit status (``exit-<rank>`` in the work dir): ended."""
        exits: dict[int, int | None] = {}
        for path in self.work_dir.glob("exit-*"):
            try:
                rank = int(path.name[len("exit-"):])
            except ValueError:
                continue
            try:
                exits[rank] = int(path.read_text())
            except (OSError, ValueError):  # being written: ended all the same
                exits[rank] = None
        return exits

    # -- while the ranks run ----------------------------------------------------------------
    def watch(self, ranks: Sequence[RankInfo]) -> None:
        """A thread waits on pidfds of the ranks and notes which ends first."""
        self.note_job()
        import psutil

        self._ranks = list(ranks)
        self._shm = mpi_shm_segments([info["pid"] for info in ranks])
        self._procs = []  # each knows its start time: psutil signals none whose PID was reused since
        for info in ranks:
            with contextlib.suppress(psutil.Error):
                self._procs.append(psutil.Process(info["pid"]))
        fds = {}
        self._deaths, self._unwatched = [], []
        for info in ranks:
            try:
                fds[os.pidfd_open(info["pid"])] = info["rank"]
            except (OSError, AttributeError):  # no pidfd support: deaths() checks it by PID
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

    def deaths(self) -> list[int]:
        return list(self._deaths) + [info["rank"] for info in self._unwatched if not pid_alive(info["pid"])]

    def cell_started(self) -> None:
        self._oom_before = oom_kills()

    def death(self, dead: Sequence[int], wait: float = 2.0) -> RankDeath:
        """The cause comes from the rank's own exit status, written by the shell around its engine;
        a higher out-of-memory kill count than at the cell's start means the OOM killer acted."""
        self._end_survivors()
        first = dead[0] if dead else None
        exit_file = self.work_dir / f"exit-{first}"
        poll_until(exit_file.exists, wait, interval=0.02)
        try:
            code: int | None = int(exit_file.read_text())
        except (OSError, ValueError):
            code = None
        oom_now = oom_kills()
        oom = self._oom_before is not None and oom_now is not None and oom_now > self._oom_before
        crash = self.crash_reports().get(first, "")
        return RankDeath(first, cause_of_exit(code, oom), self.output().strip()[-2000:], code, crash,
                         self.last_words(first), oom=oom)

    def last_words(self, rank: int | None) -> str:
        """What the shell around the rank's engine named as its fd 2 (``stderr-<r>`` in the work folder) holds
        past what the rank forwarded."""
        return unshown(str(self.work_dir / f"stderr-{rank}")) if rank is not None else ""

    def crash_reports(self) -> dict[int | None, str]:
        """Each rank's crash file (``rank-<r>.crash`` in the work folder) that is not empty."""
        prefix, suffix = CRASH_FILE.split("{rank}")
        reports: dict[int | None, str] = {}
        for path in self.work_dir.glob(CRASH_FILE.format(rank="*")):
            try:
                text = path.read_text(errors="replace")
                rank = int(path.name[len(prefix):-len(suffix)])
            except (OSError, ValueError):
                continue
            if text.strip():
                reports[rank] = text
        return reports

    def _end_survivors(self) -> None:
        """MPI cannot go on without a rank: end the others now (by PID) rather than leave it to mpiexec."""
        import psutil

        for proc in self._procs:
            with contextlib.suppress(psutil.Error):  # ended, or its PID is another process's now
                proc.kill()
        # until they have ended, so status says dead for every rank
        poll_until(lambda: len(self.deaths()) >= len(self._ranks), 1.0, interval=0.01)

    def stacks(self, ranks: Sequence[RankInfo], timeout: float = 2.0) -> dict[int, list[Frame]]:
        """Each rank's sample (:meth:`samples`: its guard's thread reads the main thread's frames under the GIL);
        for a rank whose sample does not come within half of ``timeout`` (its main thread holds the GIL in C code),
        SIGUSR1 by PID: its faulthandler appends a dump to ``rank-<r>.txt`` in the work folder. faulthandler
        reads the frames without the GIL, which is safe only while no other thread runs Python: it crashed ranks
        whose main thread ran (jdist.rank.bootstrap.watch_setup)."""
        t0 = time.monotonic()
        sampled = {r: list(sample.frames) for r, sample in self.samples(ranks, timeout / 2).items() if sample.frames}
        rest = [info for info in ranks if info["rank"] not in sampled]
        if rest:
            sampled.update(self._dumped_stacks(rest, max(0.1, timeout - (time.monotonic() - t0))))
        return {info["rank"]: sampled.get(info["rank"], []) for info in ranks}

    def _dumped_stacks(self, ranks: Sequence[RankInfo], timeout: float) -> dict[int, list[Frame]]:
        files = {}
        for info in ranks:
            path = self.work_dir / f"rank-{info['rank']}.txt"
            if path.exists():
                path.write_text("")  # the rank appends: start from an empty file
            files[info["rank"]] = path
            try:
                os.kill(info["pid"], STACKS_SIGNAL)
            except ProcessLookupError:
                pass
        out: dict[int, list[Frame]] = {}

        def read() -> bool:
            for info in ranks:
                r = info["rank"]
                if r not in out and files[r].exists():
                    frames = parse_faulthandler(files[r].read_text(), info["main_thread"])
                    if frames:
                        out[r] = frames
            return len(out) >= len(ranks)

        poll_until(read, timeout, interval=0.02)
        return {info["rank"]: out.get(info["rank"], []) for info in ranks}

    def samples(self, ranks: Sequence[RankInfo], timeout: float = 2.0) -> dict[int, Sample]:
        """SIGUSR2 by PID; each rank's guard thread writes ``rank-<r>.sample`` in the work folder."""
        files = {}
        for info in ranks:
            path = self.work_dir / f"rank-{info['rank']}.sample"
            path.unlink(missing_ok=True)  # the guard replaces it whole: its appearance is the answer
            files[info["rank"]] = path
            try:
                os.kill(info["pid"], SAMPLE_SIGNAL)
            except ProcessLookupError:
                pass
        out: dict[int, Sample] = {}

        def read() -> bool:
            for r, path in files.items():
                if r not in out:
                    try:
                        out[r] = parse_sample(path.read_text())
                    except FileNotFoundError:
                        continue
            return len(out) >= len(ranks)

        poll_until(read, timeout, interval=0.002)
        return {info["rank"]: out.get(info["rank"], Sample()) for info in ranks}

    def stopping(self) -> None:
        """Note the job's processes and the MPI shared-memory segments they hold: killed while
        starting (in ``MPI_Init``), ranks leave their segment behind."""
        self.note_job()
        self._shm |= mpi_shm_segments([ident["pid"] for ident in self._job.values() if alive(ident)])

    def _end_leftovers(self, wait: float = 2.0) -> None:
        """SIGKILL, by PID and start time, every noted process of the job that is still running
        (the cluster has stopped mpiexec by now), and remove their MPI shared-memory segments."""
        import psutil

        left = [ident for ident in self._job.values() if alive(ident)]
        self._job = {}
        if not left:
            return
        self._shm |= mpi_shm_segments([ident["pid"] for ident in left])
        for ident in left:
            try:
                psutil.Process(ident["pid"]).kill()
            except psutil.Error:
                pass
        poll_until(lambda: not any(alive(ident) for ident in left), wait, interval=0.02)

    def ranks_ended(self) -> None:
        """mpiexec's process manager takes about a second to notice that its ranks are gone;
        nothing of the job is left to wait for, so it is ended at once."""
        for launcher in self.engine_launchers():
            try:
                launcher.signal(signal.SIGKILL)
            except Exception:  # already gone
                pass

    def stop(self) -> None:
        self._ranks, self._procs, self._deaths, self._unwatched = [], [], [], []
        self._end_leftovers()
        # MPICH unlinks its shared-memory segment in MPI_Finalize; a job whose ranks were killed
        # leaves it in /dev/shm (2 MB each), and a later job whose segment gets the same name
        # hangs in MPI_Init. The segments were noted at watch(); the job has ended by now.
        for path in self._shm:
            try:
                os.unlink(path)
            except OSError:  # already removed by MPI_Finalize
                pass
        self._shm = set()
