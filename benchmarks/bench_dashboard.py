"""How soon does the live notebook dashboard show what the ranks log? Measured in a real browser.

JupyterLab with its own config/data/runtime dirs (``tests/labserver.py``) and Debian chromium
driven by Playwright (``tools/install_chromium.sh``). The notebook: ``%load_ext jdist``, a
``%%distributed -n 2`` set-up cell, then a training cell whose ranks each log one step every
``--pace`` seconds (``jdist.log(step=i, loss=...)``, a sleep standing in for the work) for
``--steps`` steps. While it runs, the page notes (``Date.now()``, 10 ms polling) when the loss
chart under the cell first draws each number of points; afterwards the ranks' records give when
each step was logged (``time``, the later of the two ranks: a step's point needs both). Same
machine, same clock.

Figures: the first paint (from the first ``jdist.log`` on the ranks to the first point drawn),
the latency of every step (logged -> drawn: median and p90), how often the page redrew, and how
many times the page evaluated the chart code (once per page, however many dashboards).

Usage::

    .venv/bin/python benchmarks/bench_dashboard.py [--steps 400] [--pace 0.025] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from labserver import JupyterServerProcess  # noqa: E402

CHROMIUM = Path(os.environ.get("JDIST_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"]
TARGETS = {"first_paint_s": 1.0, "latency_p90_s": 1.0}

SETUP = "%%distributed -n 2\nimport time"
WARM = "%%distributed\nfor i in range(5):\n    jdist.log(step=i, loss=1.0)"
TRAIN = """%%distributed
for i in range({steps}):
    jdist.log(step=i, loss=1.0 / (i + 1))
    time.sleep({pace})"""
RESULT = """import json
_h = jdist.last_run().history
print("@@" + json.dumps(_h.groupby("step")["time"].max().tolist()))"""

#: Polls the training cell's loss chart; keeps (Date.now() ms, points drawn) at each change.
WATCH = """() => {
  window.__bench = [];
  let last = -1;
  window.__benchTimer = setInterval(() => {
    const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[3];
    const p = cell && cell.querySelector('.jp-jdist-dash .jp-jdist-chart-loss path.jp-jdist-line');
    const n = p ? Number(p.dataset.points) : 0;
    if (n !== last) { last = n; window.__bench.push([Date.now(), n]); }
  }, 10);
}"""


def notebook(steps: int, pace: float) -> dict[str, Any]:
    cells = ["%load_ext jdist", SETUP, WARM, TRAIN.format(steps=steps, pace=pace), RESULT]
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                       "source": src} for i, src in enumerate(cells)],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def measure(steps: int, pace: float) -> dict[str, Any]:
    if not CHROMIUM.exists():
        sys.exit(f"no chromium at {CHROMIUM}: run tools/install_chromium.sh (make test does)")
    from playwright.sync_api import sync_playwright

    base = Path(tempfile.mkdtemp(prefix="jdist-bench-dash-"))
    lab = JupyterServerProcess(base, app="lab", extra_args=["--LabApp.expose_app_in_browser=True"])
    (lab.dirs["root"] / "bench.ipynb").write_text(json.dumps(notebook(steps, pace)))
    lab.start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 950})
            page.goto(f"{lab.url}/lab/tree/bench.ipynb?token={lab.token}")
            page.wait_for_function(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
                " && w.sessionContext.session.kernel.status === 'idle'; }", timeout=120_000)
            page.evaluate(WATCH)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            page.wait_for_function("() => { const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[4];"
                                   " return c && c.querySelector('.jp-OutputArea').innerText.includes('@@'); }",
                                   timeout=300_000)
            seen = page.evaluate("() => { clearInterval(window.__benchTimer); return window.__bench; }")
            loads = page.evaluate("() => window.__jdist_dashboard_loads")
            cells = page.locator(".jp-Notebook .jp-Cell")
            cells.nth(3).locator(".jp-OutputArea img").first.wait_for(timeout=30_000)  # the static summary
            text = cells.nth(4).locator(".jp-OutputArea").inner_text()
            browser.close()
    finally:
        lab.stop()
        shutil.rmtree(base, ignore_errors=True)
    logged = json.loads(text.split("@@", 1)[1].strip().splitlines()[0])  # per step: when the later rank logged it
    # when each number of points was first drawn -> when step k (the (k+1)-th point) was first on screen
    drawn_at: list[float | None] = [None] * len(logged)
    for t_ms, n in seen:
        for k in range(min(n, len(logged))):
            if drawn_at[k] is None:
                drawn_at[k] = t_ms / 1000
    lat = [d - t for d, t in zip(drawn_at, logged) if d is not None]
    first = next((d for d in drawn_at if d is not None), None)
    redraws = len(seen)
    return {
        "steps": steps, "pace_s": pace, "drawn_steps": sum(d is not None for d in drawn_at),
        "first_paint_s": None if first is None else first - logged[0],
        "latency_median_s": statistics.median(lat) if lat else None,
        "latency_p90_s": sorted(lat)[int(0.9 * (len(lat) - 1))] if lat else None,
        "latency_max_s": max(lat) if lat else None,
        "chart_changes": redraws, "changes_per_s": redraws / (steps * pace),
        "chart_code_loads": loads,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400, help="steps each rank logs (default 400; at most 1000: unthinned)")
    ap.add_argument("--pace", type=float, default=0.025, help="seconds between two logs (default 0.025)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if not 1 <= args.steps <= 1000 or args.pace <= 0:
        ap.error("--steps must be 1..1000 (longer lines are thinned when drawn) and --pace positive")
    t0 = time.perf_counter()
    r = measure(args.steps, args.pace)
    print(f"\njdist live dashboard in a browser (chromium, JupyterLab): 2 ranks log {args.steps} steps, "
          f"one every {args.pace * 1000:.0f} ms")
    print(f"   steps drawn live: {r['drawn_steps']} of {args.steps}; the loss chart changed {r['chart_changes']} times "
          f"({r['changes_per_s']:.1f}/s); the chart code was evaluated {r['chart_code_loads']} time(s) in the page "
          f"for 2 dashboards")
    print(f"   latency from jdist.log (the later rank) to the point on screen: median {r['latency_median_s']:.3f} s, "
          f"p90 {r['latency_p90_s']:.3f} s, max {r['latency_max_s']:.3f} s")
    print("\nTargets (issue 11) beside this run's figures:")
    print(f"   {'figure':<62}{'measured':>10}{'target':>12}  met")
    for key, label in (("first_paint_s", "dashboard first paint: first jdist.log -> first point drawn"),
                       ("latency_p90_s", "p90 latency, jdist.log -> point drawn")):
        v = r[key]
        print(f"   {label:<62}{v:>8.2f} s{'<= ' + str(TARGETS[key]) + ' s':>12}  {'yes' if v <= TARGETS[key] else 'NO'}")
    print(f"total benchmark time: {time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return r


if __name__ == "__main__":
    main()
