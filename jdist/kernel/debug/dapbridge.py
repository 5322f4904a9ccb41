"""JupyterLab's Debugger panel on ``%%distributed`` cells: the kernel's debug protocol bridged to the ranks.

The panel speaks the Debug Adapter Protocol (DAP) to the kernel on its control channel (ipykernel's
:class:`ipykernel.debugger.Debugger`, over debugpy in the kernel's process). A ``%%distributed`` cell
runs on the ranks, not in the kernel, so :class:`DapBridge` sits in front of ipykernel's debugger:

* ``dumpCell`` of a ``%%distributed`` cell is remembered; its gutter breakpoints (``setBreakpoints``) are
  kept here, not given to the kernel's debugpy, and sent to the ranks the cell stops on;
* before such a cell runs, :meth:`DapBridge.prepare` starts debugpy on those ranks (once per rank
  process, :mod:`jdist.rank.debug.dap`), gives them the breakpoints and names the cell's code as the panel
  names the cell (its file, its line numbers), so a breakpoint on line 3 of the cell stops there;
* a rank's ``stopped`` / ``continued`` events reach the panel with the rank's ids renumbered
  (``(rank + 1) * 2**32 + id``), and the panel's requests for those ids (``stackTrace``, ``scopes``,
  ``variables``, ``continue``, ``next``, ``stepIn``, ``evaluate``, ...) go to that rank.

The ranks a cell stops on: ``%%distributed --debug-ranks R`` (several: each is a thread of the panel, named
``rank R``), else the cell's lowest rank. The rank's requests and answers travel on ipyparallel's signed
control channel; debugpy on a rank listens on 127.0.0.1 only.

Everything else (the kernel's own cells, ``inspectVariables``, ``source``) is ipykernel's.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any, Callable, Sequence

from jdist.errors import remote_errors
from jdist.protocol import DAP_REQUEST

#: Ids of a rank's threads, frames and variables in the panel: (rank + 1) * SHIFT + the rank's own id.
SHIFT = 1 << 32
#: How long the panel's request waits for a rank (seconds).
RANK_TIMEOUT_S = 15.0
#: Events of a rank's debugpy the panel gets.
EVENTS = ("stopped", "continued")
_ID_KEYS = ("threadId", "frameId", "variablesReference", "srcFrameId")
MAGIC = "%%distributed"

_bridge: DapBridge | None = None


def install(shell: Any) -> DapBridge | None:
    """Put the bridge in front of the kernel's debugger (once; None where the kernel has none)."""
    global _bridge
    kernel = getattr(shell, "kernel", None)
    debugger = getattr(kernel, "debugger", None)
    if debugger is None or not hasattr(debugger, "process_request"):
        return None
    if _bridge is None or _bridge.debugger is not debugger:
        _bridge = DapBridge(debugger)
        _bridge.install()
    return _bridge


def current() -> DapBridge | None:
    """The installed bridge, if the kernel's debugger is on (the panel is open on this kernel)."""
    return _bridge if _bridge is not None and _bridge.active else None


def to_panel(rank: int, value: Any) -> Any:
    """``value`` (a rank's DAP body) with its ids renumbered for the panel.

    >>> to_panel(1, {"stackFrames": [{"id": 3, "line": 2}], "threadId": 1})
    {'stackFrames': [{'id': 8589934595, 'line': 2}], 'threadId': 8589934593}
    """
    def shift(v: Any) -> Any:
        return (rank + 1) * SHIFT + v if isinstance(v, int) and v > 0 else v

    def walk(v: Any, key: str | None = None) -> Any:
        if isinstance(v, dict):
            return {k: shift(x) if k in _ID_KEYS or (k == "id" and key in ("stackFrames", "threads")) else
                    walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, key) for x in v]
        return v

    return walk(value)


def user_frames(body: dict[str, Any]) -> dict[str, Any]:
    """A ``stackTrace`` answer without the engine's start-up frame (the code its process began with, which
    debugpy names ``<string>``): under the cell it is no frame of the user's.

    >>> body = {"stackFrames": [{"id": 1, "name": "<module>", "source": {"path": "/tmp/ipykernel_1/2.py"}},
    ...                         {"id": 2, "name": "<module>", "source": {"path": "<string>"}}], "totalFrames": 2}
    >>> [f["id"] for f in user_frames(body)["stackFrames"]], user_frames(body)["totalFrames"]
    ([1], 1)
    """
    frames = body.get("stackFrames") or []
    kept = [f for f in frames if "<string>" not in ((f.get("source") or {}).get("path"),
                                                      (f.get("source") or {}).get("name"))]
    if len(kept) == len(frames):
        return body
    total = body.get("totalFrames")
    return {**body, "stackFrames": kept,
            **({"totalFrames": total - (len(frames) - len(kept))} if isinstance(total, int) else {})}


def rank_of(arguments: dict[str, Any]) -> int | None:
    """The rank whose ids a request's arguments carry (None: the kernel's own).

    >>> rank_of({"threadId": 8589934593}), rank_of({"frameId": 5})
    (1, None)
    """
    for key in _ID_KEYS:
        value = arguments.get(key)
        if isinstance(value, int) and value >= SHIFT:
            return value // SHIFT - 1
    return None


def to_rank(arguments: dict[str, Any]) -> dict[str, Any]:
    """A request's arguments with the panel's ids back in the rank's numbering."""
    return {k: v % SHIFT if k in _ID_KEYS and isinstance(v, int) and v >= SHIFT else v for k, v in arguments.items()}


class DapBridge:
    """The kernel's debugger with ``%%distributed`` cells passed on to the ranks (see the module doc)."""

    def __init__(self, debugger: Any):
        self.debugger = debugger
        self.original: Callable[[dict[str, Any]], Any] = debugger.process_request
        self.lock = threading.Lock()
        self.cells: dict[str, str] = {}  # path -> source of a dumped %%distributed cell
        self.breakpoints: dict[str, list[dict[str, Any]]] = {}  # path -> the panel's breakpoints in it
        self.started: set[int] = set()  # ranks running debugpy (this cluster)
        self.cluster: Any = None
        self.cluster_key: Any = None  # (the session, its ipyparallel cluster id): new ranks at every start
        self.armed: dict[int, set[str]] = {}  # rank -> the cells whose breakpoints it has now
        self.running: tuple[str, list[int]] | None = None  # the running cell's path and the ranks it stops on
        self.stopped: dict[int, int] = {}  # the panel's thread id -> rank

    @property
    def active(self) -> bool:
        return bool(getattr(self.debugger, "is_started", False))

    def install(self) -> None:
        self.debugger.process_request = self.process_request

    # -- the panel's requests (the kernel's control thread) ------------------------------------------
    async def process_request(self, message: dict[str, Any]) -> dict[str, Any]:
        command = message.get("command")
        arguments = message.get("arguments") or {}
        if command == "dumpCell":
            reply = await self.original(message)
            code = arguments.get("code", "")
            if code.lstrip().startswith(MAGIC) and reply.get("success"):
                with self.lock:
                    self.cells[reply["body"]["sourcePath"]] = code
            return reply
        if command == "setBreakpoints" and self._is_cell(arguments.get("source", {}).get("path", "")):
            return await self._set_breakpoints(message)
        rank = rank_of(arguments)
        if rank is None and command == "continue":
            message, rank = self._continue_which(message)
        if rank is not None:
            return await self._on_rank(rank, message)
        reply = await self.original(message)
        if command == "debugInfo" and reply.get("success"):
            with self.lock:
                body = reply["body"]
                body["breakpoints"] = [*body.get("breakpoints", []), *(
                    {"source": path, "breakpoints": bps} for path, bps in self.breakpoints.items())]
                body["stoppedThreads"] = [*body.get("stoppedThreads", []), *self.stopped]
        elif command == "threads" and reply.get("success"):
            reply["body"]["threads"] = [*reply["body"].get("threads", []),
                                        *({"id": t, "name": f"rank {r}"} for t, r in self.stopped.items())]
        elif command == "disconnect":
            await self._disconnect()
        return reply

    def _continue_which(self, message: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """JupyterLab's ``continue`` names the thread it has just forgotten (it asks for the next stopped thread,
        else 1, after removing the current one): a thread the kernel's own debugpy has not stopped means the
        rank thread that stopped last."""
        thread = (message.get("arguments") or {}).get("threadId")
        with self.lock:
            ranks = list(self.stopped.items())
        if not ranks or thread in getattr(self.debugger, "stopped_threads", ()):
            return message, None
        last, rank = ranks[-1]
        return {**message, "arguments": {**message.get("arguments", {}), "threadId": last}}, rank

    def _is_cell(self, path: str) -> bool:
        with self.lock:
            if path in self.cells:
                return True
        try:
            with open(path, encoding="utf-8") as f:  # a cell dumped before the bridge was installed
                code = f.read()
        except OSError:
            return False
        if not code.lstrip().startswith(MAGIC):
            return False
        with self.lock:
            self.cells[path] = code
        return True

    async def _set_breakpoints(self, message: dict[str, Any]) -> dict[str, Any]:
        arguments = message["arguments"]
        path = arguments["source"]["path"]
        wanted = [{"line": int(b["line"]), **({"condition": b["condition"]} if b.get("condition") else {})}
                  for b in arguments.get("breakpoints", [])]
        with self.lock:
            self.breakpoints[path] = wanted
            if not wanted:
                del self.breakpoints[path]
            running = self.running
        if running is not None and running[0] == path:  # the cell runs: its ranks get them now
            for rank in [r for r in running[1] if r in self.started]:
                await asyncio.to_thread(self._send_breakpoints, rank, path)
        return {"type": "response", "request_seq": message.get("seq"), "success": True, "command": "setBreakpoints",
                "body": {"breakpoints": [{"verified": True, "line": b["line"], "source": {"path": path}}
                                         for b in wanted]}}

    async def _on_rank(self, rank: int, message: dict[str, Any]) -> dict[str, Any]:
        command = message["command"]
        request = {"command": command, "arguments": to_rank(message.get("arguments") or {})}
        if command == "richInspectVariables":  # ipykernel's own request: the rank's IPython formats the value
            name = request["arguments"].get("variableName", "")
            request = {"command": "evaluate", "arguments": {
                "expression": f"get_ipython().display_formatter.format({name})",
                "frameId": request["arguments"].get("frameId"), "context": "clipboard"}}
        answer = await self._ask(rank, request)
        reply = {**to_panel(rank, answer), "request_seq": message.get("seq"), "command": command}
        if command == "stackTrace" and answer.get("success") and isinstance(reply.get("body"), dict):
            reply["body"] = user_frames(reply["body"])
        if command == "richInspectVariables":
            data, metadata = ({}, {})
            if answer.get("success"):
                try:
                    import ast

                    data, metadata = ast.literal_eval(answer["body"]["result"])
                except (ValueError, SyntaxError, KeyError, TypeError):
                    data = {"text/plain": answer.get("body", {}).get("result", "")}
            reply["body"] = {"data": data, "metadata": {k: v for k, v in metadata.items() if k in data}}
            reply["success"] = True
        if command in ("continue", "disconnect") and answer.get("success"):
            self._continued(rank)
        return reply

    def ask(self, rank: int, request: dict[str, Any]) -> dict[str, Any]:
        """``request`` (DAP) answered by ``rank``'s debugpy, on the engine's control channel (any thread)."""
        cluster = self.cluster
        if cluster is None or not cluster.running:
            return {"type": "response", "success": False, "message": f"rank {rank} is gone (its cluster stopped)"}
        future = cluster.control(rank, DAP_REQUEST, request)
        try:
            replies = future.result(RANK_TIMEOUT_S)
        except TimeoutError:
            return {"type": "response", "success": False,
                    "message": f"rank {rank} did not answer within {RANK_TIMEOUT_S:g} s"}
        return replies[0]["content"].get("response") or {"type": "response", "success": False,
                                                         "message": f"rank {rank} has no debugger running"}

    async def _ask(self, rank: int, request: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.ask, rank, request)

    def _send_breakpoints(self, rank: int, path: str) -> None:
        with self.lock:
            wanted = self.breakpoints.get(path, [])
            code = self.cells.get(path, "")
        self.ask(rank, {"command": "setBreakpoints", "arguments": {"source": {"path": path}, "breakpoints": wanted},
                        "jdistSource": {"path": path, "code": code}})
        with self.lock:
            self.armed.setdefault(rank, set()).add(path)

    def _clear(self, rank: int, path: str) -> None:
        self.ask(rank, {"command": "setBreakpoints", "arguments": {"source": {"path": path}, "breakpoints": []}})
        with self.lock:
            self.armed.get(rank, set()).discard(path)

    async def _disconnect(self) -> None:
        """The panel was closed: the ranks forget every breakpoint and go on."""
        with self.lock:
            self.breakpoints.clear()
            armed = [(r, p) for r, paths in self.armed.items() for p in paths]
            stopped = dict(self.stopped)
        for rank, path in armed:
            await asyncio.to_thread(self._clear, rank, path)
        for thread, rank in stopped.items():
            await self._ask(rank, {"command": "continue", "arguments": {"threadId": thread % SHIFT}})
            self._continued(rank)

    # -- a cell on the ranks (the kernel's main thread) ---------------------------------------------
    def prepare(self, cluster: Any, code: str, raw: str | None, ranks: Sequence[int],
                debug_ranks: Sequence[int] | None) -> str | None:
        """Before ``code`` (a ``%%distributed`` cell's body; ``raw`` the whole cell as typed) runs on
        ``ranks``: if the panel has breakpoints in this cell, start debugpy on the ranks it stops on, give
        them the breakpoints and name the cell's code as the panel does. Returns the code to send (padded
        so its line numbers are the cell's), or None if the panel has nothing to do with this cell."""
        if raw is None:
            return None
        with self.lock:  # the panel's cell: the dumped cell that is this one (IPython's history drops its last newlines)
            paths = [p for p in self.breakpoints if self.cells.get(p, "").rstrip("\n") == raw.rstrip("\n")]
            source = self.cells[paths[0]] if paths else ""
        if not paths or not source.rstrip().endswith(code.rstrip()):
            return None
        path = paths[0]
        if (cluster, cluster.cluster_id) != self.cluster_key:  # a new cluster: its ranks have no debugpy yet
            self.cluster, self.cluster_key, self.started, self.armed = cluster, (cluster, cluster.cluster_id), set(), {}
        chosen = list(debug_ranks) if debug_ranks else [min(ranks)]
        new = [r for r in chosen if r not in self.started]
        if new:
            print(f"jdist: starting the debugger on rank(s) {', '.join(map(str, new))} for the Debugger panel...",
                  flush=True)
            try:
                cluster.call("dap_start", ranks=new, timeout=60)
            except Exception as exc:  # e.g. no debugpy where the ranks run: the cell runs, unstopped
                why = remote_errors(exc)
                missing = ("ModuleNotFoundError" in why or "ImportError" in why) and "debugpy" in why
                fix = " (pip install debugpy into the ranks' Python)" if missing else ""
                print(f"jdist: the Debugger panel cannot stop rank(s) {', '.join(map(str, new))}: {why}{fix}. This "
                      "cell runs without its breakpoints; breakpoint() with --debug-ranks and %dist debug still work.",
                      flush=True)
                return None
            self.started.update(new)
        with self.lock:
            self.running = (path, chosen)
            stale = [(r, p) for r, paths in self.armed.items() if r not in chosen for p in paths]
        for rank in chosen:
            self._send_breakpoints(rank, path)
        for rank, p in stale:  # ranks this cell does not stop on forget their breakpoints
            self._clear(rank, p)
        cluster.call("dap_cell", path, ranks=chosen)
        offset = source[: len(source.rstrip()) - len(code.rstrip())].count("\n")
        return "\n" * offset + code

    def finish(self, cluster: Any, ranks: Sequence[int]) -> None:
        """The cell ended: its ranks name their cells as before."""
        with self.lock:
            running, self.running = self.running, None
            self.stopped = {t: r for t, r in self.stopped.items() if r not in ranks}
        if running is not None and cluster.running and not cluster.dead_ranks():
            try:
                cluster.call("dap_cell", None, ranks=running[1], timeout=10)
            except Exception:  # the ranks are stuck or gone: the cell's report says so
                pass

    def on_event(self, rank: int, event: dict[str, Any]) -> bool:
        """A rank's debugpy event (from the cell's IOPub): to the panel. Whether the rank is stopped now."""
        event = to_panel(rank, copy.deepcopy(event))
        body = event.setdefault("body", {})
        if event.get("event") == "stopped":
            body["allThreadsStopped"] = False
            body.setdefault("description", f"rank {rank}")
            with self.lock:
                self.stopped[body.get("threadId", 0)] = rank
        elif event.get("event") == "continued":
            body["allThreadsContinued"] = False
            with self.lock:
                self.stopped = {t: r for t, r in self.stopped.items() if t != body.get("threadId")}
        if event.get("event") in EVENTS:
            self.debugger.event_callback(event)
        return self.paused(rank)

    def paused(self, rank: int) -> bool:
        with self.lock:
            return rank in self.stopped.values()

    def _continued(self, rank: int) -> None:
        with self.lock:
            self.stopped = {t: r for t, r in self.stopped.items() if r != rank}
