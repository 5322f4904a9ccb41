"""End to end in a real browser: JupyterLab + the "Distributed" sidebar + a 2-rank training cell.

Debian chromium (``tools/install_chromium.sh``, run by ``make test``) driven by Python
Playwright; JupyterLab on 127.0.0.1 with a token, its own config/data/runtime/IPython/run dirs
(:class:`labserver.JupyterServerProcess`). The test opens a notebook, runs a real
``%%distributed -n 2`` training cell, and checks in the page that the sidebar shows the cluster
with 2 busy ranks and the run with a growing sparkline, that the run view draws the dashboard's
charts live, that Interrupt in the sidebar stops the training (the cell reports the interrupt,
the ranks are idle again), that the notebook dashboard rendered, that a ``jdist.tune`` sweep
is listed in the sidebar while it runs and its view opens, that JupyterLab's Debugger panel stops
rank 1 of a ``%%distributed`` cell at a gutter breakpoint with its stack and variables, and that the run
view of a 256-rank run (written with the kernel's run log) shows the large-world panels: the slowest
ranks with their hosts, rank × step heatmaps grouped by host, and that of a pipeline run its Gantt chart and
the communication of each mesh dimension. Screenshots go to ``build/screenshots/``.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from labserver import REPO, JupyterServerProcess

CHROMIUM = Path(os.environ.get("JDIST_CHROMIUM", "/usr/bin/chromium"))
SHOTS = REPO / "build" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

SETUP = """%%distributed -n 2 --timeout 30
import time, torch, torch.nn as nn
torch.manual_seed(0)
model = jdist.prepare(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
print(f"rank {rank} of {world_size} ready")"""

WARM = """%%distributed
for step in range(20):
    jdist.log(step=step, loss=1.0 / (step + 1))"""

TRAIN = """%%distributed
jdist.progress(total_steps=3000, batch_size=32)
torch.manual_seed(100 + rank)                  # each rank its own batches: a visible min-max band
xv = torch.randn(64, 8); yv = xv.sum(1, keepdim=True)
for step in range(3000):
    x = torch.randn(32, 8); y = x.sum(1, keepdim=True) + 0.3 * torch.randn(32, 1)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():                      # a validation loss every 5 steps: a second line on the loss chart
        val = {"val_loss": ((model(xv) - yv) ** 2).mean().item()} if step % 5 == 4 else {}
    jdist.log(step=step, loss=loss.item(), **val)
    time.sleep(0.1)"""


#: The loss chart under ``root`` draws the validation loss as a line of its own, beside the loss.
VAL_DRAWN = ("() => {{ const c = document.querySelector('{root} .jp-jdist-chart-loss');"
             " const v = c && c.querySelector('path.jp-jdist-line[data-series=val_loss]');"
             " const l = c && c.querySelector('path.jp-jdist-line[data-series=loss]');"
             " return v && l && Number(v.dataset.points) >= 2 && Number(l.dataset.points) > Number(v.dataset.points); }}")


OBJECTIVE = """%%distributed
def quick(trial):
    x = trial.suggest_float("x", -1.0, 1.0)
    for step in range(4):
        time.sleep(0.25)
        jdist.log(step=step, loss=x * x + 1.0 / (step + 1))
    return x * x"""

SWEEP = "study = jdist.tune('quick', trials=8, metric='loss', name='lab-sweep')"

DEBUGGED = """%%distributed --debug-ranks 1
import torch.distributed as dist
seen = 40 + rank
t = torch.ones(1) * seen
dist.all_reduce(t)
print("sum", float(t))"""


def _notebook() -> dict:
    cells = ["%load_ext jdist", SETUP, WARM, TRAIN, "print('after training:', jdist.last_run().status)", OBJECTIVE,
             SWEEP, DEBUGGED]
    return {
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": src} for i, src in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    }


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no chromium at {CHROMIUM}: run tools/install_chromium.sh (make test does)")
    playwright = pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    srv = JupyterServerProcess(tmp_path_factory.mktemp("jlab"), app="lab",
                               extra_args=["--LabApp.expose_app_in_browser=True"])
    settings = srv.dirs["config"] / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    (srv.dirs["root"] / "train.ipynb").write_text(json.dumps(_notebook()))
    srv.start()
    yield srv
    srv.stop()


def settle(page) -> None:
    """Until the page has drawn two more frames (for a screenshot of what is on screen)."""
    page.wait_for_function("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))")


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name))


@pytest.mark.timeout(600)
def test_sidebar_live_run_view_and_interrupt(lab, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    console: list[str] = []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    try:
        _scenario(lab, page)
    except BaseException:
        shot(page, "failure.png")
        print("browser console:", *console[-40:], sep="\n")
        print("notebook outputs:", *(o[:400] for o in page.locator(".jp-Notebook .jp-OutputArea").all_inner_texts()),
              sep="\n")
        raise
    finally:
        page.close()


def _scenario(lab, page) -> None:
    t0 = time.monotonic()
    errors: list[str] = []  # uncaught errors in the page (stack included)
    page.on("pageerror", lambda exc: errors.append(f"{exc}\n{getattr(exc, 'stack', '')}"))
    page.goto(f"{lab.url}/lab/tree/train.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    # the sidebar tab with its own icon, then the panel
    tab = page.locator("li.lm-TabBar-tab[data-id='jdist-sidebar']")
    tab.wait_for(timeout=30_000)
    assert tab.locator("svg").count() == 1
    tab.click()
    sidebar = page.locator("#jdist-sidebar")
    sidebar.locator(".jp-jdist-title", has_text="Distributed").wait_for()
    sidebar.locator(".jp-jdist-empty").first.wait_for()

    # run the notebook: kernel idle first, then Run All (the training cell runs until interrupted)
    page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=30_000)
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle'; }", timeout=90_000)
    # (not awaited: the promise resolves when every cell has run)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    # the cluster: notebook name, 2 ranks, busy while training
    card = sidebar.locator(".jp-jdist-cluster")
    card.wait_for(timeout=180_000)
    assert card.locator(".jp-jdist-nb").inner_text() == "train.ipynb"
    page.wait_for_function(
        "() => document.querySelectorAll('#jdist-sidebar .jp-jdist-cluster tr[data-state=busy]').length === 2",
        timeout=120_000)
    assert card.locator("table.jp-jdist-ranks tbody tr").count() == 2
    assert card.locator(".jp-jdist-nranks").inner_text() == "2 ranks"
    assert "ddp" in card.locator(".jp-jdist-meta").first.inner_text()
    assert "cpu" in card.locator(".jp-jdist-meta").first.inner_text()

    # the cluster's options, with their scope (jdist/options.py): folded, and they stay open across refreshes
    options = card.locator("details.jp-jdist-options")
    assert "launcher local-mpi" in options.locator("summary").inner_text()
    options.locator("summary").click()
    assert options.locator("tr[data-option=backend] td").nth(1).inner_text() == "ddp"
    assert options.locator("tr[data-option=timeout] td").nth(2).inner_text() == "needs --restart"
    assert options.locator("tr[data-option=precision] td").nth(2).inner_text() == "changes live"
    uptime = card.locator(".jp-jdist-meta").first.inner_text()
    page.wait_for_function(
        "(before) => document.querySelector('#jdist-sidebar .jp-jdist-cluster .jp-jdist-meta').innerText !== before",
        arg=uptime, timeout=30_000)  # the card was drawn again
    assert card.locator("details.jp-jdist-options[open]").count() == 1

    # the run with a growing loss sparkline
    run = sidebar.locator(".jp-jdist-run[data-status=running]").first
    run.wait_for(timeout=60_000)
    page.wait_for_function(
        "() => { const s = document.querySelector('#jdist-sidebar .jp-jdist-run[data-status=running] .jp-jdist-spark-loss svg');"
        " return s && Number(s.dataset.points) >= 3; }", timeout=60_000)
    # read the sparkline and the step count in one go: the sidebar may redraw between two separate reads
    read_run = ("() => { const r = document.querySelector('#jdist-sidebar .jp-jdist-run[data-status=running]');"
                " const s = r.querySelector('.jp-jdist-spark-loss svg');"
                " return {lastX: Number(s.dataset.lastX), path: s.querySelector('path').getAttribute('d'),"
                " steps: Number(r.querySelector('.jp-jdist-run-progress').dataset.steps)}; }")
    first = page.evaluate(read_run)
    page.wait_for_function(
        f"(before) => {{ const now = ({read_run})(); return now.lastX > before.lastX && now.steps > before.steps; }}",
        arg=first, timeout=60_000)
    second = page.evaluate(read_run)
    # the loss chart grows: it reaches later steps (long series are thinned to 60 points)
    assert second["steps"] > first["steps"] and second["lastX"] > first["lastX"] and second["path"] != first["path"], \
        (first, second)

    # the notebook dashboard under the training cell, drawn by the browser from the points the kernel sends
    train_out = page.locator(".jp-Notebook .jp-Cell").nth(3).locator(".jp-OutputArea")
    dash = train_out.locator(".jp-jdist-dash")
    dash.wait_for(timeout=60_000)
    read_dash = ("() => { const d = document.querySelectorAll('.jp-Notebook .jp-Cell')[3].querySelector('.jp-jdist-dash');"
                 " const p = d && d.querySelector('.jp-jdist-chart-loss path.jp-jdist-line');"
                 " return d && {seq: Number(d.dataset.seq), gaps: Number(d.dataset.gaps),"
                 " points: p ? Number(p.dataset.points) : 0, progress: d.querySelector('.jp-jdist-dash-progress-text').textContent,"
                 " loads: window.__jdist_dashboard_loads}; }")
    page.wait_for_function(f"() => {{ const d = ({read_dash})(); return d && d.points > 3; }}", timeout=60_000)
    before = page.evaluate(read_dash)
    page.wait_for_function(f"(b) => {{ const d = ({read_dash})(); return d.points > b.points && d.seq > b.seq; }}",
                           arg=before, timeout=60_000)
    after = page.evaluate(read_dash)
    assert after["gaps"] == 0 and after["progress"].startswith("step "), after
    for panel in ("loss", "time", "memory", "throughput", "state"):
        assert dash.locator(f".jp-jdist-chartbox[data-panel={panel}] svg").count() == 1, panel
    assert dash.locator(".jp-jdist-chart-loss path.jp-jdist-band").count() >= 1  # min–max band
    page.wait_for_function(VAL_DRAWN.format(root=".jp-jdist-dash"), timeout=30_000)  # val_loss: its own line
    assert dash.locator(".jp-jdist-chart-time rect.jp-jdist-bar").count() >= 2  # compute (+ comm) per rank
    # two dashboards so far (the warm-up cell's, now its static summary, and this one): the chart code
    # was loaded once in this page
    assert after["loads"] == 1, after
    assert page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea img").count() == 1
    dash.scroll_into_view_if_needed()
    settle(page)
    shot(page, "1-notebook-and-sidebar-live.png")

    # the run view in the main area: the dashboard's four panels, updating
    run.locator(".jp-jdist-open").click()
    view = page.locator(".jp-jdist-runview")
    view.wait_for(timeout=20_000)
    page.wait_for_function(
        "() => { const p = document.querySelector('.jp-jdist-runview .jp-jdist-chart-loss path.jp-jdist-line');"
        " return p && Number(p.dataset.points) > 3; }", timeout=30_000)
    for panel in ("loss", "time", "memory", "throughput", "state"):
        assert view.locator(f".jp-jdist-chartbox[data-panel={panel}] svg").count() == 1, panel
    assert view.locator(".jp-jdist-chart-loss path.jp-jdist-band").count() >= 1  # min–max band
    page.wait_for_function(VAL_DRAWN.format(root=".jp-jdist-runview"), timeout=30_000)
    assert view.locator(".jp-jdist-chart-time rect.jp-jdist-bar").count() >= 2  # compute (+ comm) per rank
    assert view.locator(".jp-jdist-chart-memory rect.jp-jdist-bar").count() >= 4  # current + peak (+ state) per rank
    records1 = int(view.get_attribute("data-records"))
    page.wait_for_function("(before) => Number(document.querySelector('.jp-jdist-runview').dataset.records) > before",
                           arg=records1, timeout=60_000)
    assert view.get_attribute("data-status") == "running"
    shot(page, "2-run-view-live.png")

    # Interrupt from the sidebar stops the training
    interrupt = card.locator("button[data-action=interrupt]")
    assert interrupt.is_enabled()
    assert card.locator("button[data-action=stop]").is_disabled()  # the kernel is busy
    interrupt.click()
    card.locator(".jp-jdist-message-ok").wait_for(timeout=30_000)
    assert "Interrupted the kernel" in card.locator(".jp-jdist-message").inner_text()
    page.wait_for_function(
        "() => document.querySelectorAll('#jdist-sidebar .jp-jdist-cluster tr[data-state=idle]').length === 2"
        " && document.querySelector('#jdist-sidebar .jp-jdist-kernel-idle')", timeout=120_000)
    page.wait_for_selector(".jp-jdist-runview[data-status=interrupted]", timeout=60_000)
    sidebar.locator(".jp-jdist-run[data-status=interrupted]").first.wait_for(timeout=60_000)
    settle(page)
    shot(page, "3-run-view-after-interrupt.png")

    # back in the notebook: the cell reports the interrupt; the dashboard became its static SVG
    page.locator(".lm-TabBar-tab", has_text="train.ipynb").first.click()
    out = page.locator(".jp-Notebook .jp-Cell").nth(3).locator(".jp-OutputArea")
    out.get_by_text(re.compile("Interrupted: every rank received SIGINT and stopped")).first.wait_for(timeout=30_000)
    out.locator("img").first.wait_for(timeout=30_000)
    assert "KeyboardInterrupt" in out.inner_text()
    out.get_by_text(re.compile("Interrupted: every rank received SIGINT")).first.scroll_into_view_if_needed()
    settle(page)
    shot(page, "4-notebook-after-interrupt.png")

    # dark theme: the same views stay readable
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=20_000)
    page.locator(".lm-TabBar-tab", has_text="Run ").first.click()
    page.wait_for_selector(".jp-jdist-runview .jp-jdist-chart-loss", state="visible", timeout=20_000)
    settle(page)
    shot(page, "5-dark-theme.png")
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")

    # a jdist.tune sweep from the notebook (the last two cells): listed in the sidebar while it runs, then done;
    # its view (the notebook's timeline, curves and trials table) opens in the main area
    page.locator(".lm-TabBar-tab", has_text="train.ipynb").first.click()
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'", timeout=20_000)
    page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = 5;"
                  " window.jupyterapp.commands.execute('notebook:run-all-below'); }")
    sweep = sidebar.locator(".jp-jdist-sweep[data-sweep=lab-sweep]")
    sidebar.locator(".jp-jdist-sweep[data-sweep=lab-sweep][data-status=running]").wait_for(timeout=120_000)
    assert "2 slots × 1 rank" in sweep.locator(".jp-jdist-sweep-progress").inner_text()
    sidebar.locator(".jp-jdist-sweep[data-sweep=lab-sweep][data-status=done][data-ended='8']").wait_for(timeout=120_000)
    assert "8 / 8 trials" in sweep.locator(".jp-jdist-sweep-progress").inner_text()
    assert sweep.locator(".jp-jdist-sweep-best").inner_text().startswith("best loss ")
    sweep.locator(".jp-jdist-open").click()
    page.wait_for_selector(".jp-jdist-sweepview[data-status=done]", timeout=30_000)
    frame = page.frame_locator(".jp-jdist-sweepview .jp-jdist-sweep-frame")
    frame.locator("text=slot 1").first.wait_for(timeout=20_000)
    assert frame.locator("svg").count() >= 3 and frame.locator("table tr").count() == 9  # header + 8 trials
    assert page.locator(".jp-Notebook .jp-Cell").nth(6).locator(".jdist-sweep svg").count() >= 3  # the notebook's own
    settle(page)
    shot(page, "6-sweep-view.png")

    # JupyterLab's Debugger panel on a %%distributed cell: a gutter breakpoint on line 4 stops rank 1 there
    # (rank 0 waits in its all_reduce); the panel shows rank 1's stack and variables; continue ends the cell
    page.locator(".lm-TabBar-tab", has_text="train.ipynb").first.click()
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext.session.kernel.status === 'idle'; }", timeout=120_000)
    page.locator(".jp-DebuggerBugButton").click()
    page.wait_for_selector(".jp-DebuggerBugButton[aria-pressed=true]", timeout=30_000)
    cell = page.locator(".jp-Notebook .jp-Cell").nth(7)
    cell.scroll_into_view_if_needed()
    cell.locator("div.cm-gutter.cm-breakpoint-gutter").wait_for(timeout=30_000)
    line4 = cell.locator(".cm-line").nth(3).bounding_box()
    gutter = cell.locator("div.cm-gutter.cm-breakpoint-gutter").bounding_box()
    page.mouse.click(gutter["x"] + gutter["width"] / 2, line4["y"] + line4["height"] / 2)
    page.wait_for_selector(".jp-DebuggerBreakpoint", timeout=20_000)  # listed in the panel's Breakpoints
    page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = 7;"
                  " window.jupyterapp.commands.execute('notebook:run-cell'); }")
    frame = page.locator(".jp-DebuggerCallstackFrame").first
    frame.wait_for(timeout=120_000)
    variables = page.locator(".jp-DebuggerVariables")
    variables.get_by_text("seen").first.wait_for(timeout=30_000)
    page.wait_for_function("() => document.querySelectorAll('#jdist-sidebar .jp-jdist-cluster tr[data-state=paused]')"
                           ".length === 1", timeout=30_000)  # the sidebar: rank 1 paused
    assert "41" in variables.inner_text(), variables.inner_text()  # rank 1's own value: 40 + rank
    assert cell.locator(".jp-DebuggerEditor-highlight, .cm-line.jp-DebuggerEditor-highlight").count() >= 1
    variables.get_by_text("seen").first.scroll_into_view_if_needed()
    settle(page)
    shot(page, "7-debugger-panel.png")
    page.evaluate("() => { window.jupyterapp.commands.execute('debugger:continue'); }")
    cell.locator(".jp-OutputArea").get_by_text("sum 81.0").wait_for(timeout=60_000)
    assert "HangError" not in cell.locator(".jp-OutputArea").inner_text()
    page.locator(".jp-DebuggerBugButton").click()  # the panel off: the ranks forget the breakpoints
    page.wait_for_selector(".jp-DebuggerBugButton[aria-pressed=false]", timeout=30_000)

    # our extension's code never throws; other code's errors (widgets being closed...) are only shown
    ours = [e for e in errors if "/extensions/jdist/" in e]
    assert not ours, ours
    if errors:
        print("page errors outside the jdist extension:", *errors, sep="\n")
    print(f"browser test: {time.monotonic() - t0:.1f} s")


def wide_run(run_dir: Path, world: int = 256, steps: int = 120) -> str:
    """A finished run of ``world`` ranks on 32 hosts, written with the kernel's own run log:
    rank 37 (node04) is 60% slower than the median, host node20's other ranks 25%."""
    from jdist.metrics import Run, RunLog, new_run_id

    hosts = {r: f"node{r // 8:02d}" for r in range(world)}
    run = Run(new_run_id(), world, backend="ddp", hosts=hosts, code="# 256 synthetic ranks", started=time.time() - 60)
    log = RunLog(run, run_dir)
    for start in range(0, steps, 20):
        recs = []
        for s in range(start, start + 20):
            for r in range(world):
                slow = 1.6 if r == 37 else 1.25 if hosts[r] == "node20" else 1.0
                step_t = 0.1 * slow * (1 + 0.02 * ((r * 7 + s) % 5))
                recs.append({"rank": r, "cell": 1, "seq": s, "step": s, "time": run.started + s * 0.12,
                             "loss": 2.0 / (s + 1) + (r % 8) / 100, "step_time_s": 3.0 if s == 0 else step_t,
                             "comm_time_s": step_t * (0.1 if r == 37 else 0.35), "mem_bytes": (900 + r) * 2**20,
                             "mem_peak_bytes": (1200 + r) * 2**20})
        log.append(run.add(recs))
    run.status, run.ended = "finished", time.time()
    log.close()
    return run.run_id


def pipeline_run(run_dir: Path, p: int = 4, m: int = 4, steps: int = 6) -> str:
    """A finished 4-rank run of a GPipe schedule on a ("dp", "tp") mesh as jdist records it (rows and records
    in the shapes jdist.rank.mesh.pipeline sends), written with the kernel's own run log: 20 ms forwards and
    backwards, a 120 ms step."""
    from jdist.metrics import Run, RunLog, new_run_id

    run = Run(new_run_id(), p, backend="ddp", code="# a 4-stage GPipe", started=time.time() - 60)
    log = RunLog(run, run_dir)
    cost = 0.02
    for step in range(steps):
        t0 = run.started + step * (m + p) * 2 * cost
        recs = []
        for r in range(p):
            rows = [[step, r, r, i, "F", t0 + (r + i) * cost, t0 + (r + i + 1) * cost] for i in range(m)]
            back = t0 + (m + p - 1) * cost
            rows += [[step, r, r, i, "B", back + (p - 1 - r + i) * cost, back + (p - r + i) * cost] for i in range(m)]
            message = {"v": 4, "kind": "pipeline", "cell": 1, "rank": r, "rows": rows}
            run.add_pipeline(message)
            log.append_pipeline(message)
            recs.append({"rank": r, "cell": 1, "seq": step, "step": step, "time": t0, "loss": 1.0 / (step + 1),
                         "step_time_s": (m + p) * 2 * cost, "comm_time_s": 0.05, "comm_time_pp_s": 0.04,
                         "comm_time_dp_s": 0.002 * (r + 1), "pp_stage": r, "bubble_frac": 0.45})
        log.append(run.add(recs))
    run.status, run.ended = "finished", time.time()
    log.close()
    return run.run_id


def straggler_run(run_dir: Path, world: int = 4, steps: int = 60) -> str:
    """A finished 4-rank DDP run in which rank 2 waits 32 ms a step for its DataLoader (the others wait for it in
    the all-reduce), its straggler named by the kernel's own StragglerWatch over 1 s windows, written with the
    kernel's own run log."""
    from jdist.metrics import Run, RunLog, new_run_id
    from jdist.metrics.stragglers import StragglerWatch

    run = Run(new_run_id(), world, backend="ddp", code="# rank 2 waits for data", started=time.time() - 60)
    log = RunLog(run, run_dir)
    watch = StragglerWatch(world, window_s=1.0, flagged=run.stragglers)
    watch.poll(0.0)
    for start in range(0, steps, 20):
        recs = [{"rank": r, "cell": 1, "seq": s, "step": s, "time": run.started + s * 0.046, "loss": 1.0 / (s + 1),
                 "step_time_s": 0.046, "comm_time_s": 0.0107 if r == 2 else 0.044,
                 "data_time_s": 0.032 if r == 2 else 0.0004} for s in range(start, start + 20) for r in range(world)]
        log.append(run.add(recs))
        watch.add(recs)
        watch.poll(1.0 + start / 20)
    run.status, run.ended = "finished", time.time()
    log.close()
    assert [s.rank for s in run.stragglers] == [2]
    return run.run_id


def open_run(page, lab, run_id: str) -> None:
    """Load JupyterLab, show the Distributed sidebar until run ``run_id``'s card is visible in it (the
    restored layout may show the file browser over a sidebar activated before it), and open the run view.
    (The workspace may have the sidebar open already: a click on its tab would close it.)"""
    page.goto(f"{lab.url}/lab?token={lab.token}")
    page.wait_for_function("() => window.jupyterapp && document.querySelector(\"li.lm-TabBar-tab[data-id='jdist-sidebar']\")",
                           timeout=90_000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")
    page.wait_for_function(f"() => {{ window.jupyterapp.shell.activateById('jdist-sidebar');"
                           f" const c = document.querySelector(\"#jdist-sidebar .jp-jdist-run[data-run-id='{run_id}']\");"
                           f" return c && c.offsetParent; }}", timeout=60_000, polling=500)
    page.locator(f"#jdist-sidebar .jp-jdist-run[data-run-id='{run_id}'] .jp-jdist-open").click()


@pytest.mark.timeout(300)
def test_the_pipeline_and_mesh_dimension_panels_read_in_the_run_view(lab, browser):
    """The run view of a pipeline run: the newest step as a Gantt chart (a row per stage, forward and
    backward as colour, idle blank, the measured bubble beside the theory) and the communication of each
    mesh dimension per rank, stacked."""
    run_id = pipeline_run(lab.dirs["runs"])
    page = browser.new_page(viewport={"width": 1500, "height": 1300})
    console: list[str] = []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    try:
        open_run(page, lab, run_id)
        view = page.locator(".jp-jdist-runview")
        gantt = view.locator(".jp-jdist-chart-pipeline")
        gantt.locator("image.jp-jdist-heat").wait_for(timeout=30_000)
        assert gantt.locator("image.jp-jdist-heat").get_attribute("data-rows") == "4"
        assert gantt.locator("text.jp-jdist-heat-group").all_text_contents() == [f"stage {r} r{r}" for r in range(4)]
        assert sorted(gantt.locator(".jp-jdist-chart-legend").all_text_contents()) == ["backward", "forward"]
        title = gantt.locator(".jp-jdist-chart-title").text_content()
        assert "pipeline, step 5: bubble 0.45 measured, (p-1)/(m+p-1) = 0.43 (p=4, m=4)" in title, title
        dims = view.locator(".jp-jdist-chart-comm_dims")
        assert sorted(dims.locator(".jp-jdist-chart-legend").all_text_contents()) == ["dp", "pp"]
        assert dims.locator("rect title").count() == 8  # a bar per rank and dimension
        gantt.scroll_into_view_if_needed()
        settle(page)
        shot(page, "9-run-view-pipeline.png")
    except BaseException:
        shot(page, "failure-pipeline.png")
        print("browser console:", *console[-40:], sep="\n")
        raise
    finally:
        page.close()


@pytest.mark.timeout(300)
def test_a_256_rank_run_reads_in_the_run_view(lab, browser):
    """The run view of a 256-rank run: the ranks' step-time distribution, per-host memory, the
    slowest ranks with their hosts, and rank × step heatmaps grouped by host."""
    run_id = wide_run(lab.dirs["runs"])
    page = browser.new_page(viewport={"width": 1500, "height": 1300})
    try:
        open_run(page, lab, run_id)
        view = page.locator(".jp-jdist-runview")
        view.locator(".jp-jdist-chart-step_heat image.jp-jdist-heat").wait_for(timeout=30_000)
        heat = view.locator(".jp-jdist-chart-step_heat image.jp-jdist-heat")
        assert heat.get_attribute("data-rows") == "256" and int(heat.get_attribute("data-columns")) == 60
        assert heat.get_attribute("href").startswith("data:image/png")
        groups = view.locator(".jp-jdist-chart-step_heat text.jp-jdist-heat-group").all_text_contents()
        assert groups == [f"node{h:02d}" for h in range(32)]
        rows = view.locator(".jp-jdist-chart-slowest g.jp-jdist-table-row")
        assert rows.count() == 8
        first = rows.first.locator("text").all_text_contents()
        assert first[:2] == ["r37", "node04"] and first[3] == "+60%", first
        assert {rows.nth(i).locator("text").nth(1).text_content() for i in range(1, 8)} == {"node20"}
        assert "slowest host node20" in view.locator(".jp-jdist-chart-slowest .jp-jdist-table-note").text_content()
        assert view.locator(".jp-jdist-chart-time path.jp-jdist-band").count() == 2  # step time and communication
        assert view.locator(".jp-jdist-chart-memory .jp-jdist-tick").all_text_contents()[-1].startswith("node")
        assert view.locator(".jp-jdist-chart-comm_heat image.jp-jdist-heat").get_attribute("data-rows") == "256"
        view.locator(".jp-jdist-chart-slowest").scroll_into_view_if_needed()
        settle(page)
        shot(page, "8-run-view-256-ranks.png")
    finally:
        page.close()


def test_a_straggler_is_named_with_its_cause_in_the_run_views_slowest_ranks_table(lab, browser):
    """Four ranks (the table is shown on any number once a rank is named): the straggler first, its data-wait
    share and flag, the named line under the table."""
    run_id = straggler_run(lab.dirs["runs"])
    page = browser.new_page(viewport={"width": 1500, "height": 1300})
    try:
        open_run(page, lab, run_id)
        # (the workspace may restore other run views, hidden behind this one: the visible one's table)
        table = page.locator(".jp-jdist-runview:visible .jp-jdist-chart-slowest")
        table.locator("g.jp-jdist-table-row").first.wait_for(timeout=30_000)
        first = table.locator("g.jp-jdist-table-row").first.locator("text").all_text_contents()
        assert first[0] == "r2" and first[-2:] == ["70%", "straggler (data)"], first
        note = table.locator(".jp-jdist-table-note").text_content()
        assert note.startswith("straggler: rank 2, ") and ", waiting for data; median " in note, note
        table.scroll_into_view_if_needed()
        settle(page)
        shot(page, "10-run-view-straggler.png")
    finally:
        page.close()
