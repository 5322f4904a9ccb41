"""JupyterLab's visual debugger on a rank: debugpy in the rank, its protocol relayed through jdist's channels.

The notebook's Debugger panel speaks the Debug Adapter Protocol (DAP) to the kernel. For a
``%%distributed`` cell the kernel (:mod:`jdist.kernel.debug.dapbridge`) passes the requests on to the
ranks: each request travels on the engine's signed control channel (``jdist_dap_request``), is
answered here on the engine's control thread by the rank's own debugpy, and the answer goes back in
the control reply. debugpy's events (a rank stopped at a breakpoint, continued) go to the kernel as
``dap`` data messages on the rank's IOPub channel. debugpy's adapter listens on 127.0.0.1 of the
rank's host only; nothing else connects to it.

Only the rank's main thread (the cell) is traced and stops: the engine's threads (control, IOPub,
heartbeat) and jdist's run on, so the rank keeps answering while it is stopped.

On a rank (the kernel does this when the Debugger panel is on)::

    start()                                          # debugpy listening on loopback, attached
    request({"command": "setBreakpoints", ...})      # the answer of the rank's debugpy
    cell("/tmp/ipykernel_1234/987654.py")           # the next cell's code is named as the notebook's cell
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any

from jdist.protocol import DAP_REQUEST, PROTOCOL_VERSION, DapMessage

from ..channel import on_control

#: How long a request waits for the rank's debugpy to answer (seconds).
ANSWER_TIMEOUT_S = 10.0
#: Code the rank's stack shows no frames of (the engine and jdist around the cell).
HIDDEN_PACKAGES = ("IPython", "ipykernel", "ipyparallel", "jdist", "tornado", "zmq", "asyncio", "traitlets",
                   "jupyter_client", "debugpy")


class RankDebugger:
    """debugpy in this process with a DAP client of its own (see the module doc)."""

    def __init__(self) -> None:
        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # frozen modules: a warning on every start
        import debugpy

        _hide_threads()  # before debugpy traces them: only threads started later could stop
        host, port = debugpy.listen(("127.0.0.1", 0))
        self.sock = socket.create_connection((host, port))
        self._reader = self.sock.makefile("rb")
        self._lock = threading.Lock()
        self._answered = threading.Condition()
        self._answers: dict[int, dict[str, Any]] = {}
        self._seq = 0
        self.stopped: set[int] = set()
        reader = threading.Thread(target=self._read, name="jdist-dap", daemon=True)
        _hide(reader)
        reader.start()
        _keep_leading_empty_lines()
        self.request({"command": "initialize", "arguments": {
            "clientID": "jdist", "adapterID": "python", "pathFormat": "path", "linesStartAt1": True,
            "columnsStartAt1": True, "supportsVariableType": True}})
        attach = self._send({"command": "attach", "arguments": {
            "justMyCode": False, "stopAllThreadsOnSuspend": False, "steppingResumesAllThreads": False,
            "rules": [{"path": p, "include": False} for p in hidden_paths()]}})
        self.request({"command": "configurationDone"})
        self._wait(attach)
        debugpy.trace_this_thread(False)  # traced only while a cell with breakpoints runs (:func:`cell`)
        _no_delay()


    # -- requests -----------------------------------------------------------------------------
    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a DAP request (``command``, ``arguments``) and return debugpy's response."""
        return self._wait(self._send(message))

    def _send(self, message: dict[str, Any]) -> int:
        with self._lock:
            self._seq += 1
            seq = self._seq
            body = json.dumps({"seq": seq, "type": "request", "command": message["command"],
                               "arguments": message.get("arguments", {})}).encode()
            self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return seq

    def _wait(self, seq: int) -> dict[str, Any]:
        with self._answered:
            if not self._answered.wait_for(lambda: seq in self._answers, timeout=ANSWER_TIMEOUT_S):
                raise TimeoutError(f"debugpy on this rank did not answer within {ANSWER_TIMEOUT_S:g} s")
            return self._answers.pop(seq)

    # -- what debugpy sends ----------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            length = None
            while True:
                line = self._reader.readline()
                if not line:
                    return  # debugpy went away (the process is ending)
                line = line.strip()
                if not line:
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length is None:
                continue
            message = json.loads(self._reader.read(length))
            if message.get("type") == "response":
                with self._answered:
                    self._answers[message["request_seq"]] = message
                    self._answered.notify_all()
            elif message.get("type") == "event":
                self._event(message)

    def _event(self, event: dict[str, Any]) -> None:
        from ..session import current

        body = event.get("body") or {}
        if event["event"] == "stopped":
            self.stopped.add(body.get("threadId", 0))
        elif event["event"] == "continued":
            self.stopped.discard(body.get("threadId", 0))
        elif event["event"] not in ("thread", "output"):
            return
        s = current()
        if s is not None:
            message: DapMessage = {"v": PROTOCOL_VERSION, "kind": "dap", "cell": s.stream.cell, "event": event}
            s.publish(message)


_debugger: RankDebugger | None = None


def start() -> dict[str, Any]:
    """Start debugpy on this rank (once per process) and answer the kernel's requests on the control channel."""
    global _debugger
    if _debugger is None:
        _debugger = RankDebugger()
    on_control(DAP_REQUEST, _on_request)
    return {"pid": os.getpid()}


def request(message: dict[str, Any]) -> dict[str, Any]:
    """Pass ``message`` (a DAP request) to this rank's debugpy; its response."""
    if _debugger is None:
        return {"type": "response", "success": False, "command": message.get("command"),
                "message": "the debugger is not running on this rank (run the cell again)"}
    return _debugger.request(message)


def _on_request(content: dict[str, Any]) -> dict[str, Any]:
    try:
        source = content.pop("jdistSource", None)  # the cell's source, for a breakpoint in it
        if source is not None:
            write_source(source["path"], source["code"])
        return {"response": request(content)}
    except Exception as exc:  # the answer says why; the control thread lives on
        return {"response": {"type": "response", "success": False, "command": content.get("command"),
                             "message": f"{type(exc).__name__}: {exc}"}}


def cell(path: str | None) -> None:
    """Name the code of the next cell ``path`` (the notebook cell's file in the kernel's debugger) and trace
    the main thread for it; None: stop both. Called on the main thread (an ``apply``), before and after the
    cell: debugpy's tracer slows Python lines (``benchmarks/bench_debug.py``: a pure-Python loop 2.2x), so cells
    without breakpoints run untraced."""
    import debugpy

    if path is None:
        os.environ.pop("IPYKERNEL_CELL_NAME", None)
    else:
        os.environ["IPYKERNEL_CELL_NAME"] = path
    if _debugger is not None:
        debugpy.trace_this_thread(path is not None)


def write_source(path: str, code: str) -> None:
    """Write a cell's source where debugpy expects it (a breakpoint in a file that does not exist is refused)."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == code:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)


def _hide(thread: threading.Thread) -> None:
    thread.pydev_do_not_trace = True  # type: ignore[attr-defined]
    thread.is_pydev_daemon_thread = True  # type: ignore[attr-defined]


def _hide_threads() -> None:
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main:
            _hide(thread)


def hidden_paths() -> list[str]:
    """The engine's, jdist's and the standard library's code: never stopped in, stepped over. IPython runs each
    statement of a cell as its own code object, so stepping over a line leaves the cell's frame through
    IPython (and the standard library's ``contextlib``) to the next statement's."""
    import sysconfig

    paths = sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})
    for name in HIDDEN_PACKAGES:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if origin:
            paths.append(os.path.dirname(origin))
    return paths


def _keep_leading_empty_lines() -> None:
    """IPython drops a cell's leading empty lines; the kernel pads the cell so its lines are the notebook's."""
    from IPython import get_ipython
    from IPython.core.inputtransformer2 import leading_empty_lines

    shell = get_ipython()
    if shell is None:
        return
    transforms = shell.input_transformer_manager.cleanup_transforms
    if leading_empty_lines in transforms:
        transforms.remove(leading_empty_lines)


def _no_delay() -> None:
    """pydevd writes each answer as two writes (header, body) on a socket with Nagle's algorithm on: the body
    then waits for the adapter's delayed ACK, ~40 ms per answer (measured: a request 44 ms -> 0.8 ms)."""
    try:
        import pydevd

        pydevd.get_global_debugger().writer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except Exception:  # another debugpy layout: answers are slower, not wrong
        pass
