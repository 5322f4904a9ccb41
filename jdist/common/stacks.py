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

import dataclasses
import json
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

Frame = tuple[str, int, str]

#: The signal that makes a rank dump its stacks (the rank's guard registers faulthandler on it;
#: a launcher sends it). The dump works in any state, even with the GIL held, but reading other
#: threads from a signal handler can crash a busy process (about once in 4000 dumps during DDP
#: training, measured): it is for ``%dist stacks`` and ranks that are stuck, never for sampling.
STACKS_SIGNAL = signal.SIGUSR1
#: The signal that asks a rank's guard thread for a :class:`Sample` (its main thread's frames and
#: progress counters, read safely under the GIL): what the hang watchdog uses, as often as it likes.
SAMPLE_SIGNAL = signal.SIGUSR2

#: Path fragments of frames that wait for other ranks (backends add their own: ``BackendSpec``).
COLLECTIVE_PATHS: tuple[str, ...] = ("/torch/distributed/",)
#: The path of the frame a rank adds, innermost, to say what it waits for where its frames cannot (a pipeline
#: stage waiting to receive from another: :data:`WAITING_FOR`); its function is the description.
NOTE_PATH = "<jdist: waiting>"
#: What this process's main thread waits for, set around the wait by the code that waits (None: nothing
#: said): "to receive activations from stage 1 (rank 1)", or a function that says it (called only when the
#: rank's guard looks: :func:`annotated`).
WAITING_FOR: list[Any] = [None]
#: torch's operator dispatch: the frames a functional collective's C++ call sits in, above its own frame.
_DISPATCH_PATHS = ("/torch/_ops.py", "/torch/_library/")
#: Cell code on an ipykernel engine is compiled from files like /tmp/ipykernel_<pid>/<hash>.py.
_CELL_FILE = re.compile(r"(ipykernel_\d+/\d+\.py|<ipython-input-|<%%distributed cell>)")
#: jdist's own code on a rank: a call from the kernel enters it at ``jdist/protocol.py`` (``RankCall``).
_JDIST_ON_RANK = re.compile(r"/jdist/(rank/|protocol\.py$)")
_FRAME_LINE = re.compile(r'\s+File "(.*)", line (\d+) in (.*)')
#: A rank whose set-up takes longer than ``--timeout`` writes its stacks to ``<prefix><pid>.txt`` in the
#: cluster's folder (ranks on the kernel's host; others to their stderr): a header line
#: (:func:`setup_dump_header`), then the main thread's stack as faulthandler writes one (:func:`format_thread`),
#: again every ``--timeout`` s. The kernel names them when it
#: gives up waiting (:func:`parse_setup_dump`).
SETUP_DUMP_PREFIX = "setup-stacks-"
#: What :func:`summary` says of a rank that runs no cell.
IDLE = "idle (no cell running)"
#: The line of a sample that holds the rank's progress counters (:func:`format_progress`).
PROGRESS_PREFIX = "jdist-progress"
_PROGRESS_LINE = re.compile(PROGRESS_PREFIX + r" t=(\S+) cpu=(\S+) main=(\S+) seq=(\S+)")
#: Cores of CPU below which a rank whose stack stays in a collective counts as blocked, not
#: working. Measured on 2 CPU ranks: a rank blocked in a gloo all_reduce uses 0.005-0.008 of a
#: core (its main thread 0.0001); one blocked in Horovod's ``synchronize`` a full core, in its
#: main thread too (Horovod polls: hence ``BackendSpec.spins``).
BLOCKED_CPU = 0.1


@dataclass(frozen=True)
class Progress:
    """A rank's progress counters at one moment: its monotonic clock ``t``, the CPU seconds of
    its process (``cpu``, all threads) and of its main thread (``main``), and ``seq``, a marker
    that changes whenever the rank starts a collective (None: no process group)."""

    t: float
    cpu: float
    main: float
    seq: str | None


@dataclass(frozen=True)
class Collective:
    """A rank's newest collective on one process group, from c10d's Flight Recorder: the group's ranks, its
    sequence number on that group (the same collective has the same number on every rank of it), the operation,
    its input tensors' sizes and dtypes, and whether it completed.

    >>> Collective((0, 1), 58, "all_reduce", ((10,),), ("Float",), False).what()
    'all_reduce #58 of float32[10]'
    """

    group: tuple[int, ...]
    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    done: bool

    def what(self) -> str:
        tensors = ", ".join(f"{_DTYPES.get(d, d.lower())}[{'x'.join(map(str, size))}]"
                            for size, d in zip(self.sizes, self.dtypes))
        return f"{self.op} #{self.seq}" + (f" of {tensors}" if tensors else "")

    def same_call(self, other: Collective) -> bool:
        """The same operation on tensors of the same sizes and dtypes (what the ranks of a group must agree on)."""
        return (self.op, self.sizes, self.dtypes) == (other.op, other.sizes, other.dtypes)


#: c10d's dtype names (the Flight Recorder's) as torch writes them.
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Byte": "uint8", "Char": "int8", "Bool": "bool", "Short": "int16"}


@dataclass(frozen=True)
class Sample:
    """One look at a rank: its main thread's frames (innermost first) and, when its guard
    answered, its progress counters and its newest collective on each process group (:class:`Collective`)."""

    frames: list[Frame] = field(default_factory=list)
    progress: Progress | None = None
    collectives: tuple[Collective, ...] = ()


def describe(frames: Sequence[Frame], backward_waits: bool = False,
             collective_paths: Sequence[str] = COLLECTIVE_PATHS) -> str | None:
    """``"all_reduce (cell line 3)"`` if the innermost frames wait for other ranks, else None.

    ``backward_waits``: a backward pass counts as waiting (DDP all-reduces gradients inside it).
    ``collective_paths``: path fragments of the frames that wait.

    >>> describe([("/x/torch/autograd/graph.py", 8, "_engine_run_backward"), ("/tmp/ipykernel_7/1.py", 5, "<module>")],
    ...          backward_waits=True)
    'backward (gradient all-reduce) (cell line 5)'
    >>> describe([("/x/torch/_ops.py", 1279, "__call__"), ("/x/torch/distributed/_functional_collectives.py", 170,
    ...            "all_reduce"), ("/tmp/ipykernel_7/1.py", 5, "<module>")])
    'all_reduce (cell line 5)'
    """
    if not frames:
        return None
    waiting = None
    first = 0  # a functional collective waits inside torch's operator dispatch (torch/_ops.py) under its frame
    while first < len(frames) and any(d in frames[first][0] for d in _DISPATCH_PATHS):
        first += 1
    if first and not (first < len(frames) and any(p in frames[first][0] for p in collective_paths)):
        first = 0
    for path, _, func in frames[first:]:
        if path == NOTE_PATH:  # what the rank said it waits for (annotated)
            waiting = func
        elif any(p in path for p in collective_paths):
            waiting = waiting or func
        elif waiting is None and backward_waits and path.endswith("/torch/autograd/graph.py"):
            waiting = "backward (gradient all-reduce)"
        else:
            break
    if waiting is None:
        return None
    return f"{waiting} ({where_in_cell(frames)})"


def annotated(frames: list[Frame]) -> list[Frame]:
    """The main thread's frames with what it said it waits for (:data:`WAITING_FOR`) as an innermost frame.

    >>> WAITING_FOR[0] = "to receive activations from stage 0 (rank 0)"
    >>> frames = annotated([("/x/torch/distributed/pipelining/schedules.py", 680, "_wait_batch_p2p"),
    ...                     ("/tmp/ipykernel_7/1.py", 9, "<module>")])
    >>> WAITING_FOR[0] = None; summary(frames)
    'waiting to receive activations from stage 0 (rank 0) (cell line 9)'
    """
    note = WAITING_FOR[0]
    if callable(note):
        try:
            note = note()
        except Exception:  # (what it waits for could not be said: its frames still say where)
            note = None
    return [(NOTE_PATH, 0, note), *frames] if note else frames


def waiting_phrase(where: str) -> str:
    """``waiting in all_reduce (cell line 3)``, or for what a rank said it waits for, ``waiting to receive
    activations from stage 1 (rank 1) (cell line 9)``.

    >>> waiting_phrase("all_reduce (cell line 3)"), waiting_phrase("to receive gradients from stage 2 (rank 2) (x.py:4)")
    ('waiting in all_reduce (cell line 3)', 'waiting to receive gradients from stage 2 (rank 2) (x.py:4)')
    """
    return f"waiting {where}" if where.startswith("to ") else f"waiting in {where}"


def _runs_a_script(path: str, func: str) -> bool:
    """Whether a frame is IPython's ``%run`` of a script (``safe_execfile``): the script's frames are inside it."""
    return func == "execfile" and "IPython" in path


def where_in_cell(frames: Sequence[Frame]) -> str:
    """``cell line N`` of the innermost cell frame, or for a script run with ``%run`` (as ``jdist
    run`` does) ``script.py:N`` at the innermost line of the script (``in f`` inside a function: the
    common ``main()`` layout names the line in ``train``, not the ``main()`` call); else the innermost
    frame's file:line.

    >>> where_in_cell([("/usr/lib/python3/threading.py", 320, "wait")])
    'threading.py:320'
    >>> where_in_cell([("/v/site-packages/torch/distributed/c10d.py", 2800, "all_reduce"),
    ...                ("/home/me/train.py", 30, "train"), ("/home/me/train.py", 41, "main"),
    ...                ("/home/me/train.py", 44, "<module>"),
    ...                ("/v/site-packages/IPython/core/interactiveshell.py", 3040, "execfile"),
    ...                ("/tmp/ipykernel_7/1.py", 1, "<module>")])
    'train.py:30 in train'
    """
    for i, (path, line, func) in enumerate(frames):
        if _runs_a_script(path, func) and i > 0:
            script = frames[i - 1][0]
            _, script_line, where = next(f for f in frames[:i] if f[0] == script)
            return f"{Path(script).name}:{script_line}" + ("" if where == "<module>" else f" in {where}")
        if _CELL_FILE.search(path):
            return f"cell line {line}"
    path, line, _ = frames[0]
    return f"{Path(path).name}:{line}"


def parse_faulthandler(text: str, main_ident: int) -> list[Frame]:
    """The main thread's frames (innermost first) from a ``faulthandler`` dump of all threads; of the last
    dump where several were appended (a set-up's stacks: one every ``--timeout`` s).

    >>> dump = 'Thread 0x0000000000000001 (most recent call first):\\n  File "/tmp/ipykernel_7/1.py", line 2 in <module>\\n'
    >>> parse_faulthandler(dump, 1)
    [('/tmp/ipykernel_7/1.py', 2, '<module>')]
    >>> parse_faulthandler(dump + dump.replace("line 2", "line 3"), 1)
    [('/tmp/ipykernel_7/1.py', 3, '<module>')]
    """
    dumps = _main_thread_dumps(text, main_ident)
    return dumps[-1] if dumps else []


def _main_thread_dumps(text: str, main_ident: int) -> list[list[Frame]]:
    """The main thread's frames in each dump of ``text``, oldest first."""
    want = f"0x{main_ident:016x}"
    dumps: list[list[Frame]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            inside = want in line
            if inside:
                dumps.append([])
            continue
        m = _FRAME_LINE.match(line)
        if inside and m:
            dumps[-1].append((m.group(1), int(m.group(2)), m.group(3)))
    return dumps


def setup_dump_header(pid: int, main_ident: int, rank: int) -> str:
    """The first line of a set-up stack dump: the process, its main thread's ident and its MPI rank.

    >>> setup_dump_header(42, 7, 1)
    'jdist-setup pid=42 main=7 rank=1\\n'
    """
    return f"jdist-setup pid={pid} main={main_ident} rank={rank}\n"


def parse_setup_dump(text: str) -> tuple[int, int, list[Frame], int] | None:
    """(rank, pid, the main thread's frames in the newest dump, innermost first, and how many dumps were
    written: one every ``--timeout`` s) of a set-up stack dump file; None without a header.

    >>> parse_setup_dump('jdist-setup pid=42 main=1 rank=0\\nThread 0x0000000000000001 (most recent call first):\\n'
    ...                  '  File "/x/jdist/rank/bootstrap.py", line 78 in mpi_world\\n')
    (0, 42, [('/x/jdist/rank/bootstrap.py', 78, 'mpi_world')], 1)
    """
    m = re.match(r"jdist-setup pid=(\d+) main=(\d+) rank=(\d+)", text)
    if m is None:
        return None
    dumps = _main_thread_dumps(text, int(m.group(2)))
    return int(m.group(3)), int(m.group(1)), dumps[-1] if dumps else [], len(dumps)


def format_progress(p: Progress) -> str:
    """The progress line of a sample.

    >>> format_progress(Progress(12.5, 3.25, 1.5, "t7"))
    'jdist-progress t=12.500000 cpu=3.250000 main=1.500000 seq=t7'
    """
    return f"{PROGRESS_PREFIX} t={p.t:.6f} cpu={p.cpu:.6f} main={p.main:.6f} seq={'-' if p.seq is None else p.seq}"


def format_sample(sample: Sample) -> str:
    """A sample as text: the frames in faulthandler's format (thread 0), then the progress line.

    >>> s = Sample([("/tmp/ipykernel_7/1.py", 2, "<module>")], Progress(1.0, 2.0, 0.5, None),
    ...            (Collective((0, 1), 3, "broadcast", ((2, 3), (4,)), ("Float", "Long"), True),))
    >>> parse_sample(format_sample(s)) == s
    True
    """
    text = format_thread(0, sample.frames)
    if sample.progress is not None:
        text += format_progress(sample.progress) + "\n"
    return text + "".join(f"{COLLECTIVE_PREFIX} {json.dumps(dataclasses.astuple(c))}\n" for c in sample.collectives)


#: The lines of a sample that hold its :class:`Collective` s (JSON after the prefix).
COLLECTIVE_PREFIX = "jdist-collective"


def format_thread(ident: int, frames: Sequence[Frame]) -> str:
    """A thread's frames (innermost first) as faulthandler writes them, which :func:`parse_faulthandler` reads.

    >>> print(format_thread(1, [("/tmp/ipykernel_7/1.py", 2, "<module>")]), end="")
    Thread 0x0000000000000001 (most recent call first):
      File "/tmp/ipykernel_7/1.py", line 2 in <module>
    >>> parse_faulthandler(format_thread(1, [("a.py", 2, "f")]), 1)
    [('a.py', 2, 'f')]
    """
    return "".join([f"Thread 0x{ident:016x} (most recent call first):\n",
                    *(f'  File "{path}", line {line} in {func}\n' for path, line, func in frames)])


def parse_sample(text: str) -> Sample:
    """The :class:`Sample` written by :func:`format_sample`."""
    collectives = []
    for line in text.splitlines():
        if line.startswith(COLLECTIVE_PREFIX + " "):
            try:
                group, seq, op, sizes, dtypes, done = json.loads(line[len(COLLECTIVE_PREFIX) + 1:])
                collectives.append(Collective(tuple(group), int(seq), str(op), tuple(tuple(x) for x in sizes),
                                              tuple(dtypes), bool(done)))
            except (ValueError, TypeError):  # a line cut short: no evidence
                continue
    return Sample(parse_faulthandler(text, 0), parse_progress(text), tuple(collectives))


def parse_progress(text: str) -> Progress | None:
    """The last progress line of a sample (None if there is none)."""
    found = None
    for m in _PROGRESS_LINE.finditer(text):
        found = m
    if found is None:
        return None
    t, cpu, main, seq = found.groups()
    return Progress(float(t), float(cpu), float(main), None if seq == "-" else seq)


def blocked(before: Sample | None, after: Sample, backward_waits: bool = False,
            collective_paths: Sequence[str] = COLLECTIVE_PATHS, spins: bool = False,
            idle_cpu: float = BLOCKED_CPU) -> str | None:
    """Where a rank waits if two samples of it, taken apart in time, prove it blocked; else None.

    Blocked means all of: its stack is in a collective (:func:`describe`) at the same place
    both times, it started no collective in between, and it used less than ``idle_cpu`` of a
    core meanwhile, in its main thread and in its whole process (unless the backend ``spins``:
    Horovod polls a full core in both while blocked). One sample inside a collective, or
    inside a DDP backward, proves nothing: healthy training is there most of the time.

    >>> frames = [("/x/torch/distributed/distributed_c10d.py", 2800, "all_reduce"),
    ...           ("/tmp/ipykernel_7/1.py", 3, "<module>")]
    >>> a = Sample(frames, Progress(t=10.0, cpu=5.0, main=2.0, seq="t7"))
    >>> blocked(a, Sample(frames, Progress(t=11.0, cpu=5.004, main=2.001, seq="t7")))
    'all_reduce (cell line 3)'
    >>> blocked(a, Sample(frames, Progress(t=11.0, cpu=5.9, main=2.001, seq="t7"))) is None   # moves data
    True
    >>> blocked(a, Sample(frames, Progress(t=11.0, cpu=5.0, main=2.0, seq="t9"))) is None     # collectives started
    True
    >>> blocked(a, Sample(frames, Progress(t=11.0, cpu=6.0, main=2.0, seq="t7")), spins=True)
    'all_reduce (cell line 3)'
    """
    if before is None or before.progress is None or after.progress is None:
        return None  # no evidence: never call a rank blocked on a guess
    a, b = before.progress, after.progress
    span = b.t - a.t
    if span <= 0 or before.frames != after.frames or a.seq != b.seq:
        return None
    if not spins and max(b.main - a.main, b.cpu - a.cpu) / span >= idle_cpu:
        return None
    return describe(after.frames, backward_waits, collective_paths)


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
        return waiting_phrase(waiting)
    if any(_CELL_FILE.search(path) for path, _, _ in frames):
        path, line, func = frames[0]
        inner = "" if _CELL_FILE.search(path) else f", in {func} at {Path(path).name}:{line}"
        return f"running {where_in_cell(frames)}{inner}"
    return IDLE


#: The file in the cluster's folder where a rank on the kernel's host writes its crash report (faulthandler's,
#: on SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL); ranks on other hosts write it to their stderr.
CRASH_FILE = "rank-{rank}.crash"
_FATAL = "Fatal Python error: "


def parse_crash(text: str) -> tuple[str, list[Frame]] | None:
    """The last crash report faulthandler wrote into ``text``: what it was and the crashing thread's frames,
    innermost first; None if there is none.

    >>> report = ('noise\\nFatal Python error: Segmentation fault\\n\\nStack (most recent call first):\\n'
    ...           '  File "/v/ctypes/__init__.py", line 519 in string_at\\n'
    ...           '  File "/tmp/ipykernel_7/2.py", line 3 in crash\\n\\nExtension modules: torch._C (total: 1)\\n')
    >>> parse_crash(report)
    ('Segmentation fault', [('/v/ctypes/__init__.py', 519, 'string_at'), ('/tmp/ipykernel_7/2.py', 3, 'crash')])
    >>> parse_crash("Segmentation fault (core dumped)") is None
    True
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_FATAL)]
    if not starts:
        return None
    frames: list[Frame] = []
    inside = False
    for line in lines[starts[-1] + 1:]:
        if line.startswith(("Stack (most recent call first)", "Current thread 0x")):
            inside = True
            continue
        m = _FRAME_LINE.match(line)
        if inside and m:
            frames.append((m.group(1), int(m.group(2)), m.group(3)))
        elif frames or (inside and line.strip() == "<no Python frame>"):  # the crashing thread's stack has ended
            break
    return lines[starts[-1]][len(_FATAL):].strip(), frames


def user_frames(frames: Sequence[Frame], most: int = 12) -> list[Frame]:
    """The frames from a cell's (or ``%run`` script's) outermost frame in, without IPython's and the engine's
    around them; else from jdist's outermost frame on the rank in (a set-up, a call from the kernel); of those,
    the innermost ``most``.

    >>> frames = [("/v/ctypes/__init__.py", 519, "string_at"), ("/tmp/ipykernel_7/2.py", 3, "crash"),
    ...           ("/tmp/ipykernel_7/2.py", 5, "<module>"), ("/v/IPython/core/interactiveshell.py", 3577, "run_code")]
    >>> [func for _, _, func in user_frames(frames)]
    ['string_at', 'crash', '<module>']
    >>> [func for _, _, func in user_frames([("/v/jdist/rank/process.py", 9, "watch_owner"),
    ...     ("/v/jdist/protocol.py", 70, "__call__"), ("/v/ipyparallel/engine/kernel.py", 117, "apply_request")])]
    ['watch_owner', '__call__']
    """
    for i, (path, _, func) in enumerate(frames):
        if _runs_a_script(path, func) and i > 0:  # the script of a %run (jdist run)
            return list(frames[:i])
    cells = [i for i, (path, _, _) in enumerate(frames) if _CELL_FILE.search(path)]
    if cells:
        return list(frames[:cells[-1] + 1])
    ours = [i for i, (path, _, _) in enumerate(frames) if _JDIST_ON_RANK.search(path.replace("\\", "/"))]
    return list(frames[:ours[-1] + 1][:most]) if ours else list(frames[:most])


def crash_lines(rank: int | None, text: str) -> list[str]:
    """Where a rank crashed (its crash report in ``text``, :func:`parse_crash`), as lines of an error; none if it
    wrote none. ``rank`` None: a report from output that several ranks share (ranks on other hosts).

    >>> print("\\n".join(crash_lines(1, 'Fatal Python error: Aborted\\n\\nStack (most recent call first):\\n'
    ...                                  '  File "/tmp/ipykernel_7/2.py", line 3 in <module>\\n')))
    Rank 1 crashed (Fatal Python error: Aborted) here, innermost call last:
      cell line 3, in <module>
    >>> crash_lines(None, 'Fatal Python error: Segmentation fault\\n\\nStack (most recent call first):\\n'
    ...                   '  <no Python frame>\\n')
    ['A rank crashed (Fatal Python error: Segmentation fault) in a thread running no Python code (a C or C++ thread)']
    """
    crash = parse_crash(text)
    if crash is None:
        return []
    what, frames = crash
    who = "A rank" if rank is None else f"Rank {rank}"
    if not frames:
        return [f"{who} crashed (Fatal Python error: {what}) in a thread running no Python code (a C or C++ thread)"]
    return [f"{who} crashed (Fatal Python error: {what}) here, innermost call last:",
            format_stack(user_frames(frames), cells=True)]


def format_stack(frames: Sequence[Frame], cells: bool = False) -> str:
    """The frames as a traceback-like text, outermost first; ``cells``: a cell's frames as ``cell line N`` (on
    the rank its file is IPython's, a name the user never saw).

    >>> print(format_stack([("b.py", 2, "inner"), ("a.py", 1, "<module>")]))
      File "a.py", line 1, in <module>
      File "b.py", line 2, in inner
    >>> print(format_stack([("/tmp/ipykernel_7/2.py", 3, "<module>")], cells=True))
      cell line 3, in <module>
    """
    return "\n".join(f"  cell line {line}, in {func}" if cells and _CELL_FILE.search(path)
                     else f'  File "{path}", line {line}, in {func}' for path, line, func in reversed(frames))
