"""Post-mortem debugging on a rank: pdb on the traceback of the last cell that failed here.

Each failing cell's exception is kept (:func:`note_failure`, from the rank's post-cell hook), as
IPython keeps ``sys.last_traceback``: its frames, with their locals, stay alive until the next
failure. ``%dist debug`` in the notebook (:mod:`jdist.kernel.debug`) then drives one
:class:`pdb.Pdb` per rank, one command per call (:func:`command`), its output captured and sent
back: no terminal, no listener, no stdin on the rank; nothing of the rank's state changes.

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
import pdb
import time
from typing import Any

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
    _pdb.print_stack_entry(_pdb.stack[_pdb.curindex])
    return {"error": _error_line(exc), "text": _take()}


def command(line: str) -> dict[str, Any]:
    """Run one pdb command on the open post-mortem; its output, and whether the post-mortem ended."""
    global _pdb
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


def _take() -> str:
    text = _out.getvalue()
    _out.seek(0)
    _out.truncate()
    return text


def _error_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()
