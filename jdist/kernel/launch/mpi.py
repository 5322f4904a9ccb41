"""What every MPI launcher shares: the engine program, the shell around each engine, the
``mpiexec`` of this environment, ipyparallel's engine-set class and an exit status in words.

A launcher of your own that starts MPI ranks (PBS, LSF...) builds on these instead of copying
them: ``engine_shell(after=...)`` is the shell that forwards signals to the engine and, once it
ended, runs ``after`` with ``$code`` set to its exit status.

Example:
    >>> cause_of_exit(128 + 11, oom=False)
    'killed by SIGSEGV (Segmentation fault)'
    >>> "wait $child" in engine_shell(after="exit $code")
    True
"""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

from jdist.errors import ClusterError

#: The rank's program (run by :func:`engine_argv`).
ENGINE_MODULE = "ipyparallel.engine"
#: Modules an engine imports first, in its main thread, before ipyparallel's engine starts: torch's
#: import (about a second of CPU) then overlaps the controller's start-up, which the engines wait for
#: to register (measured: the first ``-n 2`` cell 0.5 s sooner, no change at 4 and 8 ranks on 2
#: cores, where the CPU is the limit). Not in a thread: torch's profiler belongs to the importing thread.
#: The default; a backend names its own (:attr:`jdist.plugins.BackendSpec.preimport`: none for TF ranks).
PREIMPORT = ("torch",)


def engine_argv(preimport: tuple[str, ...] = PREIMPORT) -> list[str]:
    """The engine's command line after the Python executable: ``-c`` and one line of code that
    imports ``preimport`` (a module that fails to import is left to the rank's set-up, which
    reports it) and runs ``ipyparallel.engine`` as ``python -m`` would.

    >>> argv = engine_argv(("json",)); argv[0], ENGINE_MODULE in argv[1], chr(10) in argv[1]
    ('-c', True, False)
    """
    loop = f"for _m in {preimport!r}:\n try: __import__(_m)\n except Exception: pass"
    return ["-c", f"import runpy; exec({loop!r}); runpy.run_module({ENGINE_MODULE!r}, run_name='__main__', alter_sys=True)"]

#: Signals the shell passes on to the engine (a background job of a non-interactive shell starts
#: with SIGINT ignored; the engine installs its own SIGINT handler, so interrupts still work).
FORWARDED = "TERM HUP INT USR1 USR2"
#: The engine starts with these ignored: the stack and sample signals (:mod:`jdist.common.stacks`), whose default
#: action ends a process, are harmless before the rank's guard handles them and after the interpreter's shutdown
#: has removed its handlers (``jdist.rank.guard``), when a watchdog's sample can still come.
IGNORED_UNTIL_HANDLED = "USR1 USR2"


def engine_shell(after: str, before: str = "", started: str = "") -> str:
    """``/bin/sh -c`` text around an engine (its argv follows as ``"$@"``): ``before`` runs first,
    the engine starts in the background (``started`` runs then, with ``$child`` its PID) with the
    launcher's signals passed on to it, and once it has ended (not merely been stopped) ``after``
    runs with ``$code`` its exit status (128+N: killed by signal N). mpiexec signals only its
    direct children (these shells). The engine starts with :data:`IGNORED_UNTIL_HANDLED` ignored."""
    return (before + f"trap '' {IGNORED_UNTIL_HANDLED}; " + '"$@" & child=$!; ' + started +
            f"for sig in {FORWARDED}; do trap \"kill -$sig $child 2>/dev/null\" $sig; done; "
            "while :; do wait $child; code=$?; kill -0 $child 2>/dev/null || break; done; " + after)


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


def engine_set_launcher() -> type:
    """ipyparallel's MPI engine launcher, reading mpiexec's output leniently.

    The ranks share one output file, in which a rank killed mid-write, or gforker (which
    cuts a rank's output at its first non-ASCII byte: :mod:`jdist.kernel.launch.local_mpi`),
    can leave a partial multi-byte character (gloo's error text ends in an emoji), and
    ipyparallel's strict UTF-8 read would then fail inside its stop callback.
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


#: The signals of a process's own fault (a C extension's), not of someone ending it (SIGKILL, SIGTERM, SIGINT).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL})


def how_it_ended(code: int | None) -> str:
    """How a rank ended, from its exit status, after "rank N".

    >>> how_it_ended(3), how_it_ended(137)
    ('exited with code 3', 'was killed by SIGKILL (kill -9, or the out-of-memory killer)')
    """
    if code is None:
        return "ended"
    return f"was {cause_of_exit(code, False)}" if code > 128 else f"exited with code {code}"


def cause_of_exit(code: int | None, oom: bool) -> str:
    """A rank's exit status (128+N: killed by signal N) in words.

    >>> cause_of_exit(137, False)
    'killed by SIGKILL (kill -9, or the out-of-memory killer)'
    >>> cause_of_exit(3, False)
    'the process exited with code 3 (os._exit or sys.exit in the cell, or a crash)'
    """
    if oom:
        return ("killed by the out-of-memory killer (its host, or a memory limit it ran under: a cgroup, a container, "
                "a Slurm job, ran out of memory)")
    if code == 128 + signal.SIGKILL:
        return "killed by SIGKILL (kill -9, or the out-of-memory killer)"
    if code is not None and code > 128:
        num = code - 128
        if num not in signal.valid_signals():
            return f"killed by signal {num}"
        return f"killed by {signal.Signals(num).name} ({signal.strsignal(num)})"
    if code is not None:
        return f"the process exited with code {code} (os._exit or sys.exit in the cell, or a crash)"
    return "the process ended (cause unknown)"
