"""What a rank wrote to its stderr (fd 2) just before it died, which the notebook never got.

An ipyparallel engine's ``sys.stderr`` forwards fd 2 through a pipe that a thread of the same process
reads, so the last words of a C or C++ library that aborts (``terminate called after throwing an
instance of ...``) were still in the pipe when the process died, and died with it. Under jdist's
launchers the shell around each engine names a file (:data:`STDERR_ENV`); the rank points fd 2 at it
(:mod:`jdist.rank.stderr`) and notes in ``<file>.pos`` how far it has forwarded. A write to a file
outlives its process: after the rank ended, the kernel (ranks on its host, :func:`unshown`) or the shell
(ranks on other hosts, :data:`UNSHOWN_SH`) reads what was not forwarded, and the error shows it.

Pure functions and constants, used on both sides.

Example:
    >>> import pathlib, tempfile
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "stderr-1"
    >>> _ = f.write_bytes(b"shown\\nterminate called after throwing an instance of 'c10::Error'\\n")
    >>> write_pos(str(f), 6)
    >>> unshown(str(f))
    "terminate called after throwing an instance of 'c10::Error'"
"""

from __future__ import annotations

import os
import re

#: The environment variable naming the file a rank's fd 2 goes to (set by the shell around its engine).
STDERR_ENV = "JDIST_STDERR_FILE"
#: Beside it: how many of its bytes the rank has forwarded (a decimal number, padded with spaces).
POS_SUFFIX = ".pos"
#: Lines of a remote rank's last words in its launcher's output: ``jdist-rank-stderr <rank> <line>``.
LINE_PREFIX = "jdist-rank-stderr"
#: At most this many of the last lines not forwarded are shown (a library's fatal message is its last lines).
MAX_LINES = 20
MAX_BYTES = 8000
#: What the shell around a remote engine prints at most: the last words and the crash report that follows them
#: there (faulthandler's, when the rank crashed: :func:`split_report`).
SHELL_BYTES = 16000

#: ``/bin/sh`` text for the shell around a remote engine, after the engine ended: prints what the rank had not
#: forwarded (its last :data:`SHELL_BYTES`), each line as ``jdist-rank-stderr <rank> <line>``, then removes the
#: files. ``$rank`` must be set.
UNSHOWN_SH = (
    f'f="${STDERR_ENV}"; if [ -s "$f" ]; then p=$(cat "$f{POS_SUFFIX}" 2>/dev/null); '
    f'tail -c +$(( ${{p:-0}} + 1 )) "$f" | tail -c {SHELL_BYTES} '
    f'| sed "s/^/{LINE_PREFIX} $rank /"; fi; rm -f "$f" "$f{POS_SUFFIX}"'
)
_FATAL = re.compile(r"^Fatal Python error: ", re.M)


def write_pos(path: str, sent: int, fd: int | None = None) -> None:
    """Note that the first ``sent`` bytes of ``path`` were forwarded (``fd``: the ``.pos`` file, open for writing)."""
    data = f"{sent:20d}\n".encode()
    if fd is not None:
        os.pwrite(fd, data, 0)
        return
    with open(path + POS_SUFFIX, "wb") as f:
        f.write(data)


def unshown(path: str) -> str:
    """The last lines (:data:`MAX_LINES`) of ``path`` past what the rank forwarded; "" if none, or no file.

    >>> unshown("/nonexistent/stderr-0")
    ''
    """
    try:
        with open(path + POS_SUFFIX, "rb") as f:
            pos = int(f.read().strip() or 0)
    except (OSError, ValueError):
        pos = 0
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(pos, size - MAX_BYTES))
            data = f.read(MAX_BYTES)
    except OSError:
        return ""
    return last_lines(data.decode("utf-8", errors="replace"))


def last_lines(text: str) -> str:
    """``text``'s last :data:`MAX_LINES` lines that are not blank, without a trailing newline or NUL bytes.

    >>> last_lines("\\n".join(str(i) for i in range(30)) + "\\n\\n")[:5]
    '10\\n11'
    """
    lines = [line.rstrip() for line in text.replace("\0", "").splitlines() if line.strip()]
    return "\n".join(lines[-MAX_LINES:])


def from_output(output: str) -> dict[int, str]:
    """What each remote rank had not forwarded, from its launcher's ``output`` (the lines :data:`UNSHOWN_SH`
    printed), by rank.

    >>> from_output("x\\njdist-rank-stderr 1 boom\\njdist-rank-stderr 0 other\\njdist-rank-stderr 1 abort\\n")
    {1: 'boom\\nabort', 0: 'other'}
    """
    lines: dict[int, list[str]] = {}
    for m in re.finditer(rf"^{LINE_PREFIX} (-?\d+) ?(.*)$", output, re.M):
        lines.setdefault(int(m.group(1)), []).append(m.group(2).rstrip())
    return {rank: "\n".join(text) for rank, text in lines.items()}


def split_report(text: str) -> tuple[str, str]:
    """A rank's unforwarded stderr as its last words (:func:`last_lines`) and the crash report faulthandler wrote
    after them ("" if it did not crash).

    >>> split_report("bye\\nFatal Python error: Aborted\\n\\nStack (most recent call first):\\n  <no Python frame>")
    ('bye', 'Fatal Python error: Aborted\\n\\nStack (most recent call first):\\n  <no Python frame>')
    """
    m = _FATAL.search(text)
    return (last_lines(text), "") if m is None else (last_lines(text[:m.start()]), text[m.start():])


def lines_of(rank: int | None, text: str) -> list[str]:
    """A rank's last words as lines of an error (none if there are none).

    >>> lines_of(1, "terminate called after throwing an instance of 'gloo::IoException'\\n  what():  closed")
    ["Rank 1's last output on stderr, not shown before it died:", "  terminate called after throwing an \
instance of 'gloo::IoException'", '    what():  closed']
    """
    if not text.strip():
        return []
    who = "A rank" if rank is None else f"Rank {rank}"
    return [f"{who}'s last output on stderr, not shown before it died:",
            *("  " + line for line in text.splitlines())]
