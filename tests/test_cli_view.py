"""The terminal view of jdist run and jdist watch (jdist.cli.view), on synthetic runs."""

from __future__ import annotations

import io

from rich.console import Console

from jdist.cli.view import LiveView, PlainView, rank_rows, status_line
from jdist.metrics import Run


def four_ranks(hosts: dict[int, str] | None = None) -> Run:
    run = Run("r", 4, backend="ddp", total_steps=100, hosts=hosts or {})
    run.add([{"rank": r, "seq": s, "step": s, "loss": 1.0 / (s + 1) + 0.01 * r, "time": 100.0 + 0.1 * s,
              "step_time_s": 0.1 * (1.5 if r == 3 else 1.0), "comm_time_s": 0.02, "mem_bytes": 2**30 * (r + 1)}
             for s in range(10) for r in range(4)])
    return run


def test_the_status_line_names_the_slowest_rank_and_the_eta():
    line = status_line(four_ranks())
    assert line.startswith("step 10/100 (10%) loss 0.115 (0.1..0.13)")
    assert "112.5 ms/step" in line and "slowest r3 (+50%)" in line and "ETA 9 s" in line  # +50% over the median
    assert [row["slowest"] for row in rank_rows(four_ranks())] == [False, False, False, True]


def test_a_named_straggler_is_the_one_marked_with_its_cause():
    # in synchronous training the straggler's step is no longer than the others': its own work is
    from jdist.metrics.stragglers import Straggler

    run = four_ranks()
    run.stragglers.append(Straggler(rank=1, score=1.8, windows=2, window_s=10.0, data_share=0.5,
                                    others_data_share=0.0, compute_share=0.3, others_compute_share=0.3,
                                    others_comm_share=0.5))
    assert "straggler r1 (data)" in status_line(run) and "slowest" not in status_line(run)
    rows = rank_rows(run)
    assert [row["slowest"] for row in rows] == [False, True, False, False] and rows[1]["straggler"] == "data"


def test_plain_lines_come_every_period_and_only_with_new_records():
    out = io.StringIO()
    view = PlainView(out, every_s=0.0)
    run = four_ranks()
    view.start(run)
    view.tick()
    assert out.getvalue() == ""  # nothing new yet
    view.add(run.records[-4:])
    view.tick()
    view.tick()
    assert out.getvalue().count("[jdist] step 10/100") == 1


def test_the_live_panel_has_a_row_per_rank_with_its_host_on_several_hosts():
    view = LiveView("jdist run train.py")
    view.run = four_ranks({0: "gpu1", 1: "gpu1", 2: "gpu2", 3: "gpu2"})
    console = Console(file=io.StringIO(), width=120, record=True)
    console.print(view.render())
    text = console.export_text()
    assert "jdist run train.py" in text and "run r  4 rank(s), ddp" in text
    assert "host" in text and "gpu2" in text and "4.0 GiB" in text
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [row[:3] for row in rows] == [["0", "gpu1", "9"], ["1", "gpu1", "9"], ["2", "gpu2", "9"], ["3", "gpu2", "9"]]


def test_a_pipeline_on_a_mesh_shows_each_dimension_the_stage_and_the_bubble():
    run = Run("p", 2, backend="ddp")
    run.add([{"rank": r, "seq": s, "step": s, "time": 100.0 + s, "step_time_s": 0.1, "comm_time_s": 0.03,
              "comm_time_pp_s": 0.02, "comm_time_dp_s": 0.01 * (r + 1), "pp_stage": r, "bubble_frac": 0.3 + 0.1 * r}
             for s in range(5) for r in range(2)])
    assert "bubble 0.35" in status_line(run)
    view = LiveView("jdist run pipe.py")
    view.run = run
    console = Console(file=io.StringIO(), width=140, record=True)
    console.print(view.render())
    text = console.export_text()
    header = next(line.split() for line in text.splitlines() if line.strip().startswith("rank"))
    assert header == ["rank", "step", "loss", "ms/step", "comm", "pp", "ms", "dp", "ms", "stage", "bubble", "memory"]
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [row[3:] for row in rows] == [["30%", "20.0", "10.0", "0", "0.30"], ["30%", "20.0", "20.0", "1", "0.40"]], text
