"""Collectives that cannot complete: refused before they start under --targets (jdist.rank.collectives), and
mismatches said with both sides in a hang report (jdist.common.mismatch, from c10d's Flight Recorder), on 4 real
ranks."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def four(kernel):
    kernel.run("%%distributed -n 4 --backend ddp --watchdog 3\nimport torch, torch.nn as nn, torch.distributed as dist")
    return kernel


def test_a_collective_with_ranks_not_running_the_cell_fails_at_once_and_the_cluster_works_after(four):
    four.run("%%distributed\nalone = dist.new_group([0])\nt = torch.ones(1)")
    out = four.run("%%distributed --targets 0\ndist.all_reduce(t)", allow_error=True, timeout=30)
    assert out.elapsed < 2, out.elapsed  # at once, not a hang found after --watchdog
    assert ("dist.all_reduce on the default group (ranks 0-3) in a cell that runs on rank 0 only: ranks 1-3 do not "
            "run it and would never join") in out.shown, out.shown
    assert "dist.new_group([0])" in out.shown
    out = four.run("%%distributed --targets 0\nmodel = jdist.prepare(nn.Linear(2, 1))", allow_error=True)
    assert "DistributedDataParallel (it broadcasts the parameters of one rank to the others) on the default group" \
        in out.shown, out.shown  # (DDP's constructor, in C++: it would hang)
    four.run("%%distributed --targets 0\ndist.all_reduce(t, group=alone)")  # a group of the cell's ranks: fine
    out = four.run("%%distributed --output all\ndist.all_reduce(t)\nprint('sum', t.item())")  # nothing hung
    assert out.stdout.count("sum 4.0") == 4, out.stdout


@pytest.mark.parametrize("cell, theirs, ours", [
    ("t = torch.ones(12 if rank == 1 else 10)\ndist.all_reduce(t)",
     r"rank 1 is in all_reduce #\d+ of float32\[12\] at cell line 2",
     r"ranks 0, 2, 3 (are in|finished) all_reduce #\d+ of float32\[10\]"),
    ("if rank == 1:\n    dist.broadcast(torch.ones(12), 0)\nelse:\n    dist.all_reduce(torch.ones(10))",
     r"rank 1 is in broadcast #(\d+) of float32\[12\] at cell line 2",
     r"ranks 0, 2, 3 are in all_reduce #(\d+) of float32\[10\] at cell line 4"),
], ids=["shape", "op"])
def test_a_collective_mismatch_is_said_with_both_sides_and_their_cell_lines(four, cell, theirs, ours):
    out = four.run("%%distributed\n" + cell, allow_error=True, timeout=60)
    line = next((x for x in out.shown.splitlines() if "collective mismatch on the default group (ranks 0-3)" in x), "")
    assert re.search(theirs, line) and re.search(ours, line), out.shown
    assert line.endswith("(the ranks' newest collectives, from c10d's Flight Recorder)"), line
    out = four.run("%%distributed --output all\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())")
    assert out.stdout.count("sum 4.0") == 4, out.stdout  # the group re-made after the release works


@pytest.mark.parametrize("call", ["dist.barrier()", "dist.all_reduce(torch.ones(3))"])
def test_a_collective_that_ranks_which_finished_the_cell_never_called_fails_within_2_s(four, call):
    out = four.run(f"%%distributed\nx = 1\nif rank == 0:\n    {call}", allow_error=True, timeout=30)
    assert out.elapsed < 2.5, out.elapsed  # not the watchdog's 3 s
    op = call.split("(")[0].split(".")[1]
    assert re.search(rf"collective left alone: rank 0 waits in {op} #\d+.* on the default group \(ranks 0-3\) at cell "
                     r"line 3, which ranks 1-3 finished the cell without calling", out.shown), out.shown
    assert "dist.new_group([0])" in out.shown and "(--watchdog)" not in out.shown, out.shown
    out = four.run("%%distributed --output all\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())")
    assert out.stdout.count("sum 4.0") == 4, out.stdout
