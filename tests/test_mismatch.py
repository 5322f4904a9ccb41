"""Collective mismatches said with both sides (jdist.common.mismatch), on the Flight Recorder's entries as the
ranks report them (the cluster cases: tests/test_collectives.py)."""

from __future__ import annotations

from jdist.common.mismatch import mismatch_lines
from jdist.common.stacks import Collective

WORLD = (0, 1, 2, 3)


def newest(seq: int, op: str = "all_reduce", size: int = 10, done: bool = False, group=WORLD) -> tuple:
    return (Collective(group, seq, op, ((size,),), ("Float",), done),)


def test_a_rank_that_called_one_collective_fewer_shows_as_finished_an_older_one():
    latest = {0: newest(58, done=True), 1: newest(59), 2: newest(59), 3: newest(59)}  # rank 0 left the loop early
    where = {r: "all_reduce (cell line 5)" for r in (1, 2, 3)}
    (line,) = mismatch_lines(latest, where, world_size=4)
    assert "rank 0 finished all_reduce #58 of float32[10]; ranks 1-3 are in all_reduce #59 of float32[10] at cell " \
           "line 5" in line, line


def test_groups_are_compared_apart_and_agreeing_or_finished_ones_say_nothing():
    sub = (0, 1)
    latest = {0: newest(3, group=sub) + newest(7), 1: newest(3, size=4, group=sub) + newest(7),
              2: newest(7), 3: newest(7)}
    (line,) = mismatch_lines(latest, {}, world_size=4)
    assert line.startswith("collective mismatch on a group (ranks 0, 1): ") and "float32[4]" in line, line
    done = {r: newest(9, size=10 + r, done=True) for r in WORLD}  # all completed: nothing waits, no mismatch said
    assert mismatch_lines(done, {}, world_size=4) == []
    assert mismatch_lines({0: newest(1)}, {}, world_size=4) == []  # one rank alone: nothing to compare with
