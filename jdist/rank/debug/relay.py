"""Debugging on a rank: pdb on the last failed cell's traceback, and ``breakpoint()`` in a running cell.

Post-mortem: each failing cell's exception is kept (:func:`note_failure`, from the rank's post-cell
hook), as IPython keeps ``sys.last_traceback``: its frames, with their locals, stay alive until the
next failure. ``%dist debug`` in the notebook (:mod:`jdist.kernel.debug.postmortem`) then drives one
:class:`pdb.Pdb` per rank, one command per call (:func:`command`), its output captured and sent
back: no terminal, no listener, no stdin on the rank; nothing of the rank's state changes.

Live: ``sys.breakpointhook`` (and ``pdb.set_trace``) on the ranks is :func:`breakpoint_hook`. On a
rank the kernel armed for the running cell (``%%distributed --debug-ranks``, :func:`arm`) it starts a
pdb whose input and output travel through jdist's channels: each prompt goes to the kernel as a
``debug`` data message (IOPub, signed), and the line typed in the notebook comes back on the engine's
control channel. On the other ranks it does nothing.

>>> try:
...     x = 41
...     raise ValueError("boom")
... except ValueError as exc:
...     note_failure(exc)
>>> start()["error"]
'ValueError: boom'
>>> command("p x + 1")["text"]
'42\\n'
>>> command("q")["done"]
True
"""

from __future__ import annotations

import io
import os
import pdb
import queue
import sys
import time
from typing import Any

from jdist.protocol import DEBUG_REPLY, PROTOCOL_VERSION, DebugMessage

from ..channel import on_control

#: pdb commands that would run code on a finished traceback (stepping, jumping): refused, with why.
STEPPING = {"n", "next", "s", "step", "r", "return", "unt", "until", "j", "jump", "restart", "run"}
#: pdb commands that end the post-mortem.
ENDING = {"q", "quit", "exit", "c", "cont", "continue", "EOF"}

_failure: tuple[float, BaseException] | None = None  # when, and the exception (with its traceback)
_pdb: pdb.Pdb | None = None
_out = io.StringIO()


def note_failure(exc: BaseException | None) -> None:
    """Keep ``exc`` (a cell's exception) for ``%dist debug``; the one before is let go."""
    global _failure
    if exc is not None and exc.__traceback__ is not None:
        _failure = (time.time(), exc)


def failure() -> dict[str, Any] | None:
    """The kept failure: when, and ``ename: evalue``; None if no cell failed here."""
    if _failure is None:
        return None
    when, exc = _failure
    return {"time": when, "error": _error_line(exc)}


def start() -> dict[str, Any]:
    """Open pdb on the kept traceback, at the frame that raised: its position (``> file(line)func()``)."""
    global _pdb
    if _failure is None:
        raise RuntimeError("No cell failed on this rank: nothing to debug.")
    _, exc = _failure
    _out.seek(0)
    _out.truncate()
    _pdb = pdb.Pdb(stdout=_out, nosigint=True, readrc=False)
    _pdb.reset()
    _pdb.setup(None, exc.__traceback__)
    _from_the_cell(_pdb)
    _pdb.print_stack_entry(_pdb.stack[_pdb.curindex])
    return {"error": _error_line(exc), "text": _take()}


def command(line: str) -> dict[str, Any]:
    """Run one pdb command on the open post-mortem; its output, and whether the post-mortem ended."""
    if _pdb is None:
        raise RuntimeError("No post-mortem is open on this rank: %dist debug opens one.")
    word = line.strip().split(" ", 1)[0] if line.strip() else ""
    if word in ENDING:
        end()
        return {"text": "", "done": True}
    if word in STEPPING:
        return {"text": f"*** {word}: the traceback's frames have finished, nothing runs in a post-mortem "
                        "(breakpoint() in a cell stops a running rank).\n", "done": False}
    _pdb.onecmd(line)
    return {"text": _take(), "done": False}


def end() -> None:
    """Close the post-mortem (the kept failure stays: ``%dist debug`` opens it again)."""
    global _pdb
    if _pdb is not None:
        _pdb.forget()
    _pdb = None


def _from_the_cell(debugger: pdb.Pdb) -> None:
    """Start the stack at the first frame of a cell: the engine's and IPython's machinery above it is not the
    user's code (``w``, ``u`` and ``d`` then stay in the cell and what it calls)."""
    for i, (frame, _) in enumerate(debugger.stack):
        name = frame.f_code.co_filename
        if name.startswith("<ipython-input") or os.path.basename(os.path.dirname(name)).startswith("ipykernel_"):
            if 0 < i <= debugger.curindex:
                debugger.stack = debugger.stack[i:]
                debugger.curindex -= i
            return


def _take() -> str:
    text = _out.getvalue()
    _out.seek(0)
    _out.truncate()
    return text


def _error_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


# -- live breakpoints -----------------------------------------------------------------------------
_armed = False
_replies: queue.Queue = queue.Queue()
_seq = 0


def arm(on: bool) -> None:
    """Whether ``breakpoint()`` stops this rank in the cells that follow (until armed off)."""
    global _armed
    _armed = on
    on_control(DEBUG_REPLY, _replies.put if on else None)


def install() -> None:
    """Make ``breakpoint()`` and ``pdb.set_trace()`` on this rank go to :func:`breakpoint_hook`."""
    sys.breakpointhook = breakpoint_hook
    pdb.set_trace = _set_trace


def cell_ended() -> None:
    """The cell ended (the rank's post-cell hook, on the main thread): a pdb still stepping lets go of the
    rank, so the next cells run untraced."""
    if isinstance(getattr(sys.gettrace(), "__self__", None), RelayPdb):
        sys.settrace(None)


def breakpoint_hook(*args: Any, **kwargs: Any) -> None:
    """``breakpoint()`` on a rank: a pdb relayed to the notebook if this rank is armed, else a note (once
    per cell) that says how to stop here."""
    if _armed:
        RelayPdb().set_trace(sys._getframe(1))
    else:
        _skipped()


def _set_trace(*, header: str | None = None) -> None:
    if _armed:
        debugger = RelayPdb()
        if header is not None:
            debugger.message(header)
        debugger.set_trace(sys._getframe(1))
    else:
        _skipped()


_told_cell: int | None = None


def _skipped() -> None:
    global _told_cell
    from ..session import current

    s = current()
    cell = s.stream.cell if s is not None else None
    if cell != _told_cell:
        _told_cell = cell
        rank = s.ctx.rank if s is not None else "?"
        print(f"jdist: breakpoint() does not stop rank {rank}: %%distributed --debug-ranks {rank} stops there.")


class _Relay:
    """pdb's stdin and stdout: what pdb writes is kept until it reads a line; then the text (ending in
    its prompt) goes to the kernel and the line typed in the notebook comes back."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()

    def write(self, text: str) -> int:
        return self.buffer.write(text)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        global _seq
        from ..session import session

        s = session()
        text = self.buffer.getvalue()
        self.buffer.seek(0)
        self.buffer.truncate()
        _seq += 1
        message: DebugMessage = {"v": PROTOCOL_VERSION, "kind": "debug", "cell": s.stream.cell, "seq": _seq,
                                 "text": text}
        s.publish(message)
        while True:  # an interrupt (SIGINT from the kernel) ends the wait with KeyboardInterrupt
            try:
                reply = _replies.get(timeout=1.0)
            except queue.Empty:
                continue
            if reply.get("seq") == _seq:
                return str(reply.get("line", "c")) + "\n"


class RelayPdb(pdb.Pdb):
    """A pdb on a rank, driven from the notebook (see the module doc). It stops only in the user's code:
    never in the engine's machinery (IPython, ipykernel, jdist, the standard library:
    :func:`jdist.rank.debug.dap.hidden_paths`, as the Debugger panel's), so stepping past a statement of the
    cell goes on to the next one (IPython runs each as its own code object) and stepping past the last
    one ends the pause (:func:`cell_ended` then lets go of the rank)."""

    def __init__(self) -> None:
        from .dap import hidden_paths

        relay = _Relay()
        super().__init__(stdin=relay, stdout=relay, nosigint=True, readrc=False)
        self.hidden = tuple(hidden_paths())

    def setup(self, f: Any, tb: Any) -> None:
        super().setup(f, tb)
        _from_the_cell(self)

    def stop_here(self, frame: Any) -> bool:
        name = frame.f_code.co_filename
        machinery = name.startswith(self.hidden) or (name.startswith("<") and not name.startswith("<ipython-input"))
        return not machinery and super().stop_here(frame)  # ("<frozen importlib...>", the engine's "<string>")

    def user_call(self, frame: Any, argument_list: Any) -> None:
        if frame.f_code.co_name == "<module>":  # the next statement of the cell begins: stop at its line, no --Call--
            return
        super().user_call(frame, argument_list)

    def user_return(self, frame: Any, return_value: Any) -> None:
        if frame.f_code.co_name == "<module>":
            # a statement of the cell ended: no "--Return--" stop (pdb would write its __return__ into the
            # cell's namespace, and every later stop would show a stale "->None"); on to the next statement
            self.set_step()
            return
        super().user_return(frame, return_value)

    def _cmdloop(self) -> None:
        # pdb's own loop catches KeyboardInterrupt and prompts again; here the interrupt (the kernel's
        # SIGINT) ends the pause and the cell, as it would without the debugger
        self.cmdloop()
