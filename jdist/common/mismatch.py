"""Collective mismatches, from the ranks' newest collectives (:class:`jdist.common.stacks.Collective`, c10d's
Flight Recorder): ranks of one process group in different collectives, or in the same one with other sizes or
dtypes, said with both sides.

Example (4 ranks: rank 1 broadcasts 12 floats where the others all-reduce 10):
    >>> from jdist.common.stacks import Collective
    >>> world = (0, 1, 2, 3)
    >>> latest = {r: (Collective(world, 58, "all_reduce", ((10,),), ("Float",), False),) for r in (0, 2, 3)}
    >>> latest[1] = (Collective(world, 58, "broadcast", ((12,),), ("Float",), False),)
    >>> where = {0: "all_reduce (cell line 7)", 1: "broadcast (cell line 9)", 2: "all_reduce (cell line 7)",
    ...          3: "all_reduce (cell line 7)"}
    >>> print(mismatch_lines(latest, where, world_size=4)[0])
    collective mismatch on the default group (ranks 0-3): rank 1 is in broadcast #58 of float32[12] at cell line 9; ranks 0, 2, 3 are in all_reduce #58 of float32[10] at cell line 7 (the ranks' newest collectives, from c10d's Flight Recorder)
    >>> latest[1] = latest[0]
    >>> mismatch_lines(latest, where, world_size=4)
    []
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .stacks import Collective

_LINE = re.compile(r"\((cell line \d+|[^()]*:\d+)\)\s*$")


def spans(ranks: Sequence[int]) -> str:
    """Ranks as runs of three or more: ``0-3``, ``0, 2``, ``1-3, 5``.

    >>> spans([0, 1, 2, 3]), spans([0, 2]), spans([1, 2, 3, 5])
    ('0-3', '0, 2', '1-3, 5')
    """
    out: list[str] = []
    ranks = sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(f"{ranks[i]}-{ranks[j]}" if j > i + 1 else ", ".join(map(str, ranks[i:j + 1])))
        i = j + 1
    return ", ".join(out)


def mismatch_lines(latest: Mapping[int, Sequence[Collective]], where: Mapping[int, str],
                   world_size: int) -> list[str]:
    """One line per process group whose ranks are not all in the same collective while one of them waits: each
    side's ranks, the collective (operation, sequence number on the group, tensors) and, for a rank waiting in
    it, its place (``where``: rank -> the hang report's "all_reduce (cell line 7)"). A rank that finished its
    newest collective on the group is said as having finished it."""
    groups: dict[tuple[int, ...], dict[int, Collective]] = {}
    for rank, collectives in latest.items():
        for c in collectives:
            if c.group and rank in c.group:
                groups.setdefault(c.group, {})[rank] = c
    lines = []
    for group, by_rank in sorted(groups.items()):
        if len(by_rank) < 2 or all(c.done for c in by_rank.values()):
            continue
        sides: dict[tuple[int, str, tuple[tuple[int, ...], ...], tuple[str, ...]], list[int]] = {}
        for rank, c in sorted(by_rank.items()):
            sides.setdefault((c.seq, c.op, c.sizes, c.dtypes), []).append(rank)
        if len(sides) < 2:
            continue
        parts = []
        for key, ranks in sorted(sides.items(), key=lambda kv: (len(kv[1]), kv[1])):
            c = by_rank[ranks[0]]
            places = {m.group(1) for r in ranks if (m := _LINE.search(where.get(r, "")))}
            place = f" at {places.pop()}" if len(places) == 1 else ""
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {spans(ranks)}"
            verb = ("finished" if all(by_rank[r].done for r in ranks) else
                    ("is in" if len(ranks) == 1 else "are in"))
            parts.append(f"{who} {verb} {c.what()}{place}")
        name = "the default group" if group == tuple(range(world_size)) else "a group"
        lines.append(f"collective mismatch on {name} (ranks {spans(group)}): {'; '.join(parts)} "
                     "(the ranks' newest collectives, from c10d's Flight Recorder)")
    return lines


def alone_line(waiting: Mapping[int, str], finished: Sequence[int], latest: Mapping[int, Sequence[Collective]],
               world_size: int) -> str:
    """The line for ranks left alone in a collective that ranks which finished the cell never called (``waiting``:
    rank -> the hang report's "barrier (cell line 2)"; ``latest``: the ranks' newest collectives).

    >>> from jdist.common.stacks import Collective
    >>> latest = {0: (Collective((0, 1, 2, 3), 3, "barrier", (), (), False),)}
    >>> print(alone_line({0: "barrier (cell line 2)"}, [1, 2, 3], latest, world_size=4))
    collective left alone: rank 0 waits in barrier #3 on the default group (ranks 0-3) at cell line 2, which ranks 1-3 finished the cell without calling (c10d's Flight Recorder: their newest collective on the group, if any, is older). Every rank of a group must call each of its collectives: call it on every rank, or give the ranks that call it a group of their own (dist.new_group([0])).
    """
    ranks = sorted(waiting)
    pending = [c for r in ranks for c in latest.get(r, ()) if not c.done and r in c.group]
    who = f"rank {ranks[0]} waits" if len(ranks) == 1 else f"ranks {spans(ranks)} wait"
    if pending:
        c = pending[0]
        name = "the default group" if c.group == tuple(range(world_size)) else "a group"
        what = f"{c.what()} on {name} (ranks {spans(c.group)})"
    else:
        what = "a collective"
    places = {m.group(1) for r in ranks if (m := _LINE.search(waiting.get(r, "")))}
    place = f" at {places.pop()}" if len(places) == 1 else ""
    gone = sorted(set(finished) & set(pending[0].group)) if pending else sorted(finished)
    them = f"rank {gone[0]}" if len(gone) == 1 else f"ranks {spans(gone)}"
    return (f"collective left alone: {who} in {what}{place}, which {them} finished the cell without calling "
            "(c10d's Flight Recorder: their newest collective on the group, if any, is older). Every rank of a group must "
            "call each of its collectives: call it on every rank, or give the ranks that call it a group of their "
            f"own (dist.new_group([{', '.join(map(str, ranks))}])).")


__all__ = ["alone_line", "mismatch_lines", "spans"]
