"""Rank-side fault handling: where each rank is, and releasing ranks blocked in a collective.

Installed on every rank by :func:`jdist.rank.setup`:

* **Stacks.** ``faulthandler`` dumps every thread's Python stack to the rank's stack file
  on ``SIGUSR1``. It runs in the C signal handler, so it works while the rank is blocked
  inside a C++ collective; the kernel reads the file (``%dist stacks``, the hang watchdog).
* **Release.** A blocked gloo collective ignores SIGINT: Python only runs the handler once
  the C++ call returns. The guard therefore watches signals through the interpreter's
  wakeup fd, which the C handler writes at once, from a thread of its own. When SIGINT
  arrives while the main thread waits in a ``torch.distributed`` collective, the thread
  shuts down this rank's process-group connections (gloo pairs; NCCL: ``abort``). The
  collective then raises on this rank and on its peers ("connection closed by peer"),
  the cell ends, and the kernel re-creates the process group on all ranks
  (:func:`jdist.rank.repair_group`): variables stay, DDP models are re-attached.

Nothing here listens on a socket or reads from one: the kernel reaches the guard only
through signals sent by PID (or ipyparallel's signed control channel).

Example (on a rank):
    >>> jdist.guard.where()        # doctest: +SKIP
    'all_reduce (cell line 3)'
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

#: Signal that makes a rank dump its stacks (faulthandler, safe while blocked in C++).
STACKS_SIGNAL = signal.SIGUSR1

#: Path fragments of frames that wait for other ranks.
_COLLECTIVE_PATHS = ("/torch/distributed/", "/horovod/torch/mpi_ops.py", "/horovod/common/")
#: Cell code on an ipykernel engine is compiled from files like /tmp/ipykernel_<pid>/<hash>.py.
_CELL_FILE = re.compile(r"(ipykernel_\d+/\d+\.py|<ipython-input-|<%%distributed cell>)")


@dataclass
class _Guard:
    stacks_file: IO[str] | None = None
    group_fds: set[int] = field(default_factory=set)  # connected sockets of the process group
    group_ports: set[int] = field(default_factory=set)  # its listening ports (accepted pairs use them)
    broken: str | None = None  # why this rank broke the group's connections (None: intact)
    released_from: str | None = None  # where the main thread waited when it was released
    backend_is_ddp: bool = False


_g = _Guard()


def install(rank: int, stacks_dir: str | None, ddp: bool) -> None:
    """Set up stack dumps and the release thread on this rank (main thread, once per process)."""
    _g.backend_is_ddp = ddp
    if stacks_dir:
        path = Path(stacks_dir) / f"rank-{rank}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if _g.stacks_file is not None:
            faulthandler.unregister(STACKS_SIGNAL)
            _g.stacks_file.close()
        _g.stacks_file = os.fdopen(fd, "a")
        faulthandler.register(STACKS_SIGNAL, file=_g.stacks_file, all_threads=True, chain=False)
    if not any(t.name == "jdist-guard" for t in threading.enumerate()):
        _start_signal_thread()


def _start_signal_thread() -> None:
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
            if signal.SIGINT in data:
                release("interrupted")

    threading.Thread(target=watch, name="jdist-guard", daemon=True).start()


def socket_fds() -> set[int]:
    """File descriptors of this process that are sockets."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.add(int(name))
        except OSError:
            continue
    return fds


def note_group_sockets(before: set[int]) -> None:
    """Remember the sockets the process group opened (call right after creating it)."""
    _g.group_fds, _g.group_ports = set(), set()
    for fd in socket_fds() - before:
        with _borrow(fd) as sock:
            if sock is None:
                continue
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                _g.group_ports.add(sock.getsockname()[1])
            else:
                _g.group_fds.add(fd)
    _g.broken = _g.released_from = None


class _borrow:
    """A socket object over a duplicate of ``fd`` (None if it is not an inet socket)."""

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


def describe(frames: list[tuple[str, int, str]], ddp: bool = False) -> str | None:
    """``"all_reduce (cell line 3)"`` if the innermost frames wait for other ranks, else None.

    ``frames``: (filename, line, function), innermost first. ``ddp``: a backward pass
    counts as waiting (DDP all-reduces gradients inside it).

    >>> describe([("/x/torch/distributed/distributed_c10d.py", 2800, "all_reduce"),
    ...           ("/tmp/ipykernel_7/123.py", 3, "<module>")])
    'all_reduce (cell line 3)'
    """
    if not frames:
        return None
    waiting = None
    for path, _, func in frames:
        if any(p in path for p in _COLLECTIVE_PATHS):
            waiting = waiting or func
        elif waiting is None and ddp and path.endswith("/torch/autograd/graph.py"):
            waiting = "backward (DDP gradient all-reduce)"
        else:
            break
    if waiting is None:
        return None
    return f"{waiting} ({where_in_cell(frames)})"


def where_in_cell(frames: list[tuple[str, int, str]]) -> str:
    """``cell line N`` of the innermost cell frame (or the innermost frame's file:line)."""
    for path, line, _ in frames:
        if _CELL_FILE.search(path):
            return f"cell line {line}"
    path, line, _ = frames[0]
    return f"{Path(path).name}:{line}"


def _frames(frame: FrameType | None) -> list[tuple[str, int, str]]:
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out


def where() -> str | None:
    """What the main thread waits on, if it waits in a collective (else None)."""
    return describe(_frames(_main_frame()), _g.backend_is_ddp)


def release(reason: str) -> str | None:
    """Break the process group's connections if the main thread waits in a collective.

    Returns where it waited (None: it did not wait, nothing was done).
    """
    waiting = where()
    if waiting is None:
        return None
    _g.released_from = waiting
    break_group(f"{reason} while waiting in {waiting}")
    return waiting


def break_group(why: str) -> None:
    """Make every pending and future collective of the default group fail on all ranks."""
    import torch.distributed as dist

    _g.broken = why
    if dist.is_initialized() and dist.get_backend() == "nccl":
        dist.distributed_c10d._abort_process_group()  # NCCL: abort its communicators
        return
    for fd in socket_fds():
        with _borrow(fd) as sock:
            if sock is None or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue  # never the listener: gloo's accept thread would abort the process
            try:
                mine = fd in _g.group_fds or sock.getsockname()[1] in _g.group_ports
            except OSError:
                continue
            if mine:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def state() -> dict[str, str | None]:
    """``broken`` (why this rank broke the group, or None) and ``released_from``."""
    return {"broken": _g.broken, "released_from": _g.released_from}


def parse_stacks(text: str, main_ident: int) -> list[tuple[str, int, str]]:
    """The main thread's frames (innermost first) from a faulthandler dump."""
    want = f"0x{main_ident:016x}"
    frames: list[tuple[str, int, str]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            if inside:
                break
            inside = want in line
            continue
        m = re.match(r'\s+File "(.*)", line (\d+) in (.*)', line)
        if inside and m:
            frames.append((m.group(1), int(m.group(2)), m.group(3)))
    return frames


def summary(frames: list[tuple[str, int, str]], ddp: bool = False) -> str:
    """One line on what a rank does, from its main-thread frames (innermost first).

    >>> summary([("/tmp/ipykernel_7/123.py", 4, "<module>")])
    'running cell line 4'
    """
    if not frames:
        return "did not answer (no stack within the time limit)"
    waiting = describe(frames, ddp)
    if waiting:
        return f"waiting in {waiting}"
    if any(_CELL_FILE.search(path) for path, _, _ in frames):
        path, line, func = frames[0]
        inner = "" if _CELL_FILE.search(path) else f", in {func} at {Path(path).name}:{line}"
        return f"running {where_in_cell(frames)}{inner}"
    return "idle (no cell running)"


def format_stack(frames: list[tuple[str, int, str]]) -> str:
    """The frames as a traceback-like text, outermost first."""
    return "\n".join(f'  File "{path}", line {line}, in {func}' for path, line, func in reversed(frames))
