"""The sweep's view (jdist/metrics/sweep.py): the SVG panels from trials, read back with the standard
library's XML parser, no kernel."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from jdist.metrics.sweep import COLOURS, best_svg, curves_svg, parallel_svg, timeline_svg

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_the_timeline_has_a_bar_per_trial_on_its_slot_and_shows_the_idle_gap():
    spans = [(0, 0, 10.0, 11.0, "COMPLETE"), (0, 2, 12.0, 13.0, "FAIL"), (1, 1, 10.0, 10.5, "PRUNED"),
             (1, 3, 10.6, None, "RUNNING")]
    root = parse(timeline_svg(spans, slots=2, now=13.0, width=444, row=16))
    bars = root.findall(f"{SVG}rect")
    assert [b.find(f"{SVG}title").text.split(":")[0] for b in bars] == ["trial 0", "trial 2", "trial 1", "trial 3"]
    assert [b.get("fill") for b in bars] == [COLOURS[s] for s in ("COMPLETE", "FAIL", "PRUNED", "RUNNING")]
    assert [float(b.get("y")) for b in bars] == [2, 2, 18, 18]  # slot rows
    scale = (444 - 44 - 8) / 3.0  # px per second over the 3 s shown
    first, second = bars[0], bars[1]
    gap = float(second.get("x")) - (float(first.get("x")) + float(first.get("width")))
    assert abs(gap - 1.0 * scale) < 0.2  # slot 0 idled 1 s between trials 0 and 2
    assert abs(float(bars[3].get("width")) - 2.4 * scale) < 0.2  # the running trial reaches "now"
    assert timeline_svg([], slots=2, now=0.0) == ""


def test_curves_best_so_far_and_parallel_coordinates():
    curves = {0: ("COMPLETE", [(0, 1.0), (1, 0.5)]), 1: ("RUNNING", [(0, 2.0)])}
    root = parse(curves_svg(curves, "val_loss"))
    lines = root.findall(f"{SVG}polyline")
    assert [l.find(f"{SVG}title").text for l in lines] == ["trial 0 (complete)", "trial 1 (running)"]  # running on top
    assert lines[1].get("stroke-width") == "2.0"
    best = parse(best_svg([(0, 3.0), (1, 1.0), (2, 2.0)], "minimize", width=306, height=170))
    pts = [tuple(map(float, p.split(","))) for p in best.find(f"{SVG}polyline").get("points").split()]
    assert [y for _, y in pts][1:] == [pts[1][1], pts[1][1]]  # the best stays at 1.0 after trial 1
    assert len(best.findall(f"{SVG}circle")) == 3
    rows = [({"lr": 0.001, "opt": "adam"}, 1.0), ({"lr": 0.1, "opt": "sgd"}, 3.0)]
    par = parse(parallel_svg(rows, "minimize"))
    assert [t.text for t in par.findall(f"{SVG}text")][::3] == ["lr", "opt", "value"]  # one axis per name
    lines = par.findall(f"{SVG}polyline")
    assert len(lines) == 2 and float(lines[-1].get("stroke-width")) > float(lines[0].get("stroke-width"))  # best last
    assert parallel_svg([], "minimize") == "" and best_svg([], "maximize") == ""
