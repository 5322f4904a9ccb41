"""A sweep as it is shown: in the notebook (one display redrawn in place) and for the sidebar (``sweep.json``
and ``view.html`` in the sweep's folder)."""

from __future__ import annotations

import collections
import html
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .requests import plain_value

if TYPE_CHECKING:
    from .driver import Sweep

#: Trials in the view's table (the running ones first, then the newest) and curves drawn.
TABLE_ROWS = 40


CURVES = 30


class SweepView:
    """The sweep in the notebook (``show``): progress, best so far and the trials table, redrawn at most
    twice a second in one display (its last state stays in the saved notebook); and the same for the
    sidebar: ``sweep.json`` (:class:`jdist.protocol.SweepSummaryModel`) and ``view.html`` in the
    sweep's folder, each replaced whole (never read half-written)."""

    def __init__(self, sweep: Sweep, show: bool = True, every_s: float = 0.5):
        self.sweep = sweep
        self.show = show
        self.every_s = every_s
        self.last = 0.0
        self.handle: Any = None

    def update(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < self.every_s:
            return
        self.last = now
        rows = self.rows()
        page = self.html(rows)
        try:
            _replace(self.sweep.folder / "view.html", page)
            _replace(self.sweep.folder / "sweep.json", json.dumps(self.summary(rows), allow_nan=False))
        except (OSError, ValueError) as exc:  # a full disk, a value JSON cannot carry: the sweep goes on
            if final:
                print(f"jdist.tune: the sidebar's copy of the sweep could not be written ({exc}).")
        if not self.show:
            return
        from IPython.display import HTML, display

        out = HTML(page)
        if self.handle is None:
            self.handle = display(out, display_id=True)
        else:
            self.handle.update(out)

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The sweep for the sidebar (a :class:`jdist.protocol.SweepSummaryModel`)."""
        sw = self.sweep
        best = _best(sw.study)
        return {"name": sw.folder.name, "status": sw.status, "cluster_id": sw.cluster.cluster_id,
                "notebook": None, "started": sw.started, "ended": None if sw.status == "running" else time.time(),
                "updated": time.time(), "trials": sw.trials, "per_trial": sw.per_trial, "slots": len(sw.slots),
                "metric": sw.metric, "direction": sw.study.directions[0].name.lower(),
                "counts": dict(collections.Counter(r["state"] for r in rows)),
                "best_trial": best.number if best else None,
                "best_value": best.value if best and math.isfinite(best.value) else None,
                "best_params": {k: plain_value(v) for k, v in best.params.items()} if best else None,
                "journal": str(sw.folder / "journal.log")}

    def rows(self) -> list[dict[str, Any]]:
        sw = self.sweep
        running = {tr.trial.number for tr in sw.running.values()}
        queued = {tr.trial.number for tr in sw.queued.values()}
        # when each trial ran on its ranks (Optuna's datetime_start is when it was asked: a queued trial waits)
        ran = {trial: (start, end) for _, trial, start, end, _ in sw.timeline}
        ran.update((tr.trial.number, (tr.started, None)) for tr in sw.running.values() if tr.started is not None)
        rows = []
        for t in sw.study.get_trials(deepcopy=False):
            state = ("QUEUED" if t.number in queued else "RUNNING" if t.number in running
                     else "INTERRUPTED" if t.user_attrs.get("jdist_interrupted") else t.state.name)
            end = t.datetime_complete.timestamp() if t.datetime_complete else time.time()
            start = t.datetime_start.timestamp() if t.datetime_start else end
            if t.number in ran:
                start, end = ran[t.number][0], ran[t.number][1] or time.time()
            elif state == "QUEUED":
                start = end
            last = max(t.intermediate_values) if t.intermediate_values else None
            rows.append({"trial": t.number, "state": state, "slot": t.user_attrs.get("jdist_slot"),
                         "params": t.params, "value": t.value,
                         "last": t.intermediate_values[last] if last is not None else None, "step": last,
                         "seconds": end - start, "error": t.user_attrs.get("jdist_error")})
        return rows

    def html(self, rows: list[dict[str, Any]] | None = None) -> str:
        from jdist.metrics import sweep as panels

        sw = self.sweep
        rows = self.rows() if rows is None else rows
        counts = collections.Counter(r["state"] for r in rows)
        head = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        single = len(sw.study.directions) == 1
        best = _best(sw.study)
        best_line = (f"best trial {best.number}: <b>{best.value:.6g}</b> {html.escape(_fmt_params(best.params))}"
                     if best is not None else "no trial completed yet" if single else "")
        cells = []
        for r in sorted(rows, key=lambda r: (r["state"] not in ("RUNNING", "QUEUED"), -r["trial"]))[:TABLE_ROWS]:
            value = f"{r['value']:.6g}" if isinstance(r["value"], float) else ""
            last = f"{r['last']:.4g} @ {r['step']}" if r["last"] is not None else ""
            colour = panels.COLOURS.get(r["state"], "#757575")
            cells.append(f"<tr><td>{r['trial']}</td><td style='color:{colour}'>{r['state'].lower()}</td>"
                         f"<td>{'' if r['slot'] is None else r['slot']}</td>"
                         f"<td>{html.escape(_fmt_params(r['params']))}</td><td>{value}</td><td>{last}</td>"
                         f"<td>{r['seconds']:.1f}</td><td>{html.escape(r['error'] or '')}</td></tr>")
        more = f"<div>... {len(rows) - TABLE_ROWS} more: jdist.last_sweep()</div>" if len(rows) > TABLE_ROWS else ""
        now = time.time()
        spans = [*sw.timeline, *((tr.slot, tr.trial.number, tr.started, None, "RUNNING")
                                 for tr in sw.running.values() if tr.started is not None)]
        trials = sw.study.get_trials(deepcopy=False)
        states = {r["trial"]: r["state"] for r in rows}
        recent = sorted((t for t in trials if t.intermediate_values), key=lambda t: t.number)[-CURVES:]
        curves = {t.number: (states.get(t.number, t.state.name), list(t.intermediate_values.items())) for t in recent}
        done = [t for t in trials if t.state.name == "COMPLETE" and single]
        figures = [panels.curves_svg(curves, sw.metric or "reported value"),
                   panels.best_svg([(t.number, t.value) for t in done], sw.study.direction.name.lower())]
        return ("<div class='jdist-sweep' style='font-family:sans-serif;font-size:12px'>"
                f"<b>jdist.tune {html.escape(sw.study.study_name)}</b>: {len(sw.slots)} slot(s) of {sw.per_trial} "
                f"rank(s), {head or 'starting'}; {best_line}"
                f"<div>{panels.timeline_svg(spans, len(sw.slots), now)}</div>"
                f"<div style='display:flex;gap:12px'>{''.join(figures)}</div>"
                f"<div>{panels.parallel_svg([(t.params, t.value) for t in done], sw.study.direction.name.lower())}</div>"
                "<table><tr><th>trial</th><th>state</th><th>slot</th><th>params</th><th>value</th>"
                f"<th>last reported</th><th>s</th><th>error</th></tr>{''.join(cells)}</table>{more}</div>")


def _best(study: Any) -> Any:
    """The study's best trial; None before one completed, or with several objectives (no single best)."""
    if len(study.directions) != 1:
        return None
    try:
        return study.best_trial
    except ValueError:
        return None


def _replace(path: Path, text: str) -> None:
    """Write ``path`` whole: readers see the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))
