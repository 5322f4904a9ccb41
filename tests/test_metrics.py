"""Unit tests for jdist.metrics: records, aggregation, run log."""

from __future__ import annotations

import json
import math

import pytest

from jdist.metrics import AUTO_METRICS, Run, RunLog, list_runs, missing_seqs, read_run


def rec(rank, seq, step, **kw):
    return {"rank": rank, "cell": 1, "seq": seq, "step": step, "time": 1000.0 + seq, **kw}


def test_add_drops_duplicates_and_returns_new():
    run = Run("r", 2)
    assert len(run.add([rec(0, 0, 0, loss=1.0), rec(1, 0, 0, loss=2.0)])) == 2
    assert run.add([rec(0, 0, 0, loss=1.0)]) == []
    assert run.count() == 2 and run.count(0) == 1


def test_add_drops_duplicates_arriving_out_of_order():
    # live batches lost and fetched at the cell's end arrive after later records, some twice
    run = Run("r", 1)
    assert [r["seq"] for r in run.add([rec(0, s, s) for s in (0, 1, 4, 5)])] == [0, 1, 4, 5]
    assert [r["seq"] for r in run.add([rec(0, s, s) for s in (2, 3, 4, 5, 1)])] == [2, 3]
    assert [r["seq"] for r in run.add([rec(0, s, s) for s in (6, 3, 6)])] == [6]
    assert run.add([{**rec(0, 0, 0), "cell": 2}]) != []  # another cell numbers from 0 again
    assert run.count() == 8


def test_aggregate_mean_min_max_per_step():
    run = Run("r", 3)
    run.add([rec(r, s, s, loss=float(r + 10 * s)) for r in range(3) for s in range(4)])
    steps, mean, lo, hi = run.aggregate("loss")
    assert steps == [0, 1, 2, 3]
    assert mean == [1.0, 11.0, 21.0, 31.0]
    assert lo == [0.0, 10.0, 20.0, 30.0] and hi == [2.0, 12.0, 22.0, 32.0]


def test_aggregate_ignores_nan_and_none_steps():
    run = Run("r", 2)
    run.add([rec(0, 0, 0, loss=math.nan), rec(1, 0, 0, loss=4.0), rec(0, 1, None, loss=9.0)])
    assert run.aggregate("loss") == ([0], [4.0], [4.0], [4.0])


def test_per_rank_mean_last_n():
    run = Run("r", 2)
    run.add([rec(0, s, s, step_time_s=float(s)) for s in range(10)])
    assert run.per_rank_mean("step_time_s") == {0: 4.5}
    assert run.per_rank_mean("step_time_s", last=2) == {0: 8.5}


def test_history_has_rank_step_scalars_and_auto_metrics():
    run = Run("r", 2)
    run.add([rec(1, 0, 0, loss=2.0, acc=0.5, step_time_s=0.1), rec(0, 0, 0, loss=1.0, step_time_s=0.2)])
    df = run.history
    assert list(df.columns[:5]) == ["rank", "step", "time", "loss", "acc"]
    assert set(AUTO_METRICS) <= set(df.columns)
    assert df["rank"].tolist() == [0, 1]  # sorted by rank, step
    assert df["loss"].tolist() == [1.0, 2.0]
    assert "seq" not in df.columns


def test_metric_names_excludes_auto_metrics():
    run = Run("r", 1)
    run.add([rec(0, 0, 0, loss=1.0, comm_time_s=0.0, lr=0.1)])
    assert run.metric_names == ["loss", "lr"]


def test_missing_seqs():
    assert missing_seqs([0, 2, 5], 6) == [1, 3, 4]
    assert missing_seqs(range(3), 3) == []


def test_run_log_round_trip(tmp_path):
    run = Run("20260101-000000-abc", 2, backend="ddp", code="x = 1")
    log = RunLog(run, tmp_path)
    log.append(run.add([rec(0, 0, 0, loss=1.0), rec(1, 0, 0, loss=3.0)]))
    meta = json.loads((tmp_path / run.run_id / "meta.json").read_text())
    assert meta["status"] == "running" and meta["backend"] == "ddp"
    run.status = "finished"
    log.close()
    back = read_run(tmp_path / run.run_id)
    assert back.status == "finished" and back.code == "x = 1"
    assert back.aggregate("loss") == ([0], [2.0], [1.0], [3.0])
    assert list_runs(tmp_path) == [tmp_path / run.run_id]


def test_read_run_skips_a_line_still_being_written(tmp_path):
    run = Run("r2", 1)
    log = RunLog(run, tmp_path)
    log.append([rec(0, 0, 0, loss=1.0)])
    with open(tmp_path / "r2" / "metrics.jsonl", "a") as fh:
        fh.write('{"rank": 0, "se')  # a writer mid-line
    assert read_run(tmp_path / "r2").count() == 1
    log.close()


def test_summary_mentions_metrics_and_status():
    run = Run("r", 2, backend="ddp")
    run.add([rec(r, 0, 0, loss=1.0 + r, step_time_s=0.01, comm_time_s=0.002, mem_peak_bytes=2**21) for r in range(2)])
    run.status = "finished"
    text = run.summary()
    assert "finished" in text and "loss: 1.5" in text and "r1 10.0 ms (comm 2.0)" in text and "host RSS" in text


def test_default_run_dir_env(monkeypatch, tmp_path):
    from jdist.metrics import default_run_dir

    monkeypatch.setenv("JDIST_RUN_DIR", str(tmp_path))
    assert default_run_dir() == tmp_path
    monkeypatch.delenv("JDIST_RUN_DIR")
    assert default_run_dir().parts[-2:] == ("jdist", "runs")


@pytest.mark.parametrize("key", ["rank", "step_time_s", "seq"])
def test_reserved_names_cover_record_keys(key):
    from jdist.metrics import reserved

    assert key in reserved()


def test_step_time_means_leave_out_each_ranks_first_step():
    """The first step_time_s of a cell counts from the cell's start (set-up code included)."""
    run = Run("r", 2)
    run.add([rec(r, s, s, step_time_s=5.0 if s == 0 else 0.1, comm_time_s=0.01, state_bytes=2**20 * (r + 1))
             for r in range(2) for s in range(5)])
    assert run.per_rank_mean("step_time_s") == {0: pytest.approx(1.08), 1: pytest.approx(1.08)}
    assert run.per_rank_mean("step_time_s", skip_first=True) == {0: pytest.approx(0.1), 1: pytest.approx(0.1)}
    summary = run.summary()
    assert "r0 100.0 ms (comm 10.0)" in summary
    assert "model + optimizer state: r0 1.0 MiB, r1 2.0 MiB" in summary
