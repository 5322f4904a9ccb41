"""Where a run's records go in the kernel (jdist.kernel.sinks): memory (bounded), the run log, the
dashboard, and the sinks of sink plugins (jdist's own: --tensorboard, --mlflow) that a cell's options
turn on."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

import jdist
from jdist.kernel import sinks
from jdist.metrics import Run, budget
from jdist.plugins import option_table, sink_specs


def cell(**given):
    return option_table().cell_options(given)


def test_older_runs_leave_memory_under_the_budget_and_come_back_from_disk_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks, "_runs", type(sinks._runs)(maxlen=sinks.MAX_RUNS_LISTED))
    monkeypatch.setattr(budget, "BUDGET", budget.RunBudget(max_bytes=2**30, keep=3))
    histories = {}
    for i in range(8):
        run = Run(f"r{i:02d}", 2)
        made = sinks.default_sinks(run, cell(no_dashboard=True, run_dir=str(tmp_path)))
        for sink in made:
            sink.start(run)
        for start in range(0, 300, 50):  # batches as they arrive: both ranks, 50 steps each
            new = run.add([{"rank": r, "cell": 1, "seq": s, "step": s, "time": 1e9 + s, "loss": i + s / 7 + r,
                            "mem_bytes": 2**20 * (r + 1)} for r in (0, 1) for s in range(start, start + 50)])
            for sink in made:
                sink.add(new)
        histories[run.run_id] = run.history
        run.status = "finished"
        for sink in made:
            sink.finish(run)
    listed = jdist.runs()
    assert [r.run_id for r in listed] == [f"r{i:02d}" for i in range(8)] and jdist.last_run().run_id == "r07"
    assert [r.run_id for r in listed if not r.released] == ["r05", "r06", "r07"]  # keep=3, the newest
    assert all(r.nbytes == 0 for r in listed[:5]) and listed[0].count() == 600
    first = listed[0]
    pd.testing.assert_frame_equal(first.history, histories["r00"])  # read back from its folder
    assert not first.released and first.aggregate("loss")[0][-1] == 299
    # r00 is now the most recently used: the least recently used of the others left memory instead
    assert [r.run_id for r in listed if not r.released] == ["r00", "r06", "r07"]
    budget.configure(max_mb=first.nbytes * 1.5 / 2**20)  # room for one run: the most recently used
    assert [r.run_id for r in listed if not r.released] == ["r00"]
    pd.testing.assert_frame_equal(listed[6].history, histories["r06"])
    assert [r.run_id for r in listed if not r.released] == ["r06"]


def test_run_memory_refuses_a_budget_that_cannot_hold_anything():
    with pytest.raises(ValueError, match="max_mb must be > 0"):
        jdist.run_memory(max_mb=0)
    with pytest.raises(ValueError, match="keep must be >= 1"):
        jdist.run_memory(keep=0)


def test_a_cells_options_choose_its_sinks(tmp_path):
    run = Run("r", 1)
    kinds = [type(s).__name__ for s in sinks.default_sinks(run, cell())]
    assert kinds == ["KernelRuns", "RunLogSink", "StragglerSink", "DashboardSink"]
    made = sinks.default_sinks(run, cell(no_dashboard=True, tensorboard=str(tmp_path), mlflow=True))
    assert [type(s).__name__ for s in made] == ["KernelRuns", "RunLogSink", "StragglerSink", "TrackerSink",
                                                 "TrackerSink"]
    assert sorted(s.label for s in made[3:]) == ["MLflow", "TensorBoard"]  # sink order: entry-point order
    assert set(sink_specs()) == {"tensorboard", "mlflow"}


def test_a_sink_whose_library_is_missing_names_the_extra_before_anything_runs(monkeypatch):
    assert sinks.unavailable(cell(mlflow=True)) is None  # make test installs jdist[tracking]
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    assert sinks.unavailable(cell(mlflow=True)) == "--mlflow needs mlflow: pip install 'jdist[tracking]' " \
                                                  "(then restart the kernel)."
    assert sinks.unavailable(cell(tensorboard="tb")) is None  # only what the cell asks for is checked
