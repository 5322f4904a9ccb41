"""The notebook dashboard (jdist.kernel.dashboard) and the panels it draws (jdist.metrics.panels),
with real ipywidgets/plotly objects, matplotlib, and a real kernel."""

from __future__ import annotations

import base64
import io
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from ipywidgets import Widget

from jdist.kernel.dashboard import Dashboard, render_png, static_bundle, static_figure
from jdist.metrics import Run
from jdist.metrics.panels import MAX_POINTS, PANELS, panels

REPO = Path(__file__).resolve().parents[1]
RANKS, STEPS = 2, 30
MIB = 2**20
BLUE, ORANGE, GREEN = "#1f77b4", "#ff7f0e", "#2ca02c"


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
        "state_bytes": (50 - 10 * rank) * MIB,
        "samples_per_s": 32.0 / (compute + comm),
    }


def make_run(steps: int = STEPS, **kw) -> Run:
    run = Run("test-run", world_size=RANKS, backend="gloo", **kw)
    run.add(
        {"rank": r, "seq": s, "step": s, "time": 1000.0 + s, **values(r, s)}
        for s in range(steps)
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


def band(d: Dashboard):
    mean = "mean over ranks"
    return d.trace("loss", mean, "low"), d.trace("loss", mean, "high"), d.trace("loss", mean)


def test_loss_band_and_mean(dash):
    lo, hi, avg = band(dash)
    per_step = [[values(r, s)["loss"] for r in range(RANKS)] for s in range(STEPS)]
    assert list(avg.x) == list(range(STEPS))
    assert list(avg.y) == pytest.approx([mean(v) for v in per_step])
    assert list(lo.y) == pytest.approx([min(v) for v in per_step])
    assert list(hi.y) == pytest.approx([max(v) for v in per_step])
    assert hi.fill == "tonexty" and lo.fill in (None, "none")
    assert dash.figure.layout.annotations[0].text == "loss"


def test_step_time_bars_per_rank(dash):
    compute, comm = dash.trace("time", "compute"), dash.trace("time", "communication")
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
    now, peak, state = (dash.trace("memory", name) for name in ("current", "peak", "model+optimizer"))
    assert list(state.y) == pytest.approx([50 - 10 * r for r in range(RANKS)])
    assert list(now.y) == pytest.approx([100 + 10 * r + STEPS - 1 for r in range(RANKS)])
    assert list(peak.y) == pytest.approx([200 + 20 * r + STEPS - 1 for r in range(RANKS)])
    assert dash.figure.layout.annotations[2].text == "host memory RSS (MiB)"


def test_memory_axis_on_gpu():
    d = Dashboard(make_run(device_kind="cuda"))
    d.update(force=True)
    assert d.figure.layout.annotations[2].text == "GPU memory (MiB)"
    d.finish()


def test_units_in_subplot_titles_not_on_y_axes(dash):
    layout = dash.figure.layout
    titles = [a.text for a in layout.annotations]
    assert titles == ["loss", "time per step (s), last 20 steps", "host memory RSS (MiB)", "throughput, samples/s (all ranks)"]
    # no y-axis title squeezed between the columns in a narrow window
    assert all(layout[f"yaxis{n}"].title.text is None for n in ("", 2, 3, 4))
    assert layout.xaxis2.domain[0] - layout.xaxis.domain[1] == pytest.approx(0.14)


def test_colours_match_the_png(dash):
    _, _, avg = band(dash)
    compute, comm = dash.trace("time", "compute"), dash.trace("time", "communication")
    mem, peak, state = (dash.trace("memory", name) for name in ("current", "peak", "model+optimizer"))
    tput = dash.trace("throughput", "throughput")
    assert (compute.marker.color, comm.marker.color) == (BLUE, ORANGE)
    assert (mem.marker.color, peak.marker.color, state.marker.color) == (BLUE, ORANGE, GREEN)
    assert avg.line.color == tput.line.color == BLUE
    from matplotlib.colors import to_hex

    ax_loss, ax_time, ax_mem, ax_tput = static_figure(dash.run).axes
    bars = [to_hex(b.get_facecolor()) for b in ax_time.patches]
    assert bars == [BLUE] * RANKS + [ORANGE] * RANKS
    assert [to_hex(b.get_facecolor()) for b in ax_mem.patches] == bars + [GREEN] * RANKS
    assert to_hex(ax_loss.lines[0].get_color()) == to_hex(ax_tput.lines[0].get_color()) == BLUE


def test_png_legends_leave_the_bars_free():
    fig = static_figure(make_run())
    fig.canvas.draw()
    for ax in fig.axes[1:3]:  # time per step, memory
        legend = ax.get_legend()
        box = legend.get_window_extent()
        assert ax.patches and not any(box.overlaps(bar.get_window_extent()) for bar in ax.patches)
        assert ax.margins()[1] == 0.25
        frame = ax.get_window_extent()
        assert abs((box.x0 + box.x1) / 2 - (frame.x0 + frame.x1) / 2) < 1  # upper center
        assert frame.y1 - box.y1 < 10
        assert len({round(t.get_window_extent().y0) for t in legend.get_texts()}) == 1  # both entries on one row


def test_throughput_is_sum_over_ranks(dash):
    tput = dash.trace("throughput", "throughput")
    # step 0 is left out: its step_time_s (and samples_per_s) covers the time since the cell started
    assert list(tput.x) == list(range(1, STEPS))
    assert list(tput.y) == pytest.approx([sum(values(r, s)["samples_per_s"] for r in range(RANKS)) for s in range(1, STEPS)])
    assert dash.figure.layout.annotations[3].text == "throughput, samples/s (all ranks)"


def test_throughput_leaves_out_each_ranks_first_record():
    run = Run("late", world_size=2)
    # the first record of each rank (seq 0) is slow: it includes the start-up of the cell
    run.add([{"rank": 0, "seq": 0, "step": 0, "samples_per_s": 1.0}])
    d = Dashboard(run)
    d.update(force=True)
    tput = d.trace("throughput", "throughput")
    assert list(tput.x) == [] and d.figure.layout.annotations[3].text.endswith("samples/s (all ranks)")
    run.add([{"rank": 0, "seq": 1, "step": 1, "samples_per_s": 100.0},
              {"rank": 1, "seq": 0, "step": 1, "samples_per_s": 2.0},  # rank 1 logs its first step later
              {"rank": 0, "seq": 2, "step": 2, "samples_per_s": 100.0},
              {"rank": 1, "seq": 1, "step": 2, "samples_per_s": 100.0}])
    d.update(force=True)
    assert (list(tput.x), list(tput.y)) == ([2], [200.0])
    d.finish()


def test_throughput_falls_back_to_steps_per_s():
    run = Run("no-batch", world_size=1)
    run.add({"rank": 0, "seq": i, "step": s, "step_time_s": 0.5} for i, s in enumerate([0, 2, 4]))
    d = Dashboard(run)
    d.update(force=True)
    tput = d.trace("throughput", "throughput")
    assert list(tput.x) == [2, 4]  # step 0 left out: its step time includes the cell's start-up
    assert list(tput.y) == pytest.approx([4.0, 4.0])  # 2 steps per 0.5 s
    assert d.figure.layout.annotations[3].text == "throughput, steps/s"
    d.finish()


def test_long_runs_are_thinned_in_the_live_figure_only():
    steps = 2500
    run = make_run(steps=steps)
    d = Dashboard(run)
    d.update(force=True)
    lo, hi, avg = band(d)
    tput = d.trace("throughput", "throughput")
    size = 3  # ceil(2500 / 1000) consecutive steps per point
    assert len(avg.x) == len(lo.y) == len(hi.y) == 834 <= MAX_POINTS
    assert (avg.x[0], avg.x[1], avg.x[-1]) == (2, 5, steps - 1)  # each bucket at its last step
    loss = [[values(r, s)["loss"] for r in range(RANKS)] for s in range(steps)]
    for k in (0, 400, 833):
        bucket = loss[k * size : (k + 1) * size]
        assert lo.y[k] == pytest.approx(min(min(v) for v in bucket))
        assert hi.y[k] == pytest.approx(max(max(v) for v in bucket))
        assert avg.y[k] == pytest.approx(statistics.fmean(statistics.fmean(v) for v in bucket))
    assert len(tput.x) == 833 and tput.x[0] == 3  # steps 1..2499
    first = [sum(values(r, s)["samples_per_s"] for r in range(RANKS)) for s in (1, 2, 3)]
    assert tput.y[0] == pytest.approx(statistics.fmean(first))
    # the PNG draws every step
    ax_loss, _, _, ax_tput = static_figure(run).axes
    assert len(ax_loss.lines[0].get_xdata()) == steps and len(ax_tput.lines[0].get_xdata()) == steps - 1
    d.finish()


def test_update_is_throttled():
    run = make_run()
    d = Dashboard(run, min_interval=60)
    assert d.update() is True
    run.add([{"rank": 0, "seq": STEPS, "step": STEPS, "loss": 0.0}])
    assert d.update() is False
    assert len(d.trace("loss", "mean over ranks").x) == STEPS  # not redrawn yet
    assert d.update(force=True) is True
    assert len(d.trace("loss", "mean over ranks").x) == STEPS + 1
    d.finish()


def test_progress_with_total_steps():
    run = make_run(total_steps=50)
    d = Dashboard(run)
    d.update(force=True)
    assert (d.progress_bar.value, d.progress_bar.max) == (30, 50)
    assert d.progress_bar.layout.display != "none"
    # the records' "time" advances 1 s per step: 20 steps to go (step_time_s, ~3 s, is not used)
    assert d.progress_text == "step 30 / 50, ETA 00:20"
    d.finish()


def test_eta_from_the_whole_run_not_the_last_steps():
    def t(rank: int, step: int) -> float:  # 1 s per step, the last 10 of 110 steps 5 s; rank 1 0.3 s behind
        return 1000.0 + step + 4 * max(0, step - 99) + 0.3 * rank

    run = Run("eta", world_size=RANKS, total_steps=200)
    run.add({"rank": r, "seq": s, "step": s, "time": t(r, s), "step_time_s": t(r, s) - t(r, s - 1)}
            for s in range(110) for r in range(RANKS))
    d = Dashboard(run)
    d.update(force=True)
    # from the first logged step (rank 0) to the latest (rank 1), over the 109 steps between
    eta = round(90 * (t(1, 109) - t(0, 0)) / 109)
    assert eta == 123  # the last 20 steps alone would say 90 * 3 s
    assert d.progress_text == "step 110 / 200, ETA 02:03"
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
    # nothing leaks, layouts and styles included
    assert all(w.comm is None for w in widget_tree(d.widget))
    assert d.figure.comm is None
    assert d.update(force=True) is False


def test_figure_follows_the_width_of_the_page(dash):
    assert dash.figure._config == {"responsive": True}
    # the invisible helper that resizes the figure to its box (plotly/plotly.py#5208), an ES
    # module file of the package that the widget sends to the browser
    helper = dash.widget.children[-1]
    assert helper is not dash.figure and dash.figure in dash.widget.children
    source = (REPO / "jdist" / "kernel" / "dashboard" / "fitwidth.js").read_text()
    assert helper._esm == source and "_responsiveChartHandler" in source


def test_each_dashboard_gets_its_own_figure():
    # plotly 7.1's widget view leaves listeners behind when its output is replaced: a reused
    # FigureWidget stayed blank in the browser. So each dashboard has its own, closed at the end.
    d1 = Dashboard(make_run())
    d1.finish()
    d2 = Dashboard(Run("next", world_size=1))
    assert d2.figure is not d1.figure and d1.figure.comm is None and d2.figure.comm is not None
    assert d2.figure._config == {"responsive": True}
    d2.finish()


def test_subplot_titles_are_small_enough_for_a_narrow_page(dash):
    assert {a.font.size for a in dash.figure.layout.annotations} == {12}


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
        "from jdist.kernel.dashboard import Dashboard\n"
        "assert not {'anywidget', 'ipywidgets', 'plotly', 'matplotlib'} & set(sys.modules)  # a cheap import\n"
        "run = Run('plain', 1)\n"
        "run.add([{'rank': 0, 'seq': 0, 'step': 0, 'loss': 1.0}])\n"
        "d = Dashboard(run); d.show(); d.update(); d.finish()\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("jdist run plain: running after ")
    assert out.stdout.count("\n") == 3  # the summary only


@pytest.mark.cluster  # a kernel
def test_in_a_real_kernel():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    v4 = nbformat.v4
    nb = v4.new_notebook(
        cells=[
            v4.new_code_cell(
                f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                "from jdist.metrics import Run\n"
                "from jdist.kernel.dashboard import Dashboard\n"
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
            v4.new_code_cell(
                "fig = dash.figure\n"
                "dash2 = Dashboard(Run('nb-run-2', world_size=1))\n"
                "dash2.show()\n"
                "assert dash2.figure is not fig and fig.comm is None and dash2.figure.comm is not None\n"
                "dash2.finish()"
            ),
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


def test_every_panel_is_drawn_by_every_view_from_one_definition():
    """A panel is data: the live figure and the PNG draw each panel of PANELS by its kind."""
    run = make_run()
    drawn = panels(run)
    assert [p["key"] for p in drawn] == ["loss", "time", "memory", "throughput"] and len(drawn) == len(PANELS)
    d = Dashboard(run)
    d.update(force=True)
    for panel in drawn:
        for s in panel["series"]:
            trace = d.trace(panel["key"], s["name"])
            colour = trace.marker.color if panel["kind"] == "bars" else trace.line.color
            assert colour == s["color"], (panel["key"], s["name"])
    assert [a.text for a in d.figure.layout.annotations] == [p["title"] for p in drawn]
    assert [ax.get_title() for ax in static_figure(run).axes] == [p["title"] for p in drawn]
    d.finish()


def test_a_new_panel_is_one_function(monkeypatch):
    """Adding a panel to PANELS is the whole change: both notebook views draw it."""
    import jdist.metrics.panels as pn
    from jdist.protocol import LinePanel, LineSeries

    def grad_norm(run):
        steps, mean, _, _ = run.aggregate("loss")
        return LinePanel(key="grad", kind="line", title="gradient norm", x_title="step",
                         series=[LineSeries(name="norm", color=GREEN, x=steps, y=mean, low=None, high=None)])

    monkeypatch.setattr(pn, "PANELS", (*pn.PANELS, grad_norm))
    run = make_run()
    d = Dashboard(run)
    d.update(force=True)
    assert list(d.trace("grad", "norm").y) == list(d.trace("loss", "mean over ranks").y)
    assert d.figure.layout.annotations[4].text == "gradient norm"
    fig = static_figure(run)
    assert len(fig.axes) == 5 and fig.axes[4].get_title() == "gradient norm"
    d.finish()
