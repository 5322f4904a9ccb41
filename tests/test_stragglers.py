"""Stragglers named with their cause: the windows' scores (pure), the slowest-ranks table, and real ranks, one of
which waits for its DataLoader."""

from __future__ import annotations

import random

import pytest

from jdist.metrics import Run
from jdist.metrics.panels import slowest_panel
from jdist.metrics.stragglers import MIN_STEPS, SLOW, StragglerWatch


def window(watch: StragglerWatch, second: int, work: dict[int, float], data: dict[int, float] | None = None,
           step: float = 0.1, steps: int = 5, wait: dict[int, float] | None = None) -> list:
    """One second of synchronous steps: every rank's step is ``step`` long, its ``work[r]`` outside
    communication (``data[r]`` of it waiting for data), the rest waiting for the slowest in the all-reduce;
    ``wait[r]``: the seconds of its step it waited for a CPU (0 by default)."""
    data, wait = data or {}, wait or {}
    watch.add([{"rank": r, "step_time_s": step, "comm_time_s": step - w, "data_time_s": data.get(r, 0.0),
                "cpu_wait_s": wait.get(r, 0.0)} for _ in range(steps) for r, w in work.items()])
    return watch.poll(float(second))


def test_one_slow_window_is_not_a_straggler_two_in_a_row_are_and_a_rank_is_named_once():
    watch = StragglerWatch(4, window_s=1.0)
    even = {r: 0.02 for r in range(4)}
    assert window(watch, 0, even) == []  # (the first poll starts the clock)
    assert window(watch, 1, {**even, 3: 0.05}) == []  # one slow window: a pause, not a straggler
    assert window(watch, 2, even) == []
    assert window(watch, 3, {**even, 3: 0.05}) == []
    found = window(watch, 4, {**even, 3: 0.05})
    assert [(s.rank, round(s.score, 2), s.windows, s.cause) for s in found] == [(3, 2.5, 2, "compute")]
    assert "it computes 50% of its step, the others 20%" in found[0].line(), found[0].line()
    assert window(watch, 5, {**even, 3: 0.05}) == [] and len(watch.flagged) == 1  # named once


def test_the_cause_is_data_when_the_rank_waits_for_its_batches():
    watch = StragglerWatch(2, window_s=1.0)
    for second in range(3):
        found = window(watch, second, {0: 0.02, 1: 0.08}, data={1: 0.06})
    (s,) = found
    assert s.cause == "data" and s.rank == 1
    assert s.line().endswith("it waits for data 60% of its step, the others 0%; they wait for it in communication "
                             "80% of theirs. Cause: waiting for data (its DataLoader)."), s.line()


def test_the_cause_is_host_load_when_the_rank_waits_for_a_cpu():
    watch = StragglerWatch(4, window_s=1.0, hosts={3: "node2"})
    for second in range(3):  # rank 3's own work is as short as the others', but it waits 60 ms for a CPU
        found = window(watch, second, {r: 0.02 for r in range(4)}, wait={3: 0.06, 0: 0.002, 1: 0.002, 2: 0.002})
    assert [(s.rank, s.cause) for s in found] == [(3, "host load")]
    line = found[0].line()
    assert line.startswith("rank 3 (node2) is slower than the others: 3.6x their median time outside communication "
                           "or waiting for a CPU"), line
    assert "it waits for a CPU 60% of its step (runnable, its core taken), the others 2%" in line, line
    assert line.endswith("Cause: host load (other processes on node2, or CPU steal, take its cores)."), line
    watch = StragglerWatch(4, window_s=1.0)
    for second in range(3):  # longer work and no wait: its own computation
        found = window(watch, second, {r: 0.05 if r == 3 else 0.02 for r in range(4)})
    assert [(s.rank, s.cause) for s in found] == [(3, "compute")]


def test_ranks_with_jitter_and_too_few_steps_are_not_named():
    rng = random.Random(0)
    watch = StragglerWatch(4, window_s=1.0)
    for second in range(60):  # every rank's work varies by up to +-20 % around the same mean, each window
        assert window(watch, second, {r: 0.02 * rng.uniform(0.8, 1.2) for r in range(4)}) == []
    few = StragglerWatch(2, window_s=1.0)
    for second in range(5):  # a rank with fewer than MIN_STEPS records in a window is not scored
        assert window(few, second, {0: 0.02, 1: 0.09}, steps=MIN_STEPS - 1) == []
    untimed = StragglerWatch(2, window_s=1.0)  # no communication timed (torchrun's group): the step times, equal
    for second in range(5):
        untimed.add([{"rank": r, "step_time_s": 0.1} for _ in range(5) for r in (0, 1)])
        assert untimed.poll(float(second)) == []
    assert SLOW > 1.2  # (the jitter above stays under it)


def test_a_pipelines_stages_are_compared_within_each_stage():
    # 4 ranks, 2 stages (pp x dp = 2 x 2): stage 1 works twice as long as stage 0 by design; within stage 1,
    # rank 3 is the slow one
    watch = StragglerWatch(4, window_s=1.0)
    for second in range(4):
        watch.add([{"rank": r, "step_time_s": 0.1, "comm_time_s": 0.1 - w, "pp_stage": r // 2}
                   for _ in range(5) for r, w in {0: 0.02, 1: 0.02, 2: 0.04, 3: 0.08}.items()])
        watch.poll(float(second))
    assert [(s.rank, round(s.score, 1)) for s in watch.flagged] == [(3, 2.0)]  # not rank 2 (0.04 vs 0.02)


def test_the_slowest_ranks_table_shows_a_straggler_first_with_its_cause_on_a_few_ranks():
    run = Run("x", 4)
    run.add([{"rank": r, "seq": s, "step": s, "step_time_s": 0.1, "comm_time_s": 0.02 if r == 2 else 0.08,
              "data_time_s": 0.06 if r == 2 else 0.0} for s in range(6) for r in range(4)])
    assert slowest_panel(run) is None  # 4 ranks, none named: no table (the bars show them)
    watch = StragglerWatch(4, window_s=1.0, flagged=run.stragglers)
    for second in range(3):
        window(watch, second, {r: 0.08 if r == 2 else 0.02 for r in range(4)}, data={2: 0.06})
    panel = slowest_panel(run)
    assert panel is not None
    table = panel.panel
    assert table["rows"][0][0] == "r2" and table["rows"][0][-2:] == ["60%", "straggler (data)"], table["rows"]
    assert table["note"].startswith("straggler: rank 2, 4.0x the others' time outside communication, waiting for data; ")
    assert panel.summary(run) == [f"straggler: {run.stragglers[0].line()}"]


def test_a_runs_stragglers_are_kept_in_its_folder_for_the_sidebar(tmp_path):
    from jdist.kernel.sinks import RunLogSink
    from jdist.metrics import read_run

    run, sink = Run("r", 2), RunLogSink(str(tmp_path))
    sink.start(run)
    watch = StragglerWatch(2, window_s=1.0, flagged=run.stragglers)
    for second in range(3):
        window(watch, second, {0: 0.02, 1: 0.08}, data={1: 0.06})
    assert read_run(tmp_path / "r").stragglers == []  # not yet written
    sink.tick()  # (every poll of the cell: meta.json again once a rank is named)
    assert read_run(tmp_path / "r").stragglers == run.stragglers and len(run.stragglers) == 1


@pytest.mark.cluster
def test_a_rank_waiting_for_its_dataloader_is_named_with_data_as_the_cause_and_a_clean_run_names_none(kernel):
    # 4 real ranks, windows of 1 s; rank 2's Dataset sleeps 4 ms a sample (32 ms a batch); DDP makes the
    # others wait for it in the all-reduce
    kernel.run("%env JDIST_STRAGGLER_WINDOW_S=1")
    kernel.run("%%distributed -n 4 --backend ddp\n" + LOADER)
    clean = kernel.run("%%distributed\ntrain(slow_rank=None, seconds=8)")
    assert "slower than the others" not in clean.stdout, clean.stdout
    assert kernel.value("jdist.last_run().stragglers") == []
    out = kernel.run("%%distributed\ntrain(slow_rank=2, seconds=4)")
    lines = [line for line in out.stdout.splitlines() if line.startswith("jdist: rank 2 is slower than the others: ")]
    assert len(lines) == 1, out.stdout  # once, live (the run's summary repeats it as "straggler: ...")
    assert f"straggler: {lines[0][len('jdist: '):]}" in out.stdout
    assert "it waits for data" in lines[0] and lines[0].endswith("Cause: waiting for data (its DataLoader)."), lines
    named = kernel.value("[(s.rank, s.cause, s.windows) for s in jdist.last_run().stragglers]")
    assert named == [(2, "data", 2)], named  # within 3 windows (named at the 2nd slow one)
    data = kernel.value("jdist.last_run().per_rank_mean('data_time_s', skip_first=True)")
    assert data[2] > 0.02 > max(data[r] for r in (0, 1, 3)), data  # the records' data_time_s
    # rank 2 starved of CPU: alone on the second core with a busy process there, at nice 19 (the others on the
    # first core): the same work, little CPU for it
    import os
    if len(os.sched_getaffinity(0)) < 2:
        return  # (one core: nothing to starve it against)
    kernel.run("%%distributed\n" + STARVE)
    try:
        out = kernel.run("%%distributed\ntrain(slow_rank=None, seconds=4)")
    finally:
        kernel.run("%%distributed\nunstarve()")
    lines = [line for line in out.stdout.splitlines() if line.startswith("jdist: rank 2 is slower than the others: ")]
    assert len(lines) == 1 and "it waits for a CPU " in lines[0], out.stdout
    assert lines[0].endswith(", or CPU steal, take its cores)."), lines
    # rank 2 by its cause (under the suite, another test's processes share these two cores: a rank of the first
    # core may be named too, for its own computation)
    assert (2, "host load") in kernel.value("[(s.rank, s.cause) for s in jdist.last_run().stragglers]")


STARVE = """
import os, subprocess, sys
cores = sorted(os.sched_getaffinity(0))
burner = None
if len(cores) >= 2:
    os.sched_setaffinity(0, {cores[1]} if rank == 2 else {cores[0]})
    if rank == 2:
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(burner.pid, {cores[1]})
        os.setpriority(os.PRIO_PROCESS, 0, 19)
def unstarve():
    os.sched_setaffinity(0, set(cores))
    if burner is not None:
        burner.kill(); burner.wait()
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except PermissionError:   # (not root: it stays at 19 until the cluster ends)
            pass
"""


LOADER = """
import time, torch, torch.nn as nn
from torch.utils.data import DataLoader, Dataset
class Samples(Dataset):
    def __init__(self, slow): self.slow = slow
    def __len__(self): return 10 ** 6
    def __getitem__(self, i):
        if self.slow:
            time.sleep(0.004)
        return torch.randn(16), torch.randn(1)
def train(slow_rank, seconds):
    model = jdist.prepare(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0, done = time.time(), torch.zeros(1)
    for x, y in DataLoader(Samples(rank == slow_rank), batch_size=8):
        loss = ((model(x) - y) ** 2).mean(); opt.zero_grad(); loss.backward(); opt.step()
        done[0] = time.time() - t0 > seconds
        torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MAX)  # (every rank stops at the same step)
        if done[0]:
            break
"""
