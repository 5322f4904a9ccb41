"""Run export to TensorBoard and MLflow (jdist/metrics/export.py), read back with the libraries' own
readers: TensorBoard's EventAccumulator and the MLflow client on a sqlite store."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from jdist.metrics import AUTO_METRICS, Run
from jdist.metrics.export import Means


def make_run(steps: int = 5, ranks: int = 2, missing_last_on: int | None = None) -> Run:
    run = Run("20261123-120000-abcdef", world_size=ranks, backend="ddp", code="jdist.log(loss=1.0)", total_steps=steps)
    recs = []
    for step in range(steps):
        for rank in range(ranks):
            if step == steps - 1 and rank == missing_last_on:
                continue
            recs.append({"rank": rank, "cell": 1, "seq": step, "step": step, "time": 1000.0 + step,
                         "loss": 1.0 / (step + 1) + rank, "step_time_s": 0.1 * (rank + 1), "comm_time_s": 0.01,
                         "compute_time_s": 0.1 * (rank + 1) - 0.01, "mem_bytes": 1000 + rank, "mem_peak_bytes": 2000,
                         "samples_per_s": None, "state_bytes": 64})
    run.add(recs)
    run.status, run.ended = "finished", 1010.0
    return run


def read_tensorboard(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_export_per_rank_and_mean(tmp_path):
    run = make_run()
    path = run.to_tensorboard(tmp_path / "tb")
    assert path == tmp_path / "tb" / run.run_id
    assert sorted(p.name for p in path.iterdir()) == ["mean", "rank0", "rank1"]
    for rank in (0, 1):
        acc = read_tensorboard(path / f"rank{rank}")
        loss = acc.Scalars("loss")
        assert [e.step for e in loss] == [0, 1, 2, 3, 4]
        assert [e.value for e in loss] == pytest.approx([1.0 / (s + 1) + rank for s in range(5)])
        assert loss[0].wall_time == pytest.approx(1000.0)
        # the automatic metrics too (samples_per_s was None: not written)
        tags = set(acc.Tags()["scalars"])
        assert {"step_time_s", "comm_time_s", "compute_time_s", "mem_bytes", "mem_peak_bytes", "state_bytes"} <= tags
        assert "samples_per_s" not in tags and set(AUTO_METRICS) >= tags - {"loss"}
    mean = read_tensorboard(path / "mean")
    assert [e.value for e in mean.Scalars("loss")] == pytest.approx([1.0 / (s + 1) + 0.5 for s in range(5)])
    assert [e.value for e in mean.Scalars("step_time_s")] == pytest.approx([0.15] * 5)
    # the run's parameters (HParams tab) and its code (Text tab)
    assert "_hparams_/session_start_info" in mean.summary_metadata
    assert "cell" in mean.Tags()["tensors"]
    assert b"jdist.log(loss=1.0)" in mean.Tensors("cell")[0].tensor_proto.string_val[0]
    # a mesh's communication per dimension and a pipeline stage's bubble (MESH_METRICS) go out as scalars too
    staged = Run("mesh", 2)
    staged.add([{"rank": r, "cell": 1, "seq": s, "step": s, "time": 1000.0 + s, "comm_time_s": 0.01,
                 "comm_time_tp_s": 0.004, "comm_time_pp_s": 0.003, "pp_stage": r, "bubble_frac": 0.25 + 0.1 * r}
                for s in range(3) for r in range(2)])
    staged_mean = read_tensorboard(staged.to_tensorboard(tmp_path / "tb-mesh") / "mean")
    assert {"comm_time_tp_s", "comm_time_pp_s", "bubble_frac"} <= set(staged_mean.Tags()["scalars"])
    assert [e.value for e in staged_mean.Scalars("bubble_frac")] == pytest.approx([0.3] * 3)


def test_tensorboard_export_never_imports_tensorflow(tmp_path):
    # tensorboard's own EventFileWriter opens its file through tensorboard.compat.tf, which imports TensorFlow
    # where it is installed (3.5 s in the kernel, and its log lines in the cell); jdist writes plain files
    pytest.importorskip("tensorflow")  # (make test installs it: otherwise nothing to check)
    code = ("import sys\nfrom jdist.metrics import Run\nrun = Run('r', 1)\n"
            "run.add([{'rank': 0, 'seq': 0, 'step': 0, 'time': 1.0, 'loss': 1.0}])\n"
            "run.to_tensorboard('tb')\nprint('tensorflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "False" and not out.stderr, out
    assert read_tensorboard(tmp_path / "tb" / "r" / "rank0").Scalars("loss")[0].value == 1.0


def test_mean_of_a_step_some_rank_never_logged_is_written_at_the_end(tmp_path):
    run = make_run(missing_last_on=1)
    mean = read_tensorboard(run.to_tensorboard(tmp_path) / "mean")
    loss = mean.Scalars("loss")
    assert [e.step for e in loss] == [0, 1, 2, 3, 4]
    assert loss[-1].value == pytest.approx(1.0 / 5)  # rank 0 alone


def test_means_release_a_step_once_every_rank_logged_it():
    m = Means(world_size=2)
    assert m.add({"rank": 0, "step": 0, "time": 1.0, "loss": 1.0, "mem_bytes": 5}) == []
    done = m.add({"rank": 1, "step": 0, "time": 2.0, "loss": 3.0, "mem_bytes": 7})
    assert sorted(done) == [("loss", 0, 2.0, 2.0), ("mem_bytes", 0, 6.0, 2.0)]
    assert m.add({"rank": 0, "step": 1, "time": 3.0, "loss": math.nan}) == []  # NaN is not written
    assert m.rest() == [] and m.pending == {}


def test_mlflow_export_to_a_sqlite_store(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = make_run()
    run_id = run.to_mlflow(uri, experiment="tests")
    client = MlflowClient(uri)
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == run.run_id
    assert got.data.params == {"run_id": run.run_id, "world_size": "2", "backend": "ddp", "device_kind": "cpu",
                               "total_steps": "5"}
    assert "jdist.log(loss=1.0)" in got.data.tags["mlflow.note.content"]
    history = client.get_metric_history(run_id, "loss")
    history.sort(key=lambda m: m.step)
    assert [m.step for m in history] == [0, 1, 2, 3, 4]
    assert [m.value for m in history] == pytest.approx([1.0 / (s + 1) + 0.5 for s in range(5)])
    rank1 = client.get_metric_history(run_id, "rank1/loss")
    assert sorted(m.value for m in rank1) == pytest.approx(sorted(1.0 / (s + 1) + 1 for s in range(5)))
    assert {"rank0/step_time_s", "rank1/mem_bytes", "comm_time_s", "state_bytes"} <= set(got.data.metrics)
    assert client.get_experiment(got.info.experiment_id).name == "tests"
    # a second export goes to the same experiment as a second MLflow run
    other = run.to_mlflow(uri, experiment="tests")
    assert other != run_id and len(client.search_runs([got.info.experiment_id])) == 2


def test_missing_extra_is_one_line_naming_it(tmp_path):
    code = ("import sys; sys.modules['tensorboard'] = None\n"
            "from jdist.metrics import Run\n"
            "try:\n    Run('r', 1).to_tensorboard('x')\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "TensorBoard export needs tensorboard: pip install 'jdist[tracking]'"
