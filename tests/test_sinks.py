"""Where a run's records go in the kernel (jdist.kernel.sinks): memory (bounded), the run log, the dashboard."""

from __future__ import annotations

import jdist
from jdist.kernel import sinks
from jdist.metrics import Run, read_run


def test_the_kernel_keeps_a_bounded_number_of_runs_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks, "_runs", type(sinks._runs)(maxlen=sinks.MAX_RUNS_IN_MEMORY))
    for i in range(sinks.MAX_RUNS_IN_MEMORY + 5):
        run = Run(f"r{i:02d}", 1)
        made = sinks.default_sinks(run, dashboard=False, run_dir=str(tmp_path))
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
