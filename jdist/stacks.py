"""Reading a rank's Python stack: is it waiting for other ranks, and on which cell line?

Pure functions, used on both sides: the rank's guard (:mod:`jdist.rank.guard`) asks whether
its main thread waits in a collective before it releases it; the kernel reads the ranks'
stack dumps (``%dist stacks``, the hang watchdog). A stack is a list of
``(filename, line, function)`` frames, innermost first.

Example:
    >>> frames = [("/x/torch/distributed/distributed_c10d.py", 2800, "all_reduce"),
    ...           ("/tmp/ipykernel_7/123.py", 3, "<module>")]
    >>> describe(frames)
    'all_reduce (cell line 3)'
    >>> summary(frames)
    'waiting in all_reduce (cell line 3)'
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Sequence

Frame = tuple[str, int, str]

#: The signal that makes a rank dump its stacks (the rank's guard registers faulthandler on it;
#: a launcher sends it).
STACKS_SIGNAL = signal.SIGUSR1

#: Path fragments of frames that wait for other ranks (backends add their own: ``BackendSpec``).
COLLECTIVE_PATHS: tuple[str, ...] = ("/torch/distributed/",)
#: Cell code on an ipykernel engine is compiled from files like /tmp/ipykernel_<pid>/<hash>.py.
_CELL_FILE = re.compile(r"(ipykernel_\d+/\d+\.py|<ipython-input-|<%%distributed cell>)")
_FRAME_LINE = re.compile(r'\s+File "(.*)", line (\d+) in (.*)')


def describe(frames: Sequence[Frame], backward_waits: bool = False,
             collective_paths: Sequence[str] = COLLECTIVE_PATHS) -> str | None:
    """``"all_reduce (cell line 3)"`` if the innermost frames wait for other ranks, else None.

    ``backward_waits``: a backward pass counts as waiting (DDP all-reduces gradients inside it).
    ``collective_paths``: path fragments of the frames that wait.

    >>> describe([("/x/torch/autograd/graph.py", 8, "_engine_run_backward"), ("/tmp/ipykernel_7/1.py", 5, "<module>")],
    ...          backward_waits=True)
    'backward (gradient all-reduce) (cell line 5)'
    """
    if not frames:
        return None
    waiting = None
    for path, _, func in frames:
        if any(p in path for p in collective_paths):
            waiting = waiting or func
        elif waiting is None and backward_waits and path.endswith("/torch/autograd/graph.py"):
            waiting = "backward (gradient all-reduce)"
        else:
            break
    if waiting is None:
        return None
    return f"{waiting} ({where_in_cell(frames)})"


def where_in_cell(frames: Sequence[Frame]) -> str:
    """``cell line N`` of the innermost cell frame (or the innermost frame's file:line).

    >>> where_in_cell([("/usr/lib/python3/threading.py", 320, "wait")])
    'threading.py:320'
    """
    for path, line, _ in frames:
        if _CELL_FILE.search(path):
            return f"cell line {line}"
    path, line, _ = frames[0]
    return f"{Path(path).name}:{line}"


def parse_faulthandler(text: str, main_ident: int) -> list[Frame]:
    """The main thread's frames (innermost first) from a ``faulthandler`` dump of all threads.

    >>> dump = 'Thread 0x0000000000000001 (most recent call first):\\n  File "/tmp/ipykernel_7/1.py", line 2 in <module>\\n'
    >>> parse_faulthandler(dump, 1)
    [('/tmp/ipykernel_7/1.py', 2, '<module>')]
    """
    want = f"0x{main_ident:016x}"
    frames: list[Frame] = []
    inside = False
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            if inside:
                break
            inside = want in line
            continue
        m = _FRAME_LINE.match(line)
        if inside and m:
            frames.append((m.group(1), int(m.group(2)), m.group(3)))
    return frames


def summary(frames: Sequence[Frame], backward_waits: bool = False,
            collective_paths: Sequence[str] = COLLECTIVE_PATHS) -> str:
    """One line on what a rank does, from its main-thread frames (innermost first).

    >>> summary([("/tmp/ipykernel_7/123.py", 4, "<module>")])
    'running cell line 4'
    >>> summary([])
    'did not answer (no stack within the time limit)'
    """
    if not frames:
        return "did not answer (no stack within the time limit)"
    waiting = describe(frames, backward_waits, collective_paths)
    if waiting:
        return f"waiting in {waiting}"
    if any(_CELL_FILE.search(path) for path, _, _ in frames):
        path, line, func = frames[0]
        inner = "" if _CELL_FILE.search(path) else f", in {func} at {Path(path).name}:{line}"
        return f"running {where_in_cell(frames)}{inner}"
    return "idle (no cell running)"


def format_stack(frames: Sequence[Frame]) -> str:
    """The frames as a traceback-like text, outermost first.

    >>> print(format_stack([("b.py", 2, "inner"), ("a.py", 1, "<module>")]))
      File "a.py", line 1, in <module>
      File "b.py", line 2, in inner
    """
    return "\n".join(f'  File "{path}", line {line}, in {func}' for path, line, func in reversed(frames))
