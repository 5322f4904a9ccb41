"""Unit tests for jdist.metrics: records, aggregation, run log."""

from __future__ import annotations

import json
import math

import pytest

import pandas as pd

from jdist.metrics import AUTO_METRICS, Run, RunLog, RunReader, list_runs, read_run
from jdist.metrics.store import RecordBatch


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


def test_a_batch_of_several_ranks_drops_each_ranks_duplicates():
    # the kernel adds what arrived in one poll as one batch, whichever ranks sent it
    run = Run("r", 2)
    run.add([rec(0, 0, 0), rec(1, 0, 0), rec(0, 1, 1), rec(1, 1, 1)])
    new = run.add([rec(1, 1, 1), rec(0, 2, 2), rec(1, 3, 3), rec(0, 1, 1), rec(1, 2, 2)])
    assert [(r["rank"], r["seq"]) for r in new] == [(0, 2), (1, 3), (1, 2)]
    assert run.missing_seqs(1, 1, 6) == [4, 5] and run.missing_seqs(0, 1, 3) == [] and run.count() == 7


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


def test_a_pipeline_timeline_round_trips_through_the_run_log_and_a_released_run(tmp_path):
    run = Run("pipe", 2, started=1000.0)
    log = RunLog(run, tmp_path)
    log.append(run.add([rec(r, 0, 0, pp_stage=r, bubble_frac=0.25) for r in (0, 1)]))
    for r in (0, 1):
        message = {"v": 4, "kind": "pipeline", "cell": 1, "rank": r,
                   "rows": [[0, r, r, mb, action, 1000.0 + r + mb, 1000.5 + r + mb] for action in "FB" for mb in (0, 1)]}
        run.add_pipeline(message)
        log.append_pipeline(message)
    run.status = "finished"
    log.close()
    expected = run.pipeline
    assert list(expected.columns) == ["step", "rank", "stage", "microbatch", "action", "start_s", "end_s"]
    assert expected.groupby(["stage", "action"]).size().to_dict() == {(0, "B"): 2, (0, "F"): 2, (1, "B"): 2, (1, "F"): 2}
    assert expected["start_s"].min() == 0.0 and "bubble_frac" in run.history and run.metric_names == []
    assert read_run(tmp_path / "pipe").pipeline.equals(expected)
    assert run.release() and run.pipeline.equals(expected)  # back from the folder


def test_read_run_skips_a_frame_still_being_written(tmp_path):
    run = Run("r2", 1)
    log = RunLog(run, tmp_path)
    log.append([rec(0, 0, 0, loss=1.0)])
    frame = RecordBatch.from_records([rec(0, 1, 1, loss=0.5)]).encode()
    reader = RunReader(tmp_path / "r2")
    with open(tmp_path / "r2" / "metrics.jdc", "ab") as fh:
        for cut in (3, 9, len(frame) - 1):  # a writer mid-frame: in the header's length, the header, a column
            fh.write(frame[:cut])
            fh.flush()
            assert reader.update().count() == 1
            fh.truncate(fh.tell() - cut)
            fh.seek(0, 2)
        fh.write(frame)
    assert reader.update().aggregate("loss") == ([0, 1], [1.0, 0.5], [1.0, 0.5], [1.0, 0.5])
    log.close()


def test_runs_of_earlier_versions_and_other_launchers_are_read_from_json_lines(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps(Run("old", 2, status="finished").meta()))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(rec(r, 0, 0, loss=1.0 + r)) + "\n" for r in (0, 1))
                                          + '{"rank": 0, "se')
    run = read_run(folder)
    assert run.status == "finished" and run.aggregate("loss") == ([0], [1.5], [1.0], [2.0])


def test_history_round_trips_through_the_run_log_with_its_types(tmp_path):
    run = Run("typed", 2)
    log = RunLog(run, tmp_path)
    log.append(run.add([rec(r, s, s, loss=0.1 * s + r, mem_bytes=2**30 + s, note="warm" if s == 0 else None)
                        for s in range(3) for r in (0, 1)]))
    log.append(run.add([rec(0, 3, None, loss=9.0)]))  # without a step: kept beside the grid
    log.close()
    back = read_run(tmp_path / "typed")
    pd.testing.assert_frame_equal(back.history, run.history)
    h = run.history
    assert h["step"].dtype == "float64" and h["mem_bytes"].dtype == "float64"  # a row without a step
    assert h["note"].tolist()[:3] == ["warm", None, None] and h.query("step != step")["loss"].tolist() == [9.0]
    assert read_run(tmp_path / "typed").history.query("step == step")["mem_bytes"].tolist() == [
        2**30, 2**30 + 1, 2**30 + 2, 2**30, 2**30 + 1, 2**30 + 2]


def test_a_rank_logging_a_step_twice_gives_one_row_with_the_latest_values():
    run = Run("twice", 1)
    run.add([rec(0, 0, 5, loss=1.0, step_time_s=0.5), rec(0, 1, 5, val_loss=2.0, step_time_s=0.01)])
    run.add([rec(0, 2, 5, loss=3.0)])
    h = run.history
    assert len(h) == 1 and h[["loss", "val_loss", "step_time_s"]].values.tolist() == [[3.0, 2.0, 0.01]]
    assert run.count() == 3


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
