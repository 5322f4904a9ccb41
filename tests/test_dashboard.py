"""Tests for jdist.dashboard with real ipywidgets/plotly objects and a real kernel."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from ipywidgets import Widget

from jdist.dashboard import Dashboard, render_png, static_bundle
from jdist.metrics import Run

REPO = Path(__file__).resolve().parents[1]
RANKS, STEPS = 2, 30
MIB = 2**20


def values(rank: int, step: int) -> dict[str, float]:
    """The synthetic metrics of one (rank, step); rank 1 is a straggler with more comm time."""
    compute = 2.0 + 0.01 * step + 0.5 * rank
    comm = 0.3 + 0.1 * rank + 0.002 * step
    return {
        "loss": 3.0 / (step + 1) + 0.1 * rank + 0.01 * (step % 3),
        "step_time_s": compute + comm,
        "comm_time_s": comm,
        "compute_time_s": compute,
        "mem_bytes": (100 + 10 * rank + step) * MIB,
        "mem_peak_bytes": (200 + 20 * rank + step) * MIB,
        "samples_per_s": 32.0 / (compute + comm),
    }


def make_run(**kw) -> Run:
    run = Run("test-run", world_size=RANKS, backend="gloo", **kw)
    run.add(
        {"rank": r, "seq": s, "step": s, "time": 1000.0 + s, **values(r, s)}
        for s in range(STEPS)
        for r in range(RANKS)
    )
    return run


def mean(xs):
    return sum(xs) / len(xs)


def widget_tree(w: Widget) -> list[Widget]:
    """``w``, its children, and their ipywidgets layouts and styles (not plotly's layout)."""
    found = [w]
    for part in (getattr(w, "layout", None), getattr(w, "style", None)):
        if isinstance(part, Widget):
            found.append(part)
    for child in getattr(w, "children", ()):
        found += widget_tree(child)
    return found


@pytest.fixture
def dash():
    d = Dashboard(make_run())
    assert d.update(force=True)
    yield d
    d.finish()


def test_loss_band_and_mean(dash):
    lo, hi, avg = dash.figure.data[:3]
    per_step = [[values(r, s)["loss"] for r in range(RANKS)] for s in range(STEPS)]
    assert list(avg.x) == list(range(STEPS))
    assert list(avg.y) == pytest.approx([mean(v) for v in per_step])
    assert list(lo.y) == pytest.approx([min(v) for v in per_step])
    assert list(hi.y) == pytest.approx([max(v) for v in per_step])
    assert hi.fill == "tonexty" and lo.fill in (None, "none")
    assert dash.figure.layout.annotations[0].text == "loss"


def test_step_time_bars_per_rank(dash):
    compute, comm = dash.figure.data[3:5]
    assert list(compute.x) == ["rank 0", "rank 1"]
    last = range(STEPS - 20, STEPS)
    by_hand_compute = [mean([values(r, s)["compute_time_s"] for s in last]) for r in range(RANKS)]
    by_hand_comm = [mean([values(r, s)["comm_time_s"] for s in last]) for r in range(RANKS)]
    assert list(compute.y) == pytest.approx(by_hand_compute)
    assert list(comm.y) == pytest.approx(by_hand_comm)
    run = dash.run
    assert list(compute.y) == pytest.approx([run.per_rank_mean("compute_time_s", last=20)[r] for r in range(RANKS)])
    # communication is drawn on top of compute: a stacked bar per rank
    assert list(comm.base) == pytest.approx(by_hand_compute)
    assert compute.y[1] + comm.y[1] > compute.y[0] + comm.y[0] + 0.5  # the straggler stands out


def test_memory_bars_in_mib(dash):
    now, peak = dash.figure.data[5:7]
    assert list(now.y) == pytest.approx([100 + 10 * r + STEPS - 1 for r in range(RANKS)])
    assert list(peak.y) == pytest.approx([200 + 20 * r + STEPS - 1 for r in range(RANKS)])
    assert dash.figure.layout.yaxis3.title.text == "host memory RSS (MiB)"


def test_memory_axis_on_gpu():
    d = Dashboard(make_run(device_kind="cuda"))
    d.update(force=True)
    assert d.figure.layout.yaxis3.title.text == "GPU memory (MiB)"
    d.finish()


def test_throughput_is_sum_over_ranks(dash):
    tput = dash.figure.data[7]
    assert list(tput.x) == list(range(STEPS))
    assert list(tput.y) == pytest.approx([sum(values(r, s)["samples_per_s"] for r in range(RANKS)) for s in range(STEPS)])
    assert dash.figure.layout.yaxis4.title.text == "samples/s (all ranks)"


def test_throughput_falls_back_to_steps_per_s():
    run = Run("no-batch", world_size=1)
    run.add({"rank": 0, "seq": i, "step": s, "step_time_s": 0.5} for i, s in enumerate([0, 2, 4]))
    d = Dashboard(run)
    d.update(force=True)
    tput = d.figure.data[7]
    assert list(tput.y) == pytest.approx([2.0, 4.0, 4.0])  # 1 step, then 2 steps per 0.5 s
    assert d.figure.layout.yaxis4.title.text == "steps/s"
    d.finish()


def test_update_is_throttled():
    run = make_run()
    d = Dashboard(run, min_interval=60)
    assert d.update() is True
    run.add([{"rank": 0, "seq": STEPS, "step": STEPS, "loss": 0.0}])
    assert d.update() is False
    assert len(d.figure.data[2].x) == STEPS  # not redrawn yet
    assert d.update(force=True) is True
    assert len(d.figure.data[2].x) == STEPS + 1
    d.finish()


def test_progress_with_total_steps():
    run = make_run(total_steps=50)
    d = Dashboard(run)
    d.update(force=True)
    assert (d.progress_bar.value, d.progress_bar.max) == (30, 50)
    assert d.progress_bar.layout.display != "none"
    # mean step time (mean over ranks) over the last 20 logged steps, 20 steps to go
    per_step = mean([mean([values(r, s)["step_time_s"] for r in range(RANKS)]) for s in range(STEPS - 19, STEPS)])
    eta = round(20 * per_step)
    assert d.progress_text == f"step 30 / 50, ETA {eta // 60:02d}:{eta % 60:02d}"
    assert eta > 50
    d.finish()


def test_progress_without_total_steps(dash):
    assert dash.progress_bar.layout.display == "none"
    assert dash.progress_text.startswith("30 steps, elapsed ")


def test_header_shows_run_and_status(dash):
    header = dash.widget.children[0].value
    assert "test-run" in header and "2 ranks" in header and "gloo" in header and "running" in header


def test_static_bundle_has_text_and_png():
    run = make_run()
    run.status, run.ended = "done", run.started + 12.0
    bundle = static_bundle(run)
    assert bundle["text/plain"] == run.summary()
    assert "done after 12.0 s" in bundle["text/plain"]
    png = bundle["image/png"]
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    from matplotlib.image import imread

    height, width, _ = imread(io.BytesIO(png)).shape
    assert (width, height) == (1000, 620)
    assert set(bundle) == {"text/plain", "image/png"}  # the PNG is stored once
    assert render_png(run).startswith(b"\x89PNG")


def test_finish_outside_kernel_prints_summary_and_closes(capsys):
    run = make_run()
    d = Dashboard(run)
    d.show()
    assert capsys.readouterr().out == ""  # no kernel: nothing live is displayed
    d.finish()
    assert capsys.readouterr().out == run.summary() + "\n"
    assert all(w.comm is None for w in widget_tree(d.widget))  # nothing leaks, layouts and styles included
    assert d.update(force=True) is False


def test_calls_from_other_threads_raise():
    d = Dashboard(make_run())
    errors = []

    def worker():
        try:
            d.update(force=True)
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert len(errors) == 1
    d.finish()


def test_plain_python_is_quiet_and_leaves_pyplot_alone():
    code = (
        "import sys\n"
        "from jdist.metrics import Run\n"
        "from jdist.dashboard import Dashboard\n"
        "run = Run('plain', 1)\n"
        "run.add([{'rank': 0, 'seq': 0, 'step': 0, 'loss': 1.0}])\n"
        "d = Dashboard(run); d.show(); d.update(); d.finish()\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("jdist run plain: running after ")
    assert out.stdout.count("\n") == 3  # the summary only


def test_in_a_real_kernel():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    v4 = nbformat.v4
    nb = v4.new_notebook(
        cells=[
            v4.new_code_cell(
                f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                "from jdist.metrics import Run\n"
                "from jdist.dashboard import Dashboard\n"
                "run = Run('nb-run', world_size=2, total_steps=10)\n"
                "dash = Dashboard(run)"
            ),
            v4.new_code_cell(
                "dash.show()\n"
                "for s in range(5):\n"
                "    run.add([{'rank': r, 'seq': s, 'step': s, 'loss': 1.0 / (s + 1), 'step_time_s': 0.1,\n"
                "              'comm_time_s': 0.02, 'compute_time_s': 0.08, 'mem_bytes': 2**20,\n"
                "              'mem_peak_bytes': 2**21, 'samples_per_s': 320.0} for r in range(2)])\n"
                "    dash.update(force=True)"
            ),
            v4.new_code_cell("run.status = 'done'\ndash.finish()"),
        ]
    )
    live_outputs = {}

    def on_cell_executed(cell, cell_index, execute_reply):
        live_outputs[cell_index] = [dict(o.get("data", {})) for o in cell.outputs]

    client = nbclient.NotebookClient(
        nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.on_cell_executed = on_cell_executed
    client.execute()

    # the live view was a widget ...
    assert "application/vnd.jupyter.widget-view+json" in live_outputs[1][0]
    # ... replaced in place by the static summary, with no new output in the finish cell
    (final,) = nb.cells[1].outputs
    assert final.output_type == "display_data"
    assert "application/vnd.jupyter.widget-view+json" not in final.data
    assert base64.b64decode(final.data["image/png"]).startswith(b"\x89PNG")
    assert final.data["text/plain"].startswith("jdist run nb-run: done after ")
    assert "text/html" not in final.data
    # the finish cell only printed the summary text
    (printed,) = nb.cells[2].outputs
    assert printed.output_type == "stream" and printed.text.startswith("jdist run nb-run: done after ")
    for cell in nb.cells:
        assert all(o.output_type != "error" for o in cell.outputs)
