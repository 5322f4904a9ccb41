"""Rank-side fault handling: where each rank is, and releasing ranks blocked in a collective.

Each rank's session owns a :class:`Guard`, installed at set-up:

* **Stacks.** ``faulthandler`` dumps every thread's Python stack to the rank's stack file
  on ``SIGUSR1``. It runs in the C signal handler, so it works even while the main thread holds
  the GIL in C code; it reads the frames without the GIL, which can crash a process whose threads
  run Python meanwhile, so the kernel asks for a sample first (below) and sends this signal only to
  a rank whose sample does not come (``%dist stacks``, the stacks of ranks that would not stop).
* **Crashes.** A rank that crashes (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL: a C extension's fault)
  writes the crashing thread's Python stack first (faulthandler): to ``rank-<r>.crash`` in the cluster's
  folder, or, on another host, to its stderr file, which the shell around it prints with its rank into the
  launcher's output once it ended (:mod:`jdist.common.last_words`). The kernel shows it with the rank's death.
* **Samples.** On ``SIGUSR2`` the guard's thread writes a :class:`jdist.common.stacks.Sample`: the
  main thread's frames (read under the GIL, which a collective releases) and the rank's
  progress counters (process CPU time, the collectives its process group has started). The
  hang watchdog compares two samples to tell a blocked rank from a busy one. Reading frames
  under the GIL is safe at any rate; faulthandler's dump from a signal handler is not. A system
  call the signal interrupts restarts (SA_RESTART), so C code that does not retry on EINTR goes on.
* **Release.** A blocked gloo collective ignores SIGINT: Python only runs the handler once
  the C++ call returns. The guard therefore watches signals through the interpreter's
  wakeup fd, which the C handler writes at once, from a thread of its own. When SIGINT
  arrives while the main thread waits in a ``torch.distributed`` collective, the thread
  shuts down this rank's process-group connections (gloo pairs; NCCL: ``abort``). The
  collective then raises on this rank and on its peers ("connection closed by peer"),
  the cell ends, and the kernel re-creates the process group on all ranks
  (:func:`jdist.rank.rpc.rebuild_group`): variables stay, DDP models are re-attached.

Nothing here listens on a socket or reads from one: the kernel reaches the guard only
through signals (sent by the launcher, or ipyparallel's signed control channel).

Example (on a rank):
    >>> jdist.rank.session().guard.where()        # doctest: +SKIP
    'all_reduce (cell line 3)'
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any, Callable

from jdist.common.procs import open_files
from jdist.common.stacks import (
    COLLECTIVE_PATHS,
    CRASH_FILE,
    SAMPLE_SIGNAL,
    STACKS_SIGNAL,
    Frame,
    Progress,
    Sample,
    annotated,
    describe,
    format_sample,
)

from .collectives import latest_collectives


class Guard:
    """Stack dumps and the release of a blocked collective for this rank (see the module doc)."""

    def __init__(self, backward_waits: bool = False, collective_paths: tuple[str, ...] = COLLECTIVE_PATHS):
        self.backward_waits = backward_waits
        self.collective_paths = collective_paths
        self.stacks_file: IO[str] | None = None
        self.crash_file: IO[str] | None = None
        self.sample_path: Path | None = None
        self.report: Callable[[str], None] | None = None  # where samples go instead of sample_path
        #: Called from the guard's thread on SIGTERM (also while the main thread is blocked in C++).
        self.on_terminate: Callable[[], None] | None = None
        self.marker: Callable[[], str | None] | None = None  # the backend's collectives_started
        #: connected sockets of the process groups: fd -> (local address, peer address), so that a number
        #: reused by another socket after a group ended is not taken for the group's
        self.group_fds: dict[int, tuple[Any, Any]] = {}
        self.group_ports: set[int] = set()  # its listening ports (accepted pairs use them)
        self.broken: str | None = None  # why this rank broke the group's connections (None: intact)
        self.released_from: str | None = None  # where the main thread waited when it was released
        #: While set, a SIGINT releases a collective only if this says yes (a sweep: only a stopped trial's)
        self.may_release: Callable[[], bool] | None = None

    def install(self, rank: int, stacks_dir: str | None, report: Callable[[str], None] | None = None) -> None:
        """Set up stack dumps and the release thread (main thread; the thread once per process).

        ``stacks_dir``: the folder (on this host) for stack dumps and samples; ``report``: send
        each sample's text there instead (ranks on another host than the kernel's)."""
        self.report = report
        if (stacks_dir or report) and signal.getsignal(SAMPLE_SIGNAL) in (signal.SIG_DFL, signal.SIG_IGN):
            # a Python-level handler makes the signal reach the wakeup fd, so the guard's
            # thread sees it; the default action would end the process
            signal.signal(SAMPLE_SIGNAL, _ignore)
            # and a system call it interrupts restarts (SA_RESTART) instead of failing with EINTR: C code that
            # reads a pipe or socket without retrying failed at the watchdog's first sample (measured)
            signal.siginterrupt(SAMPLE_SIGNAL, False)
            # the interpreter's shutdown sets a signal with a Python handler back to its default action, which would
            # end a rank sampled while it exits; an ignored one stays ignored
            atexit.register(signal.signal, SAMPLE_SIGNAL, signal.SIG_IGN)
        if stacks_dir:
            path = Path(stacks_dir) / f"rank-{rank}.txt"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if self.stacks_file is not None:
                faulthandler.unregister(STACKS_SIGNAL)
                self.stacks_file.close()
            self.stacks_file = os.fdopen(fd, "a")
            faulthandler.register(STACKS_SIGNAL, file=self.stacks_file, all_threads=True, chain=False)
            self.sample_path = Path(stacks_dir) / f"rank-{rank}.sample"
        self._enable_crash_reports(rank, stacks_dir)
        _watch_signals()

    def _enable_crash_reports(self, rank: int, stacks_dir: str | None) -> None:
        """On a fatal signal, faulthandler writes the crashing thread's stack (then the signal ends the process as
        before): to the rank's crash file, or to its stderr file (:mod:`jdist.rank.stderr`), or to the process's
        own stderr. (An engine's ``sys.stderr`` forwards fd 2
        through a pipe that a thread of the process reads, which dies with it; its ``fileno()`` is the original.)"""
        if stacks_dir:
            fd = os.open(Path(stacks_dir) / CRASH_FILE.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            old, self.crash_file = self.crash_file, os.fdopen(fd, "a")
            faulthandler.enable(file=self.crash_file, all_threads=False)
            if old is not None:
                old.close()
            return
        from .stderr import capturing

        if capturing():  # fd 2 is the rank's file, which the shell around it prints with its rank after it ended
            faulthandler.enable(file=2, all_threads=False)
            return
        for stream in (sys.stderr, sys.__stderr__):
            try:
                faulthandler.enable(file=stream.fileno(), all_threads=False)
                return
            except (AttributeError, OSError, ValueError):  # no stream, or no file behind it
                continue

    def note_group_sockets(self, before: dict[int, str], more: bool = False) -> None:
        """Remember the sockets a new process group opened (``before``: :func:`socket_fds` before it): the
        default group's (``more``: another group's, kept beside them).

        A socket is new if its fd was not open before, or was open on another socket: an old group that
        is freed while the new one connects (a failed trial's traceback held it) closes fds that the new
        group's sockets then reuse."""
        if not more:
            self.group_fds, self.group_ports = {}, set()
        for fd in [fd for fd, target in socket_fds().items() if before.get(fd) != target]:
            with _borrow(fd) as sock:
                if sock is None:
                    continue
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    self.group_ports.add(sock.getsockname()[1])
                else:
                    try:
                        self.group_fds[fd] = (sock.getsockname(), sock.getpeername())
                    except OSError:  # not connected (any more)
                        pass
        if not more:
            self.broken = self.released_from = None

    def write_sample(self) -> None:
        """Write this rank's :class:`~jdist.common.stacks.Sample` to its sample file (whole, by rename), or
        send it (:meth:`install`'s ``report``)."""
        if self.report is not None:
            try:
                self.report(format_sample(Sample(annotated(frames_of(_main_frame())), progress(self.marker),
                                                 latest_collectives())))
            except Exception:  # no sample is no evidence; this thread must live on for releases
                pass
            return
        if self.sample_path is None:
            return
        tmp = self.sample_path.with_name(self.sample_path.name + ".tmp")
        try:
            sample = Sample(annotated(frames_of(_main_frame())), progress(self.marker), latest_collectives())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(format_sample(sample))
            os.replace(tmp, self.sample_path)
        except Exception:  # no sample is no evidence; this thread must live on for releases
            pass

    def where(self) -> str | None:
        """What the main thread waits on, if it waits in a collective (else None)."""
        return describe(annotated(frames_of(_main_frame())), self.backward_waits, self.collective_paths)

    def release(self, reason: str) -> str | None:
        """Break the process group's connections if the main thread waits in a collective.

        Returns where it waited (None: it did not wait, nothing was done).
        """
        waiting = self.where()
        if waiting is None:
            return None
        self.released_from = waiting
        self.break_group(f"{reason} while waiting in {waiting}")
        return waiting

    def break_group(self, why: str) -> None:
        """Make every pending and future collective of the process groups fail on all ranks: the default
        group and (gloo) the user's groups made with ``new_group`` (:func:`jdist.rank.torchrun.new_group`)."""
        import torch.distributed as dist

        self.broken = why
        if dist.is_initialized() and dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()  # NCCL: abort its communicators
            return
        for fd in socket_fds():
            with _borrow(fd) as sock:
                if sock is None or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    continue  # never the listener: gloo's accept thread would abort the process
                try:
                    here = sock.getsockname()
                    mine = (self.group_fds.get(fd) == (here, sock.getpeername())
                            or here[1] in self.group_ports)
                except OSError:
                    continue
                if mine:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def state(self) -> dict[str, str | None]:
        """``broken`` (why this rank broke the group, or None), ``released_from`` and ``started`` (the
        backend's marker of the collectives this rank started: :meth:`Backend.collectives_started
        <jdist.rank.backends.Backend.collectives_started>`)."""
        started = None
        if self.marker is not None:
            try:
                started = self.marker()
            except Exception:  # no marker is no evidence
                pass
        return {"broken": self.broken, "released_from": self.released_from, "started": started}


_signal_thread: threading.Thread | None = None


def _watch_signals() -> None:
    """Start the process's one thread on the interpreter's wakeup fd (signals are per process);
    a SIGINT goes to the guard of the rank's current session."""
    from .session import current

    global _signal_thread
    if _signal_thread is not None:
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            data = os.read(read_fd, 64)
            if previous != -1:  # someone used the wakeup fd before us: pass the bytes on
                try:
                    os.write(previous, data)
                except OSError:
                    pass
            s = current()
            if s is None or s.guard is None:
                continue
            if signal.SIGTERM in data and s.guard.on_terminate is not None:
                s.guard.on_terminate()
            if SAMPLE_SIGNAL in data:
                s.guard.write_sample()
            if signal.SIGINT in data and (s.guard.may_release is None or s.guard.may_release()):
                s.guard.release("interrupted")

    _signal_thread = threading.Thread(target=watch, name="jdist-guard", daemon=True)
    _signal_thread.start()


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler of the sample signal: the guard's thread does the work."""


def progress(marker: Callable[[], str | None] | None = None) -> Progress:
    """This rank's progress counters now (clock reads and ``marker()``: microseconds)."""
    main = threading.main_thread().ident
    main_cpu = time.clock_gettime(time.pthread_getcpuclockid(main)) if main is not None else 0.0
    return Progress(time.monotonic(), time.process_time(), main_cpu, marker() if marker is not None else None)


def socket_fds() -> dict[int, str]:
    """This process's file descriptors that are sockets -> which socket (``socket:[inode]``)."""
    return {fd: target for fd, target in open_files(os.getpid()).items() if target.startswith("socket:")}


class _borrow:
    """A socket object over a duplicate of ``fd`` (None if it is not an inet stream socket)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.sock: socket.socket | None = None

    def __enter__(self) -> socket.socket | None:
        try:
            sock = socket.socket(fileno=os.dup(self.fd))
        except OSError:
            return None
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            sock.close()
            return None
        self.sock = sock
        return sock

    def __exit__(self, *exc: Any) -> None:
        if self.sock is not None:
            self.sock.close()  # closes the duplicate only


def _main_frame() -> FrameType | None:
    return sys._current_frames().get(threading.main_thread().ident or -1)


def frames_of(frame: FrameType | None) -> list[Frame]:
    """A frame's stack, innermost first."""
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out
