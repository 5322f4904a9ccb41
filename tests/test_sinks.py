"""Where a run's records go in the kernel (jdist.kernel.sinks): memory (bounded), the run log, the
dashboard, and the sinks of sink plugins (jdist's own: --tensorboard, --mlflow) that a cell's options
turn on."""

from __future__ import annotations

import sys

import jdist
from jdist.kernel import sinks
from jdist.metrics import Run, read_run
from jdist.plugins import option_table, sink_specs


def cell(**given):
    return option_table().cell_options(given)


def test_the_kernel_keeps_a_bounded_number_of_runs_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks, "_runs", type(sinks._runs)(maxlen=sinks.MAX_RUNS_IN_MEMORY))
    for i in range(sinks.MAX_RUNS_IN_MEMORY + 5):
        run = Run(f"r{i:02d}", 1)
        made = sinks.default_sinks(run, cell(no_dashboard=True, run_dir=str(tmp_path)))
        for sink in made:
            sink.start(run)
        new = run.add([{"rank": 0, "cell": 1, "seq": 0, "step": 0, "loss": float(i)}])
        for sink in made:
            sink.add(new)
        run.status = "finished"
        for sink in made:
            sink.finish(run)
    kept = [r.run_id for r in jdist.runs()]
    assert kept == [f"r{i:02d}" for i in range(5, 15)] and jdist.last_run().run_id == "r14"
    # every run is still on disk
    assert read_run(tmp_path / "r00").aggregate("loss") == ([0], [0.0], [0.0], [0.0])
    assert len(list(tmp_path.iterdir())) == 15


def test_a_cells_options_choose_its_sinks(tmp_path):
    run = Run("r", 1)
    kinds = [type(s).__name__ for s in sinks.default_sinks(run, cell())]
    assert kinds == ["KernelRuns", "RunLogSink", "DashboardSink"]
    made = sinks.default_sinks(run, cell(no_dashboard=True, tensorboard=str(tmp_path), mlflow=True))
    assert [type(s).__name__ for s in made] == ["KernelRuns", "RunLogSink", "TrackerSink", "TrackerSink"]
    assert sorted(s.label for s in made[2:]) == ["MLflow", "TensorBoard"]  # sink order: entry-point order
    assert set(sink_specs()) == {"tensorboard", "mlflow"}


def test_a_sink_whose_library_is_missing_names_the_extra_before_anything_runs(monkeypatch):
    assert sinks.unavailable(cell(mlflow=True)) is None  # make test installs jdist[tracking]
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    assert sinks.unavailable(cell(mlflow=True)) == "--mlflow needs mlflow: pip install 'jdist[tracking]' " \
                                                  "(then restart the kernel)."
    assert sinks.unavailable(cell(tensorboard="tb")) is None  # only what the cell asks for is checked
