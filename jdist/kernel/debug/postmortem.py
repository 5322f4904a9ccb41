"""``%dist debug``: a post-mortem on the ranks, driven from the notebook's input box.

After a ``%%distributed`` cell failed (``RankError``), each rank keeps its last failure's traceback
(:mod:`jdist.rank.debug.relay`). :func:`post_mortem` opens pdb on the rank that failed first (or on the
ranks given), then sends each line typed in the notebook to them and prints what pdb answers, each
rank's answer labelled when there are several. Nothing runs on the ranks but pdb's inspection of
finished frames: their state and the other ranks are untouched. The commands travel as ordinary
ipyparallel calls (signed, over the cluster's own channels), so remote ranks work the same.

In the notebook::

    %dist debug             # the rank that failed first
    %dist debug --ranks 0,1 # several: the same command on each, answers labelled
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from jdist.errors import strip_ansi

from .. import cluster as cl

HELP = ("pdb on finished frames: p/pp EXPR, l/ll (list), w (where), u/d (up/down), a (args), "
        "any Python statement; q ends (the ranks stay as they are).")


def pick_ranks(cluster: cl.ClusterSession, ranks: Sequence[int] | None) -> list[int]:
    """The ranks to open: ``ranks`` (each must have a failure), else the one whose cell failed first."""
    have = {r: f for r, f in enumerate(cluster.call("debug_failure")) if f is not None}
    if ranks:
        missing = [r for r in ranks if r not in have]
        if missing:
            raise ValueError(f"%dist debug: no cell failed on rank(s) {', '.join(map(str, missing))}"
                             + (f"; these have a failure: {', '.join(map(str, sorted(have)))}." if have else "."))
        return list(ranks)
    if not have:
        raise ValueError("%dist debug: no cell failed on any rank (since the ranks started): it opens pdb after a "
                         "%%distributed cell raised.")
    return [min(have, key=lambda r: (have[r]["time"], r))]


def post_mortem(cluster: cl.ClusterSession, ranks: Sequence[int] | None, ask: Callable[[str], str],
                say: Callable[[str], None]) -> list[float]:
    """Open pdb on ``ranks`` (default: the rank that failed first) and relay ``ask``'s lines to them until
    ``q`` (or the end of input, or an interrupt). Returns each command's round trip in seconds."""
    chosen = pick_ranks(cluster, ranks)
    opened = cluster.call("debug_start", ranks=chosen)
    several = len(chosen) > 1
    for r, info in zip(chosen, opened):
        say(f"Post-mortem on rank {r}: {info['error']}")
        _show(say, r, info["text"], several)
    say(HELP)
    prompt = f"(Pdb r{','.join(map(str, chosen))}) "
    trips: list[float] = []
    try:
        while True:
            try:
                line = ask(prompt)
            except (EOFError, KeyboardInterrupt):
                line = "q"
            except NotImplementedError:  # IPython's StdinNotImplementedError: a frontend without input boxes
                say("%dist debug needs an input box for the pdb commands; this frontend has none (run it in "
                    "JupyterLab, Notebook or a console).")
                line = "q"
            t0 = time.perf_counter()
            answers = cluster.call("debug_command", line, ranks=chosen)
            trips.append(time.perf_counter() - t0)
            for r, answer in zip(chosen, answers):
                _show(say, r, answer["text"], several)
            if any(a["done"] for a in answers):
                break
    finally:
        try:
            cluster.call("debug_end", ranks=chosen)
        except Exception:  # the ranks went away meanwhile: nothing is left open on them
            pass
    say(f"Post-mortem ended; rank {', '.join(map(str, chosen))} and the others are as they were.")
    return trips


def _show(say: Callable[[str], None], rank: int, text: str, labelled: bool) -> None:
    text = strip_ansi(text).rstrip("\n")
    if not text:
        return
    say("\n".join(f"[r{rank}] {line}" for line in text.splitlines()) if labelled else text)
