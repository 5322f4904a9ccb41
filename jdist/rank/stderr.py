"""A rank's fd 2 through a file, so that a library's last words before the process dies reach the notebook.

The engine's ``sys.stderr`` (ipykernel's ``OutStream``) forwarded fd 2 through a pipe read by a thread of
this process: what a C or C++ library writes just before it aborts was lost with the process
(:mod:`jdist.common.last_words`). :func:`capture` points fd 2 at the file the shell around the engine named
instead, ends ipykernel's pipe reader, and forwards what comes from a thread of its own: to the cell (the
stream's ``write``, as ipykernel's reader did) and to the launcher's output (the original fd 2), every
:data:`INTERVAL_S` and whenever ``sys.stderr`` is flushed (the kernel flushes it before a cell's reply, so
the cell's output stays in the cell). It notes how far it got in ``<file>.pos``; whatever is past that when
the rank dies is shown with its death. The file starts again once :data:`ROTATE_BYTES` were forwarded.

Cost: a thread that wakes every 0.1 s and reads nothing from a file; nothing on the training thread.

Example (on a rank, as :func:`jdist.rank.bootstrap.setup` does)::

    capture()       # True: fd 2 now goes to $JDIST_STDERR_FILE
"""

from __future__ import annotations

import codecs
import os
import sys
import threading
import time
from typing import Any

from jdist.common.last_words import POS_SUFFIX, STDERR_ENV, write_pos

#: How often the thread looks for new output.
INTERVAL_S = 0.1
#: After this many bytes forwarded the file starts again (a rank that logs a lot would fill its disk).
ROTATE_BYTES = 4 << 20

_capture: "_Capture | None" = None


def capture(path: str | None = None, stream: Any = None) -> bool:
    """Point fd 2 at ``path`` (default: ``$JDIST_STDERR_FILE``) and forward it to ``stream`` (default:
    ``sys.stderr``, an engine's ``OutStream``). Does nothing, and returns False, without a file, when the stream
    is not ipykernel's (not an engine), or when it is already done. (An ``OutStream`` that does not watch fd 2,
    as under pytest, left C-level output on the original fd 2; with this it reaches the cell too.)"""
    global _capture
    path = path or os.environ.get(STDERR_ENV)
    stream = stream if stream is not None else sys.stderr
    if _capture is not None or not path or not hasattr(stream, "_should_watch"):
        return False
    try:
        _capture = _Capture(path, stream)
    except OSError as exc:  # fd 2 stays as it was: only the last words of a dying rank are at stake
        print(f"jdist: the rank's stderr stays a pipe ({path}: {exc}); what it writes just before it dies can be "
              "lost", file=sys.__stderr__)
        return False
    return True


def capturing() -> bool:
    """Whether fd 2 goes to the file (:func:`capture` did it)."""
    return _capture is not None


class _Capture:
    def __init__(self, path: str, stream: Any):
        self.path, self.stream, self.pid = path, stream, os.getpid()
        watching = stream._should_watch
        self.echo_fd: int | None = getattr(stream, "_original_stdstream_copy", None) if watching else os.dup(2)
        self.lock = threading.Lock()
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.sent = 0
        self.pos_fd = os.open(path + POS_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        write_pos(path, 0, self.pos_fd)
        self.read_fd = self._point_fd2(path)
        if watching:
            _end_pipe_reader(stream)
        else:  # what went to the original fd 2 stays there: faulthandler's reports (stream.fileno()), engine logs
            stream._original_stdstream_copy = self.echo_fd
            _keep_logs_on(self.echo_fd)
        flush = stream.flush

        def flush_forwarding() -> None:
            self.forward(wait=False)
            flush()

        stream.flush = flush_forwarding
        threading.Thread(target=self._run, name="jdist-stderr", daemon=True).start()

    @staticmethod
    def _point_fd2(path: str) -> int:
        """fd 2 appends to a new ``path``; returns a descriptor that reads it."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        read_fd = os.open(path, os.O_RDONLY)
        os.dup2(fd, 2)
        os.close(fd)
        return read_fd

    def _run(self) -> None:
        while True:
            time.sleep(INTERVAL_S)
            try:
                self.forward()
            except ValueError:  # the stream was closed: the engine is ending
                return

    def forward(self, wait: bool = True) -> None:
        """Send what fd 2 got since the last time. ``wait`` False: not if the thread is at it (a flush from a
        signal handler that interrupted it must not wait for itself)."""
        if os.getpid() != self.pid or not self.lock.acquire(blocking=wait):
            return  # a forked child (a DataLoader worker) shares fd 2 and the read offset: the rank forwards
        try:
            sent = self.sent
            self.sent += self._send_all()
            if self.sent != sent:
                write_pos(self.path, self.sent, self.pos_fd)
                if self.sent >= ROTATE_BYTES:
                    self._rotate()
        finally:
            self.lock.release()

    def _send_all(self) -> int:
        """Send what the file has past the read descriptor's offset to the cell and the launcher's output; how
        many bytes."""
        n = 0
        while True:
            data = os.read(self.read_fd, 65536)
            if not data:
                return n
            n += len(data)
            text = self.decoder.decode(data)
            if text:
                self.stream.write(text)
            if self.echo_fd is not None:
                try:
                    os.write(self.echo_fd, data)
                except OSError:  # the launcher's end is gone: the cell still gets it
                    self.echo_fd = None

    def _rotate(self) -> None:
        """Start the file again: fd 2 moves to a new file, the old one's rest is sent, the new one takes its
        name. (A rank that dies between the move and the rename loses what it wrote in those microseconds.)"""
        new = self.path + ".new"
        read_fd = self._point_fd2(new)
        self._send_all()
        os.close(self.read_fd)
        self.read_fd, self.sent = read_fd, 0
        write_pos(self.path, 0, self.pos_fd)
        os.replace(new, self.path)


def _end_pipe_reader(stream: Any) -> None:
    """Stop ipykernel's reader of its fd 2 pipe once it has sent what the pipe held: closing the pipe's write
    end (left open after ``dup2``) ends its read with EOF. The stream's close must then not wait for it."""
    read_fd = getattr(stream, "_fid", None)
    thread = getattr(stream, "watch_fd_thread", None)
    try:
        pipe = os.readlink(f"/proc/self/fd/{read_fd}")
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd != read_fd and fd > 2:
                try:
                    if os.readlink(f"/proc/self/fd/{fd}") == pipe:
                        os.close(fd)
                except OSError:
                    continue
        if thread is not None:
            thread.join(1.0)  # it sends the rest, then reads EOF
    except OSError:  # no /proc: the reader stays blocked, a daemon thread that holds nothing
        pass
    stream._should_watch = False  # (set earlier, the reader would drop the chunk it reads next)
    if read_fd is not None and thread is not None and not thread.is_alive():
        os.close(read_fd)
        stream._fid = None


def _keep_logs_on(fd: int) -> None:
    """Logging handlers that wrote to ``sys.__stderr__`` (the engine's own log) write to ``fd`` instead, as
    ipyparallel does for its log when ipykernel watches fd 2: not into the cell."""
    import logging

    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.__stderr__:
                handler.setStream(open(fd, "w", closefd=False, buffering=1))
