"""The notebook dashboard (jdist.kernel.dashboard) and the panels it draws (jdist.metrics.panels),
with real ipywidgets/anywidget objects and a real kernel (the browser side: tests/test_browser.py)."""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from array import array
from pathlib import Path

import numpy as np
import pytest

from jdist.kernel.dashboard import Dashboard, charts_lib, render_svg, static_bundle
from jdist.kernel.dashboard import widget
from jdist.metrics import Run
from jdist.metrics.panels import MAX_POINTS, PANELS, panels

REPO = Path(__file__).resolve().parents[1]
RANKS, STEPS = 2, 30
MIB = 2**20
BLUE, ORANGE, GREEN = "#1f77b4", "#ff7f0e", "#2ca02c"
SVG = "{http://www.w3.org/2000/svg}"


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


def panel(run_or_dash, key: str) -> dict:
    """A panel of the run as the full data (what the static summary and the sidebar draw)."""
    run = run_or_dash.run if isinstance(run_or_dash, Dashboard) else run_or_dash
    return next(p for p in panels(run) if p["key"] == key)


def whole(dash: Dashboard, key: str) -> dict:
    """A panel the live widget received whole (the bar panels)."""
    return next(p for p in dash.widget.whole if p["key"] == key)


def svg_panels(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {g.get("data-panel"): g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"}


class Sent:
    """The custom messages a dashboard widget sends (the widget's real ``send``, recorded)."""

    def __init__(self, dash: Dashboard, monkeypatch) -> None:
        self.messages: list[tuple[dict, list[bytes]]] = []
        real = dash.widget.send

        def send(content, buffers=None):
            self.messages.append((content, list(buffers or [])))
            return real(content, buffers)

        monkeypatch.setattr(dash.widget, "send", send)

    def columns(self, key: str) -> dict[str, list[float]]:
        """The points of one line panel decoded from the messages, as labextension/src/notebook.ts does."""
        out: dict[str, list[float]] = {"x": [], "y": [], "low": [], "high": []}
        for content, buffers in self.messages:
            b = 0
            for line in content["lines"]:
                names = ["x", "y"] + (["low", "high"] if line["band"] else [])
                cols = {}
                for name in names:
                    cols[name] = list(array("d", buffers[b]))
                    assert len(cols[name]) == line["n"]
                    b += 1
                if line["panel"] != key:
                    continue
                if line["reset"]:
                    out = {k: [] for k in out}
                for name in names:
                    out[name] += cols[name]
        return out


@pytest.fixture
def dash():
    d = Dashboard(make_run())
    assert d.update(force=True)
    yield d
    d.finish()


def test_loss_band_and_mean(dash):
    per_step = [[values(r, s)["loss"] for r in range(RANKS)] for s in range(STEPS)]
    pts = dash.points("loss")
    assert pts["x"] == list(range(STEPS))
    assert pts["y"] == pytest.approx([mean(v) for v in per_step])
    assert pts["low"] == pytest.approx([min(v) for v in per_step])
    assert pts["high"] == pytest.approx([max(v) for v in per_step])
    s = panel(dash, "loss")["series"][0]
    assert (s["x"], s["y"], s["low"], s["high"]) == (pts["x"], pts["y"], pts["low"], pts["high"])
    assert dash.widget.layout[0]["title"] == "loss" and dash.widget.layout[0]["series"][0]["x"] == []


def test_step_time_bars_per_rank(dash):
    time_panel = whole(dash, "time")
    assert time_panel == panel(dash, "time")
    compute, comm = time_panel["series"]
    assert time_panel["categories"] == ["rank 0", "rank 1"] and time_panel["stacked"]
    last = range(STEPS - 20, STEPS)
    by_hand = [mean([values(r, s)["compute_time_s"] for s in last]) for r in range(RANKS)]
    assert compute["values"] == pytest.approx(by_hand)
    assert comm["values"] == pytest.approx([mean([values(r, s)["comm_time_s"] for s in last]) for r in range(RANKS)])
    run = dash.run
    assert compute["values"] == pytest.approx([run.per_rank_mean("compute_time_s", last=20)[r] for r in range(RANKS)])
    assert compute["values"][1] + comm["values"][1] > compute["values"][0] + comm["values"][0] + 0.5  # the straggler


def test_per_rank_mean_of_the_last_steps_skips_each_ranks_first_step():
    run = make_run(steps=5)
    assert run.per_rank_mean("comm_time_s", skip_first=True)[1] == pytest.approx(
        mean([values(1, s)["comm_time_s"] for s in range(1, 5)]))
    last_two = mean([values(0, s)["comm_time_s"] for s in (3, 4)])
    assert run.per_rank_mean("comm_time_s", last=2)[0] == pytest.approx(last_two)


def test_memory_bars_in_mib(dash):
    now, peak, state = whole(dash, "memory")["series"]
    assert state["values"] == pytest.approx([50 - 10 * r for r in range(RANKS)]) and state["labels"]
    assert now["values"] == pytest.approx([100 + 10 * r + STEPS - 1 for r in range(RANKS)])
    assert peak["values"] == pytest.approx([200 + 20 * r + STEPS - 1 for r in range(RANKS)])
    assert whole(dash, "memory")["title"] == "host memory RSS (MiB)"


def test_memory_axis_on_gpu():
    d = Dashboard(make_run(device_kind="cuda"))
    d.update(force=True)
    assert whole(d, "memory")["title"] == "GPU memory (MiB)"
    d.finish()


def test_titles_carry_the_units(dash):
    titles = [p["title"] for p in dash.widget.layout]
    assert titles == ["loss", "time per step (s), last 20 steps", "host memory RSS (MiB)",
                      "throughput, samples/s (all ranks)", "training state per rank (MiB)"]


def test_colours_are_the_same_in_every_view(dash):
    layout = {p["key"]: [s["color"] for s in p["series"]] for p in dash.widget.layout}
    assert layout == {"loss": [BLUE], "time": [BLUE, ORANGE], "memory": [BLUE, ORANGE, GREEN],
                      "throughput": [BLUE], "state": [BLUE, ORANGE, GREEN]}
    drawn = svg_panels(render_svg(dash.run))
    fills = [r.get("fill") for r in drawn["time"].iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert fills == [BLUE, ORANGE] * RANKS  # per rank: compute, then communication on top
    fills = [r.get("fill") for r in drawn["memory"].iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert fills == [BLUE, ORANGE, GREEN] * RANKS
    for key in ("loss", "throughput"):
        (line,) = [p for p in drawn[key].iter(f"{SVG}path") if p.get("class") == "line"]
        assert line.get("stroke") == BLUE


def test_static_legends_sit_above_the_plot_area():
    drawn = svg_panels(render_svg(make_run()))
    for key in ("time", "memory"):
        texts = [t for t in drawn[key].iter(f"{SVG}text") if t.get("class") == "legend"]
        bars = [r for r in drawn[key].iter(f"{SVG}rect") if r.get("class") == "bar"]
        assert texts and bars
        assert max(float(t.get("y")) for t in texts) < min(float(b.get("y")) for b in bars)


def test_throughput_is_sum_over_ranks(dash):
    pts = dash.points("throughput")
    # step 0 is left out: its step_time_s (and samples_per_s) covers the time since the cell started
    assert pts["x"] == list(range(1, STEPS))
    totals = [sum(values(r, s)["samples_per_s"] for r in range(RANKS)) for s in range(1, STEPS)]
    assert pts["y"] == pytest.approx(totals)
    assert dash.widget.layout[3]["title"] == "throughput, samples/s (all ranks)"


def test_throughput_leaves_out_each_ranks_first_record():
    run = Run("late", world_size=2)
    # the first record of each rank (seq 0) is slow: it includes the start-up of the cell
    run.add([{"rank": 0, "seq": 0, "step": 0, "samples_per_s": 1.0}])
    d = Dashboard(run)
    d.update(force=True)
    assert d.points("throughput")["x"] == [] and d.widget.layout[3]["title"].endswith("samples/s (all ranks)")
    run.add([{"rank": 0, "seq": 1, "step": 1, "samples_per_s": 100.0},
             {"rank": 1, "seq": 0, "step": 1, "samples_per_s": 2.0},  # rank 1 logs its first step later
             {"rank": 0, "seq": 2, "step": 2, "samples_per_s": 100.0},
             {"rank": 1, "seq": 1, "step": 2, "samples_per_s": 100.0}])
    d.update(force=True)
    pts = d.points("throughput")
    assert (pts["x"], pts["y"]) == ([2], [200.0])
    s = panel(run, "throughput")["series"][0]
    assert (s["x"], s["y"]) == ([2], [200.0])
    d.finish()


def test_throughput_falls_back_to_steps_per_s():
    run = Run("no-batch", world_size=1)
    run.add({"rank": 0, "seq": i, "step": s, "step_time_s": 0.5} for i, s in enumerate([0, 2, 4]))
    d = Dashboard(run)
    d.update(force=True)
    pts = d.points("throughput")
    assert pts["x"] == [2, 4]  # step 0 left out: its step time includes the cell's start-up
    assert pts["y"] == pytest.approx([4.0, 4.0])  # 2 steps per 0.5 s
    assert d.widget.layout[3]["title"] == "throughput, steps/s"
    d.finish()


def test_the_browser_gets_each_point_once_in_float64_buffers(monkeypatch):
    run = make_run(steps=10)
    d = Dashboard(run)
    sent = Sent(d, monkeypatch)
    d.update(force=True)
    run.add({"rank": r, "seq": s, "step": s, "time": 1000.0 + s, **values(r, s)}
            for s in range(10, 25) for r in range(RANKS))
    d.update(force=True)
    d.update(force=True)  # nothing new: no message
    assert [m["seq"] for m, _ in sent.messages] == [0, 1]
    assert [[(line["panel"], line["n"]) for line in m["lines"]] for m, _ in sent.messages] == [
        [("loss", 10), ("throughput", 9)], [("loss", 15), ("throughput", 15)]]
    assert all(not line["reset"] for line in sent.messages[1][0]["lines"])
    cols = sent.columns("loss")
    s = panel(run, "loss")["series"][0]
    assert (cols["x"], cols["y"], cols["low"], cols["high"]) == (s["x"], s["y"], s["low"], s["high"])
    assert json.dumps(sent.messages[1][0])  # the header is plain JSON; the numbers are in the buffers
    assert sum(len(b) for b in sent.messages[1][1]) == 8 * (4 * 15 + 2 * 15)
    d.finish()


def test_long_runs_are_thinned_by_the_views_not_by_the_kernel():
    steps = 2500
    run = make_run(steps=steps)
    d = Dashboard(run)
    d.update(force=True)
    assert len(d.points("loss")["x"]) == steps  # the browser keeps every point, thins when it draws
    drawn = svg_panels(render_svg(run))
    size = 3  # ceil(2500 / 1000) consecutive steps per point
    (line,) = [p for p in drawn["loss"].iter(f"{SVG}path") if p.get("class") == "line"]
    assert int(line.get("data-points")) == 834 <= MAX_POINTS
    (tput,) = [p for p in drawn["throughput"].iter(f"{SVG}path") if p.get("class") == "line"]
    assert int(tput.get("data-points")) == 833
    assert math.ceil(steps / MAX_POINTS) == size
    d.finish()


def test_update_is_throttled():
    run = make_run()
    d = Dashboard(run, min_interval=60)
    assert d.update() is True
    run.add([{"rank": r, "seq": STEPS, "step": STEPS, "loss": 0.0} for r in range(RANKS)])
    assert d.update() is False
    assert len(d.points("loss")["x"]) == STEPS  # not sent yet
    assert d.update(force=True) is True
    assert len(d.points("loss")["x"]) == STEPS + 1
    d.finish()


def test_progress_with_total_steps():
    run = make_run(total_steps=50)
    d = Dashboard(run)
    d.update(force=True)
    assert (d.head["done"], d.head["total"]) == (30, 50)
    # the records' "time" advances 1 s per step: 20 steps to go (step_time_s, ~3 s, is not used)
    assert d.head["progress"] == "step 30 / 50, ETA 00:20"
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
    assert d.head["progress"] == "step 110 / 200, ETA 02:03"
    d.finish()


def test_progress_without_total_steps(dash):
    assert dash.head["total"] is None
    assert dash.head["progress"].startswith("30 steps, elapsed ")


def test_header_shows_run_and_status(dash):
    head = dash.head
    assert head["title"] == "run test-run · 2 ranks · gloo on cpu" and head["status"] == "running"
    assert head["problem"] is None
    dash.run.status, dash.run.error = "error", "Traceback...\nValueError: bad shape"
    dash.update(force=True)
    assert (dash.head["status"], dash.head["problem"]) == ("error", "ValueError: bad shape")


def test_static_bundle_has_text_and_svg():
    run = make_run()
    run.status, run.ended = "done", run.started + 12.0
    bundle = static_bundle(run)
    assert bundle["text/plain"] == run.summary()
    assert "done after 12.0 s" in bundle["text/plain"]
    svg = bundle["image/svg+xml"]
    root = ET.fromstring(svg)
    assert (root.get("width"), root.get("height")) == ("1000", "868")  # three rows of two panels
    assert set(bundle) == {"text/plain", "image/svg+xml"}  # the image is stored once
    drawn = svg_panels(svg)
    assert [g.get("data-title") for g in drawn.values()] == [p["title"] for p in panels(run)]
    bars = [float(r.get("data-value")) for r in drawn["memory"].iter(f"{SVG}rect") if r.get("data-series") == "peak"]
    assert bars == pytest.approx([200 + 20 * r + STEPS - 1 for r in range(RANKS)])


def test_static_summary_of_an_empty_run_says_no_data():
    drawn = svg_panels(render_svg(Run("empty", 2)))
    assert all(any(t.text == "no data" for t in g.iter(f"{SVG}text")) for g in drawn.values())


def test_finish_outside_kernel_prints_summary_and_closes(capsys):
    run = make_run()
    d = Dashboard(run)
    d.show()
    assert capsys.readouterr().out == ""  # no kernel: nothing live is displayed
    d.finish()
    assert capsys.readouterr().out == run.summary() + "\n"
    assert d.widget.comm is None
    assert charts_lib().comm is not None  # the chart code stays, for the next dashboards
    assert d.update(force=True) is False


def test_the_chart_code_is_one_widget_shared_by_every_dashboard(monkeypatch):
    # a library made by an earlier test in this process may be registered with another comm manager
    # (importing ipykernel.ipkernel swaps comm.get_comm_manager; a kernel imports it before anything)
    monkeypatch.setattr(widget, "_lib", None)
    d1 = Dashboard(make_run())
    d1.finish()
    d2 = Dashboard(Run("next", world_size=1))
    lib = charts_lib()
    assert d1.widget.lib == d2.widget.lib == lib.key
    assert d2.widget is not d1.widget and d1.widget.comm is None and d2.widget.comm is not None
    # the dashboard's own module is small; the chart code (the bundle) travels once, with the library
    charts = (REPO / "jdist" / "kernel" / "dashboard" / "charts.js").read_text()
    assert lib._esm == charts and "__jdist_dashboard" in charts and len(charts) > 4 * len(d2.widget._esm)
    assert len(d2.widget._esm) < 3000
    lib.close()  # closed (e.g. Widget.close_all()): the next dashboard opens a new one
    d3 = Dashboard(Run("third", world_size=1))
    assert charts_lib() is not lib and charts_lib().comm is not None and d3.widget.lib == lib.key
    d2.finish()
    d3.finish()


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
        "assert not {'anywidget', 'ipywidgets', 'matplotlib'} & set(sys.modules)  # a cheap import\n"
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
                "from jdist.kernel.dashboard import charts_lib\n"
                "dash2 = Dashboard(Run('nb-run-2', world_size=1))\n"
                "dash2.show()\n"
                "assert dash.widget.comm is None and dash2.widget.comm is not None\n"
                "assert dash2.widget.lib == charts_lib().key and charts_lib().comm is not None\n"
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
    assert ET.fromstring(final.data["image/svg+xml"]).get("width") == "1000"
    assert final.data["text/plain"].startswith("jdist run nb-run: done after ")
    assert "text/html" not in final.data
    # the finish cell only printed the summary text
    (printed,) = nb.cells[2].outputs
    assert printed.output_type == "stream" and printed.text.startswith("jdist run nb-run: done after ")
    for cell in nb.cells:
        assert all(o.output_type != "error" for o in cell.outputs)


def test_every_panel_is_drawn_by_every_view_from_one_definition():
    """A panel is data: the live widget and the static SVG draw each panel of PANELS by its kind."""
    run = make_run()
    drawn = panels(run)
    assert [p["key"] for p in drawn] == ["loss", "time", "memory", "throughput", "state"]
    assert len(PANELS) == 11  # the other six only with a mesh, a pipeline, beyond 16 ranks or on several hosts
    d = Dashboard(run)
    d.update(force=True)
    def heads(ps):
        return [(p["key"], p["kind"], p["title"]) for p in ps]

    assert heads(d.widget.layout) == heads(drawn)
    for p in drawn:
        if p["kind"] == "line":
            s = p["series"][0]
            assert (d.points(p["key"])["x"], d.points(p["key"])["y"]) == (s["x"], s["y"])
        else:
            assert whole(d, p["key"]) == p
    assert [g.get("data-title") for g in svg_panels(render_svg(run)).values()] == [p["title"] for p in drawn]
    d.finish()


def test_a_mesh_and_a_pipeline_add_their_panels_to_every_view():
    """With comm_time_<dim>_s in the records and a pipeline's timeline: per rank, communication stacked by
    mesh dimension, and the newest step of the pipeline as a stage x time grid (forward, backward, idle),
    its bubble beside the theory; the live widget, the static SVG and the summary have both."""
    run = make_run()
    run.add({"rank": r, "seq": STEPS + s, "step": STEPS + s, "time": 2000.0 + s, "comm_time_tp_s": 0.004,
             "comm_time_pp_s": 0.002 * (r + 1), "pp_stage": r, "bubble_frac": 0.25 + 0.1 * r}
            for s in range(3) for r in range(RANKS))
    t0 = 2000.0
    for r in range(RANKS):  # two stages, two micro-batches: stage 1 starts a micro-batch late
        run.add_pipeline({"rows": [[STEPS + 2, r, r, mb, action, t0 + r + mb + 3 * (action == "B"),
                                    t0 + r + mb + 3 * (action == "B") + 1] for action in "FB" for mb in (0, 1)]})
    dims, gantt = panel(run, "comm_dims"), panel(run, "pipeline")
    assert dims["categories"] == ["rank 0", "rank 1"] and [x["name"] for x in dims["series"]] == ["tp", "pp"]
    assert dims["stacked"] and dims["series"][1]["values"] == [pytest.approx(0.002), pytest.approx(0.004)]
    assert gantt["rows"] == ["stage 0 r0", "stage 1 r1"] and [name for name, _ in gantt["legend"]] == ["forward", "backward"]
    assert gantt["title"].startswith(f"pipeline, step {STEPS + 2}: bubble 0.30 measured, (p-1)/(m+p-1) = 0.33")
    cells = np.frombuffer(base64.b64decode(gantt["cells"]), dtype=np.uint8).reshape(2, -1)
    width = cells.shape[1]
    assert cells[0, 0] == 0 and cells[1, 0] == 255  # stage 0 forwards micro-batch 0 while stage 1 idles
    assert cells[1, width // 6] == 0 and cells[0, width - 1] == 255  # then stage 1 does; stage 0 ends first
    assert {int(v) for v in np.unique(cells)} == {0, 64, 127, 190, 255}  # F even/odd, B even/odd, idle
    d = Dashboard(run)
    d.update(force=True)
    assert whole(d, "comm_dims") == dims and whole(d, "pipeline") == gantt
    assert {"comm_dims", "pipeline"} <= set(svg_panels(render_svg(run)))
    text = run.summary()
    assert "communication per step by mesh dimension: tp 4.0 ms" in text
    assert "pipeline: 2 stages on 2 ranks, 2 micro-batches a step; bubble 0.30 measured" in text, text
    d.finish()


def test_a_new_panel_is_one_function(monkeypatch):
    """Adding a panel to PANELS is the whole change: the live widget and the static SVG draw it."""
    import jdist.metrics.panels as pn

    def grad_norm(run):
        return pn.LineDef(key="grad", title="gradient norm", series=(pn.SeriesDef(
            name="norm", color=GREEN, metric="loss", point=lambda step, values, prev: (max(values.values()), None, None)),))

    monkeypatch.setattr(pn, "PANELS", (*pn.PANELS, grad_norm))
    run = make_run()
    d = Dashboard(run)
    d.update(force=True)
    assert d.points("grad")["y"] == d.points("loss")["high"]
    assert d.widget.layout[5]["title"] == "gradient norm"
    drawn = svg_panels(render_svg(run))
    assert list(drawn) == ["loss", "time", "memory", "throughput", "state", "grad"]
    d.finish()


def test_a_line_panel_with_two_series_is_drawn_whole_by_every_view():
    """The validation loss (logged every other step) is a second series of the loss panel: the live
    widget's points of each series, the static SVG's lines and the summary agree with the panel data."""
    run = Run("val", world_size=2)
    run.add([{"rank": r, "seq": s, "step": s, "loss": 1.0 / (s + 1) + r, **({"val_loss": 2.0 - s / 10} if s % 2 else {})}
              for s in range(10) for r in range(2)])
    loss = panel(run, "loss")
    assert [(s["name"], s["x"]) for s in loss["series"]] == [("loss", list(range(10))), ("val_loss", [1, 3, 5, 7, 9])]
    assert loss["series"][1]["y"] == pytest.approx([1.9, 1.7, 1.5, 1.3, 1.1]) and loss["series"][1]["low"] is None
    d = Dashboard(run)
    d.update(force=True)
    for s in loss["series"]:
        assert (d.points("loss", s["name"])["x"], d.points("loss", s["name"])["y"]) == (s["x"], s["y"])
    assert [s["name"] for s in d.widget.layout[0]["series"]] == ["loss", "val_loss"]
    lines = {p.get("data-series"): p.get("data-points") for p in svg_panels(render_svg(run))["loss"].iter(f"{SVG}path")
             if p.get("class") == "line"}
    assert lines == {"loss": "10", "val_loss": "5"}
    assert "\n  val_loss: 1.1 (mean over ranks, range 1.1..1.1) at step 9" in run.summary()
    d.finish()


# -- beyond 16 ranks: distributions, heatmaps, hosts, the slowest ranks ---------------------------

WIDE, HOSTS = 64, 8


def wide_run(steps: int = 40, world: int = WIDE) -> Run:
    """``world`` ranks on 8 hosts (8 each); rank 37 is 60% slower than the median, host node05's
    other ranks 25%; rank 37 communicates less (it is the one the others wait for)."""
    hosts = {r: f"node{r * HOSTS // world:02d}" for r in range(world)}
    run = Run("wide", world, hosts=hosts)
    recs = []
    for s in range(steps):
        for r in range(world):
            slow = 1.6 if r == 37 else 1.25 if hosts[r] == "node05" else 1.0
            step_t = 0.1 * slow * (1 + 0.01 * ((r * 7 + s) % 5))
            recs.append({"rank": r, "seq": s, "step": s, "time": 1000.0 + s, "loss": 1.0 / (s + 1) + r / 1000,
                         "step_time_s": 5.0 if s == 0 else step_t, "comm_time_s": step_t * (0.1 if r == 37 else 0.4),
                         "mem_bytes": (100 + r) * MIB, "mem_peak_bytes": (200 + r) * MIB})
    run.add(recs)
    return run


def heat_bytes(p: dict) -> list[list[int]]:
    import base64

    raw = base64.b64decode(p["cells"])
    cols = len(p["x"])
    return [list(raw[i * cols:(i + 1) * cols]) for i in range(len(p["rows"]))]


def test_beyond_16_ranks_the_slowest_ranks_table_names_the_stragglers_and_their_hosts():
    run = wide_run()
    table = panel(run, "slowest")
    assert table["kind"] == "table" and table["columns"] == ["rank", "host", "step time", "vs median", "comm",
                                                             "data wait", "flag"]
    first, *rest = table["rows"]
    assert first[:2] == ["r37", "node04"] and first[3] == "+60%" and first[4] == "10%"
    assert {row[1] for row in rest} == {"node05"} and all(row[3] == "+25%" for row in rest)
    assert "slowest host node05: +25% on average" in table["note"] and "over 64 ranks" in table["note"]
    assert "slowest rank 37 node04 " in run.summary() and "(+60%)" in run.summary()


def test_beyond_16_ranks_the_heatmaps_show_each_rank_by_host_with_its_first_step_left_out():
    run = wide_run()
    heat = panel(run, "step_heat")
    assert heat["kind"] == "heatmap" and heat["rows"] == [f"r{r}" for r in range(WIDE)]
    assert heat["groups"] == [[f"node{h:02d}", 8 * h, 8] for h in range(HOSTS)]
    cells = heat_bytes(heat)
    assert heat["x"] == list(range(40))  # 40 steps: a column each
    assert heat["high"] == pytest.approx(0.1 * 1.6 * 1.04) and heat["low"] == pytest.approx(0.1)  # not the 5 s set-up
    assert all(row[0] == 255 for row in cells)  # the first step: no value
    assert min(cells[37][1:]) > 220 and max(max(row[1:]) for row in cells[:32]) < 20  # rank 37 stands out
    assert min(min(row[1:]) for row in cells[40:48]) > 90  # node05's ranks: brighter than the rest
    comm = heat_bytes(panel(run, "comm_heat"))
    assert max(comm[37][1:]) == 0 and min(min(row[1:]) for row in comm[:37]) == 254  # rank 37 waits least


def test_beyond_16_ranks_time_is_a_distribution_and_memory_is_per_host():
    run = wide_run()
    time_p = panel(run, "time")
    assert time_p["kind"] == "line" and [s["name"] for s in time_p["series"]] == ["step time", "communication"]
    step = time_p["series"][0]
    assert step["x"][0] == 0 and step["y"][0] is None  # every rank's first step (the set-up) left out
    assert step["y"][5] == pytest.approx(0.1 * (1 + 0.01 * 2), rel=0.03) and step["high"][5] > 0.16
    memory = panel(run, "memory")
    assert memory["categories"] == [f"node{h:02d}" for h in range(HOSTS)]
    assert memory["series"][0]["values"][-1] == pytest.approx(100 + 63)  # the highest rank of node07
    small = wide_run(world=16)
    assert [p["key"] for p in panels(small)] == ["loss", "time", "memory", "throughput", "state"]
    assert panel(small, "time")["kind"] == "bars" and len(panel(small, "memory")["categories"]) == 16


def test_the_wide_panels_are_drawn_by_the_live_widget_and_the_static_svg():
    run = wide_run()
    d = Dashboard(run)
    d.update(force=True)
    assert [p["key"] for p in d.widget.layout][-3:] == ["slowest", "step_heat", "comm_heat"]
    for key in ("slowest", "step_heat", "comm_heat", "memory"):
        assert whole(d, key) == panel(run, key)
    drawn = svg_panels(render_svg(run))
    image = next(drawn["step_heat"].iter(f"{SVG}image"))
    assert (image.get("data-rows"), image.get("data-columns")) == ("64", str(len(panel(run, "step_heat")["x"])))
    assert image.get("href").startswith("data:image/png;base64,iVBORw0KGgo")
    ranks = [g.get("data-rank") for g in drawn["slowest"].iter(f"{SVG}g") if g.get("data-rank")]
    assert ranks[0] == "r37" and len(ranks) == 8
    d.finish()


def test_heatmap_columns_kept_between_updates_equal_a_fresh_computation():
    """The live view adds steps a few at a time: the kept columns, widened as the run grows, give
    what the finished run computes at once."""
    full = wide_run(steps=300, world=20)
    grown = Run("grown", 20, hosts=full.hosts)
    recs = [r for r in wide_run(steps=300, world=20).records]
    by_step: dict[int, list[dict]] = {}
    for r in recs:
        by_step.setdefault(r["step"], []).append({**r, "seq": r["step"]})
    for s in range(300):
        grown.add(by_step[s])
        if s % 37 == 0:
            grown.bucket_means("step_time_s")
            grown.bucket_means("comm_time_s", over="step_time_s")
    for metric, over in (("step_time_s", None), ("comm_time_s", "step_time_s")):
        a, b = grown.bucket_means(metric, over), full.bucket_means(metric, over)
        assert a[0] == b[0] and a[1] == b[1]
        assert a[2] == pytest.approx(b[2], nan_ok=True)


def host_sample(host: str, cpu: float, net: float, gpus: int = 0) -> dict:
    return {"v": 4, "kind": "host", "cell": 1, "host": host, "time": 1000.0, "cpu": cpu, "mem_used": 20 * 2**30,
            "mem_total": 64 * 2**30, "net_bytes_s": net,
            "gpus": [{"index": i, "util": 0.5 + 0.1 * i, "mem_used": 10 * 2**30, "mem_total": 80 * 2**30}
                     for i in range(gpus)]}


def test_the_hosts_panel_lists_the_busiest_hosts_and_comes_back_from_the_run_folder(tmp_path):
    from jdist.metrics import RunLog, read_run

    run = Run("hosts", 4, hosts={0: "node1", 1: "node1", 2: "node2", 3: "node2"})
    log = RunLog(run, tmp_path)
    log.append(run.add([{"rank": r, "seq": 0, "step": 0, "loss": 1.0} for r in range(4)]))
    for sample in (host_sample("node1", 0.2, 1e6, gpus=2), host_sample("node2", 0.9, 5e6, gpus=2),
                   host_sample("node1", 0.3, 2e6, gpus=2)):
        run.add_host(sample)
        log.append_host(sample)
    run.status = "finished"
    log.close()
    table = panel(run, "hosts")
    assert table["rows"] == [["node2", "2", "90%", "20.0 / 64.0", "5.0 MB/s", "55% of 2", "20.0 / 160.0"],
                             ["node1", "2", "30%", "20.0 / 64.0", "2.0 MB/s", "55% of 2", "20.0 / 160.0"]]
    assert table["note"] == "2 hosts; CPU median 60%, highest node2 90%; network median 3.5 MB/s, highest node2 5.0 MB/s"
    assert "  2 hosts; CPU median 60%" in run.summary()
    back = read_run(tmp_path / "hosts")
    assert panel(back, "hosts") == table and [len(v) for v in back.host_load().values()] == [2, 1]
    svg = svg_panels(render_svg(run))
    assert [g.get("data-rank") for g in svg["hosts"].iter(f"{SVG}g") if g.get("data-rank")] == ["node2", "node1"]
    one_host = Run("one", 2)
    one_host.add_host(host_sample("laptop", 0.5, 0.0))
    assert "hosts" not in [p["key"] for p in panels(one_host)]  # one host, few ranks: no panel
