"""The launcher interface: how a cluster's ranks are started, watched, signalled and ended.

A :class:`RankLauncher` composes one of ipyparallel's engine-set launcher classes (as
ipyparallel's own ``cluster/launcher.py`` does: ``MPIEngineSetLauncher``,
``SlurmEngineSetLauncher``...) with what jdist needs beyond starting engines: the death of a
rank and its cause, the ranks' stacks while they are blocked, and ending what is left. The
cluster (:class:`jdist.kernel.cluster.ClusterSession`) only talks to this interface, never to
rank processes directly, so nothing assumes that the ranks run on the kernel's host.

A launcher owns its options (:attr:`RankLauncher.options`: ``--hosts`` is the ssh launcher's),
their checks (:meth:`RankLauncher.check`) and what they imply (:meth:`RankLauncher.complete`);
they join the one option table (:func:`jdist.plugins.option_table`). What it must learn from
the ranks comes back generically: the environment variables it names in
:attr:`RankLauncher.report_env` arrive as each rank's ``RankInfo["launcher"]``.

Launchers are found by name through the ``jdist.launchers`` entry points
(:func:`jdist.plugins.launcher_class`; ``--launcher NAME``). jdist's own:
``local-mpi`` (:class:`jdist.kernel.launch.local_mpi.LocalMPILauncher`), ``ssh`` and ``slurm``
(:mod:`jdist.kernel.launch.remote`: ranks on other hosts); what MPI launchers share is
:mod:`jdist.kernel.launch.mpi`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from jdist.common.procs import popen_alive
from jdist.common.stacks import Frame, Sample
from jdist.common.waiting import poll_until
from jdist.options import ClusterConfig, Option
from jdist.protocol import NetworkPlan, RankInfo


@dataclass(frozen=True)
class RankDeath:
    """The first rank whose process ended, why (e.g. "killed by SIGKILL ..."), what the
    launcher printed (its last lines), the process's exit status (128+N: signal N; None: unknown),
    the text holding its crash report, if it crashed (:func:`jdist.common.stacks.parse_crash`), and its
    last words: what it wrote to fd 2 that the notebook did not get (:mod:`jdist.common.last_words`), and whether
    the kernel's out-of-memory killer ended it (its host's count of such kills rose while it ran)."""

    rank: int | None
    cause: str
    detail: str = ""
    exit_code: int | None = None
    crash: str = ""
    last_words: str = ""
    oom: bool = False


class RankLauncher(ABC):
    """Start, watch, signal and end the ranks of one cluster (see the module doc).

    Lifecycle: ``probe()`` (before anything starts) → the cluster creates an ``ipyparallel.Cluster``
    with :attr:`controller_ip` and :meth:`engine_launcher_class`, calls :meth:`configure` on its
    config and :meth:`attach` with it → engines start and register (:meth:`exited_early` is polled
    meanwhile) → ranks are set up → :meth:`watch` → cells run (:meth:`deaths`, :meth:`samples`, :meth:`stacks`,
    :meth:`death`) → :meth:`stop`.
    """

    #: The name under which it is registered (``--launcher``).
    name: ClassVar[str] = ""
    #: Whether ranks may run on other hosts than the kernel's: then no file or PID of this host
    #: reaches them, and a reaper ends :meth:`processes` if the kernel dies (:mod:`jdist.kernel.reaper`).
    remote: ClassVar[bool] = False
    #: This launcher's own ``%%distributed`` options (read them with :meth:`option`).
    options: ClassVar[tuple[Option, ...]] = ()
    #: Environment variables each rank reports back in ``RankInfo["launcher"]`` (:meth:`watch` gets them).
    report_env: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: ClusterConfig, work_dir: Path):
        self.config = config
        self.work_dir = work_dir  # private to the cluster (0700)
        self.ipp: Any = None  # the ipyparallel.Cluster, after attach()
        self._launchers_seen: list[Any] = []  # its engine launchers, stopped ones too (output_launchers)
        #: Progress lines while the ranks start (the cluster sets it before :meth:`probe`), e.g. a job's pods.
        self.say: Callable[[str], None] = lambda line: None

    # -- options --------------------------------------------------------------------------------
    @classmethod
    def check(cls, config: ClusterConfig) -> None:
        """Raise ValueError with the fix for settings this launcher cannot run (pure: no probing;
        called when ``--launcher`` selects it)."""

    @classmethod
    def complete(cls, given: dict[str, Any]) -> None:
        """Fill, in the options a line gives (by name), what this launcher's options imply (pure),
        e.g. the rank count from a host list."""

    def option(self, name: str) -> Any:
        """The value of this launcher's option ``name`` (its default when not given)."""
        for opt in self.options:
            if opt.name == name:
                return self.config.get(name, opt.default)
        raise KeyError(f"--launcher {self.name} has no option {name!r}; its options: "
                       f"{', '.join(o.name for o in self.options) or 'none'}")

    # -- starting ---------------------------------------------------------------------------
    def probe(self) -> None:
        """Check the environment before anything starts; :class:`jdist.errors.ClusterError` with the fix."""

    @property
    def controller_ip(self) -> str:
        """The address the ipyparallel controller listens on (loopback unless ranks are remote)."""
        return "127.0.0.1"

    #: The program that starts the ranks, for messages ("mpiexec exited before ...").
    program: ClassVar[str] = "mpiexec"

    def where(self) -> str:
        """Where the ranks start, for the progress line (" on gpu1, gpu2 over ssh"); "" for this machine."""
        return ""

    @abstractmethod
    def engine_launcher_class(self) -> type:
        """The ipyparallel engine-set launcher class that starts the ranks."""

    @abstractmethod
    def configure(self, ipp_config: Any) -> None:
        """Set the launcher's traits on the ipyparallel Cluster's config (commands, environment)."""

    def attach(self, ipp_cluster: Any) -> None:
        """The started ipyparallel Cluster (its controller and engine launchers)."""
        self.ipp = ipp_cluster

    def engine_launchers(self) -> list[Any]:
        """The running Cluster's engine launchers (ipyparallel drops one once it has stopped)."""
        launchers = list((self.ipp.engines or {}).values()) if self.ipp is not None else []
        self._launchers_seen.extend(el for el in launchers if el not in self._launchers_seen)
        return launchers

    def output_launchers(self) -> list[Any]:
        """Every engine launcher this cluster had, stopped ones too: what a rank printed before it died is read
        after its launcher ended, when ipyparallel has dropped it and moved its output file into memory."""
        self.engine_launchers()
        return list(self._launchers_seen)

    def output(self) -> str:
        """What the engine launchers printed so far (for error messages)."""
        text = ""
        for launcher in self.output_launchers():
            try:
                text += launcher.get_output(remove=False)
            except Exception:  # only detail for a message: never hide the error it explains
                pass
        return text

    def network(self) -> NetworkPlan | None:
        """How ranks on other hosts find each other (sent to every rank at set-up); None: every
        rank runs on this host (loopback only)."""
        return None

    def engine_launcher_ended(self) -> bool:
        """Whether an engine launcher process (mpiexec, srun...) has ended. Asked of the process
        itself: ipyparallel's ``on_stop`` callbacks run on the kernel's IOLoop, which does not run
        while a cell blocks the main thread (nor in a script without a loop); once they have run, the
        launcher is no longer the Cluster's (:meth:`output_launchers` has it)."""
        return any(el.state == "after" or not popen_alive(getattr(el, "process", None))
                   for el in self.output_launchers())

    def crash_reports(self) -> dict[int | None, str]:
        """The text holding each crashed rank's crash report (faulthandler's: :mod:`jdist.rank.guard`), by rank;
        the key None: the reports of ranks that write them into the launcher's output (other hosts)."""
        return {}

    def last_words(self, rank: int | None) -> str:
        """What ``rank`` wrote to its stderr (fd 2) that the notebook had not got when it ended: the last lines
        (:mod:`jdist.common.last_words`); "" if none, or where the launcher cannot tell (the base class)."""
        return ""

    @abstractmethod
    def exited_early(self, when: str = "before it registered") -> str | None:
        """What ended (ranks ``when``, an engine launcher) with the launch's output; None while nothing did.
        Polled while the ranks register, and asked once more if a rank's process ends during its set-up."""

    def crashed(self) -> bool:
        """Whether a rank that ended (:meth:`exited_early`) was killed by a crash signal (:data:`.mpi.CRASH_SIGNALS`):
        the cluster then starts its ranks once more. False where the launcher cannot tell (the base class)."""
        return False

    # -- while the ranks run ----------------------------------------------------------------
    def attach_client(self, client: Any, engine_of_rank: dict[int, int]) -> None:
        """The kernel's ipyparallel client and each rank's engine id (signals through the controller)."""

    @abstractmethod
    def watch(self, ranks: Sequence[RankInfo]) -> None:
        """Start noticing the death of any of ``ranks`` (the set-up ranks, by rank order)."""

    @abstractmethod
    def deaths(self) -> list[int]:
        """Ranks whose process has ended, the first to end first. Cheap: called on every poll of a cell."""

    def cell_started(self) -> None:
        """A cell was sent to the ranks (a launcher may note counters to explain a death later)."""

    @abstractmethod
    def death(self, dead: Sequence[int], wait: float = 2.0) -> RankDeath:
        """Which rank died first and why; ends the others (MPI cannot go on without a rank)."""

    @abstractmethod
    def stacks(self, ranks: Sequence[RankInfo], timeout: float = 2.0) -> dict[int, list[Frame]]:
        """Each rank's main-thread stack (innermost first), also while it is blocked in C++ or
        holds the GIL; ranks that did not answer within ``timeout`` map to []. For people
        (``%dist stacks``): not to be called often (:data:`jdist.common.stacks.STACKS_SIGNAL`)."""

    @abstractmethod
    def samples(self, ranks: Sequence[RankInfo], timeout: float = 2.0) -> dict[int, Sample]:
        """Each rank's :class:`~jdist.common.stacks.Sample` from its guard thread (safe at any rate: the
        hang watchdog); ranks that did not answer within ``timeout`` map to an empty Sample."""

    def wait_ended(self, ranks: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s until all ``ranks`` rank processes have ended by themselves
        (:meth:`deaths`); whether they did."""
        return poll_until(lambda: len(self.deaths()) >= ranks, timeout, interval=0.005)

    def ranks_ended(self) -> None:
        """Every rank process ended by itself (the cluster is stopping): end whatever only waits
        to notice. Default: nothing; the cluster then stops the engine launchers as usual."""

    def stopping(self) -> None:
        """The cluster is about to stop the engines (note what must be cleaned up after them)."""

    def processes(self) -> list[int]:
        """PIDs on this host that must end with the cluster if the kernel dies (remote launchers)."""
        return []

    def cleanup_commands(self) -> list[list[str]]:
        """Commands to run if the kernel dies: the first before ending :meth:`processes`, the others
        after (:func:`jdist.kernel.reaper.reap`)."""
        return []

    def stop(self) -> None:
        """Release what the launcher holds (threads, files); the cluster stops the engines."""
