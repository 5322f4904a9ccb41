"""Live notebook dashboard for a :class:`~jdist.metrics.Run`, and its static replacement.

While a ``%%distributed`` cell runs, :class:`Dashboard` shows an ipywidgets view under
the cell: a header line, a progress bar and a plotly ``FigureWidget`` with four panels
(loss across ranks, per-rank compute/communication time, per-rank memory, throughput).
:meth:`Dashboard.finish` replaces that view in place with :func:`static_bundle`: a PNG
drawn with matplotlib (and the summary as text), so a saved notebook shows the results
without a kernel (GitHub, nbviewer).

Long series are thinned to :data:`MAX_POINTS` points in the live figure (:func:`thin`);
the PNG shows every step.

Example:
    >>> from jdist.metrics import Run
    >>> run = Run("demo", world_size=1)
    >>> run.add([{"rank": 0, "seq": 0, "step": 0, "loss": 1.0, "step_time_s": 0.5}])  # doctest: +ELLIPSIS
    [...]
    >>> panel_data(run).loss_mean
    [1.0]
"""

from __future__ import annotations

import base64
import functools
import html
import io
import math
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from jdist.metrics import Run

#: Steps over which the per-rank compute and communication times are averaged.
RECENT_STEPS = 20
#: The most points a line of the live figure gets; longer series are bucketed (:func:`thin`).
MAX_POINTS = 1000
_MIB = 2**20
#: Colours shared by the live figure and the PNG: compute, memory now, loss and throughput in
#: blue; communication and peak memory in orange; model+optimizer state in green.
_BLUE, _ORANGE, _GREEN = "#1f77b4", "#ff7f0e", "#2ca02c"
_TIME_TITLE = f"time per step (s), last {RECENT_STEPS} steps"


@dataclass(frozen=True)
class PanelData:
    """What the four dashboard panels show; missing values are ``None``."""

    loss_name: str | None
    loss_steps: list[Any]
    loss_mean: list[float | None]
    loss_min: list[float | None]
    loss_max: list[float | None]
    rank_labels: list[str]
    compute_s: list[float | None]
    comm_s: list[float | None]
    mem_title: str
    mem_mib: list[float | None]
    mem_peak_mib: list[float | None]
    state_mib: list[float | None]
    throughput_title: str
    throughput_steps: list[Any]
    throughput: list[float | None]


def loss_metric(run: Run) -> str | None:
    """The metric the loss panel shows: ``"loss"`` if logged, else the first user scalar.

    >>> loss_metric(Run("x", 1, records=[])) is None
    True
    """
    names = run.metric_names
    if "loss" in names:
        return "loss"
    return names[0] if names else None


def total_samples_per_s(run: Run) -> tuple[list[Any], list[float]]:
    """Per step, the sum over ranks of ``samples_per_s``: ``(steps, totals)``.

    Each rank's first record of the cell (``seq`` 0) is left out: its ``step_time_s``
    covers the time since the cell started (imports, data loading), which would show as
    a dip at the first step. Only steps that every rank reporting ``samples_per_s`` has
    reached are included, so a live curve does not dip at a step that some ranks have
    not logged yet.

    >>> run = Run("x", 2)
    >>> _ = run.add([{"rank": r, "seq": s, "step": s, "samples_per_s": 10.0 * (r + 1) + s}
    ...              for s in (0, 1) for r in (0, 1)])
    >>> total_samples_per_s(run)
    ([1], [32.0])
    """
    per_step: dict[Any, dict[int, float]] = defaultdict(dict)
    for rec in run.records:
        value, step = rec.get("samples_per_s"), rec.get("step")
        if rec["seq"] == 0 or step is None or not isinstance(value, (int, float)) or math.isnan(value):
            continue
        per_step[step][rec["rank"]] = float(value)
    reporting = {rank for by_rank in per_step.values() for rank in by_rank}
    steps = sorted(s for s, by_rank in per_step.items() if len(by_rank) == len(reporting))
    return steps, [sum(per_step[s].values()) for s in steps]


def steps_per_s(run: Run) -> tuple[list[Any], list[float]]:
    """Per logged step after the first, steps/s from the slowest rank's ``step_time_s``: ``(steps, rates)``.

    A record's ``step_time_s`` covers the steps since the previous logged step, so
    logging every k-th step still gives steps/s. The first logged step is left out: its
    ``step_time_s`` covers the time since the cell started.

    >>> run = Run("x", 1)
    >>> _ = run.add([{"rank": 0, "seq": i, "step": s, "step_time_s": 2.0} for i, s in enumerate((0, 4, 6))])
    >>> steps_per_s(run)
    ([4, 6], [2.0, 1.0])
    """
    steps, _, _, slowest = run.aggregate("step_time_s")
    rates = [(step - prev) / seconds if seconds > 0 else math.nan
             for prev, step, seconds in zip(steps, steps[1:], slowest[1:])]
    return steps[1:], rates


def seconds_per_step(run: Run) -> float | None:
    """Wall time per step over the run so far, from the records' ``time``, or ``None``.

    The time from the first logged step to the latest (across ranks), over the steps
    between them: steady over a long run (the ETA does not jump with a few slow steps),
    and the start-up before the first step does not count.

    >>> run = Run("x", 2)
    >>> _ = run.add([{"rank": r, "seq": s, "step": s, "time": 100.0 + 0.5 * s + 0.25 * r}
    ...              for s in range(3) for r in (0, 1)])
    >>> seconds_per_step(run)  # (100.0 at step 0 to 101.25 at step 2) / 2 steps
    0.625
    """
    timed = [(rec["step"], rec["time"]) for rec in run.records
             if rec.get("step") is not None and rec.get("time") is not None]
    if not timed:
        return None
    (first_step, first_time), (last_step, last_time) = min(timed), max(timed)
    return (last_time - first_time) / (last_step - first_step) if last_step > first_step else None


def thin(steps: list[Any], values: list[float | None], reduce: Callable[[list[float]], float] = statistics.fmean,
         max_points: int = MAX_POINTS) -> tuple[list[Any], list[float | None]]:
    """``(steps, values)`` with at most ``max_points`` points: consecutive steps in equal buckets.

    Each bucket is drawn at its last step with ``reduce`` of its values (``None`` left out;
    ``None`` if all are). Series up to ``max_points`` long are returned as they are.

    >>> thin([0, 1, 2, 3, 4], [1.0, 3.0, None, 2.0, 5.0], min, max_points=3)
    ([1, 3, 4], [1.0, 2.0, 5.0])
    """
    n = len(steps)
    size = math.ceil(n / max_points)
    if size <= 1:
        return steps, values
    xs, ys = [], []
    for i in range(0, n, size):
        bucket = [v for v in values[i : i + size] if v is not None]
        xs.append(steps[min(i + size, n) - 1])
        ys.append(reduce(bucket) if bucket else None)
    return xs, ys


def steps_done(run: Run) -> int:
    """Steps completed, from the highest logged step (0-based), capped at ``total_steps``.

    >>> run = Run("x", 1, total_steps=10)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 3}])
    >>> steps_done(run)
    4
    """
    last = run.max_step()
    done = 0 if last is None else int(last) + 1
    return min(done, run.total_steps) if run.total_steps is not None else done


def panel_data(run: Run) -> PanelData:
    """Compute everything the four panels show from ``run``'s current records.

    >>> panel_data(Run("x", 2, records=[])).rank_labels
    ['rank 0', 'rank 1']
    """
    name = loss_metric(run)
    loss_steps, mean, low, high = run.aggregate(name) if name else ([], [], [], [])
    ranks = sorted(set(range(run.world_size)) | set(run.ranks))
    step_t = run.per_rank_mean("step_time_s", last=RECENT_STEPS, skip_first=True)
    comm_t = run.per_rank_mean("comm_time_s", last=RECENT_STEPS, skip_first=True)
    compute_t = run.per_rank_mean("compute_time_s", last=RECENT_STEPS, skip_first=True)
    compute: list[float | None] = []
    for r in ranks:
        if r in compute_t:
            compute.append(compute_t[r])
        elif r in step_t:
            compute.append(step_t[r] - comm_t.get(r, 0.0))
        else:
            compute.append(None)
    latest = [run.latest(r) or {} for r in ranks]
    # samples/s once a batch size is known, even before there is a point to draw (no title flip)
    if any(isinstance(rec.get("samples_per_s"), (int, float)) for rec in latest):
        tput_steps, tput = total_samples_per_s(run)
        tput_title = "throughput, samples/s (all ranks)"
    else:
        tput_steps, tput = steps_per_s(run)
        tput_title = "throughput, steps/s"
    return PanelData(
        loss_name=name,
        loss_steps=loss_steps,
        loss_mean=_finite(mean),
        loss_min=_finite(low),
        loss_max=_finite(high),
        rank_labels=[f"rank {r}" for r in ranks],
        compute_s=compute,
        comm_s=[comm_t.get(r) for r in ranks],
        mem_title="GPU memory (MiB)" if run.device_kind == "cuda" else "host memory RSS (MiB)",
        mem_mib=[_mib(rec.get("mem_bytes")) for rec in latest],
        mem_peak_mib=[_mib(rec.get("mem_peak_bytes")) for rec in latest],
        state_mib=[_mib(rec.get("state_bytes")) for rec in latest],
        throughput_title=tput_title,
        throughput_steps=tput_steps,
        throughput=_finite(tput),
    )


def static_figure(run: Run, dpi: int = 100) -> Any:
    """The four panels of ``run`` as a matplotlib ``Figure`` on an Agg canvas (no pyplot), every step drawn.

    >>> len(static_figure(Run("x", 1, records=[])).axes)
    4
    """
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    d = panel_data(run)
    fig = Figure(figsize=(10, 6.2), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(f"jdist run {run.run_id}: {run.status}, {run.world_size} ranks", fontsize=11)
    (ax_loss, ax_time), (ax_mem, ax_tput) = fig.subplots(2, 2)

    def arr(values: list[float | None]) -> Any:
        return np.array(values, dtype=float)

    ax_loss.set_title(d.loss_name or "loss", fontsize=10)
    if d.loss_steps:
        ax_loss.fill_between(d.loss_steps, arr(d.loss_min), arr(d.loss_max), color=_BLUE, alpha=0.25, label="min–max")
        ax_loss.plot(d.loss_steps, arr(d.loss_mean), color=_BLUE, label="mean over ranks")
        ax_loss.legend(fontsize=8)
    ax_loss.set_xlabel("step")

    x = np.arange(len(d.rank_labels))
    compute = np.nan_to_num(arr(d.compute_s))
    ax_time.set_title(_TIME_TITLE, fontsize=10)
    ax_time.bar(x, compute, color=_BLUE, label="compute")
    ax_time.bar(x, np.nan_to_num(arr(d.comm_s)), bottom=compute, color=_ORANGE, label="communication")
    ax_time.set_xticks(x, d.rank_labels)

    ax_mem.set_title(d.mem_title, fontsize=10)
    ax_mem.bar(x - 0.27, np.nan_to_num(arr(d.mem_mib)), 0.27, color=_BLUE, label="current")
    ax_mem.bar(x, np.nan_to_num(arr(d.mem_peak_mib)), 0.27, color=_ORANGE, label="peak")
    state = ax_mem.bar(x + 0.27, np.nan_to_num(arr(d.state_mib)), 0.27, color=_GREEN, label="model+optimizer")
    if any(v for v in d.state_mib):  # small next to a process's RSS on CPU ranks: label the value
        ax_mem.bar_label(state, fmt="%.1f", fontsize=7, color=_GREEN)
    ax_mem.set_xticks(x, d.rank_labels)
    for ax in (ax_time, ax_mem):  # room above the bars for a legend that does not cover them
        ax.margins(y=0.25)
        ax.legend(fontsize=8, ncols=len(ax.get_legend_handles_labels()[1]), loc="upper center",
                  columnspacing=1.0, handlelength=1.5)

    ax_tput.set_title(d.throughput_title, fontsize=10)
    if d.throughput_steps:
        ax_tput.plot(d.throughput_steps, arr(d.throughput), color=_BLUE)
    ax_tput.set_xlabel("step")
    return fig


def render_png(run: Run, dpi: int = 100) -> bytes:
    """:func:`static_figure` of ``run`` as PNG bytes.

    >>> render_png(Run("x", 1, records=[]))[:4]
    b'\\x89PNG'
    """
    buf = io.BytesIO()
    static_figure(run, dpi).savefig(buf, format="png")
    return buf.getvalue()


def static_bundle(run: Run) -> dict[str, Any]:
    """The kernel-free figure of ``run``: ``image/png`` (bytes) with ``text/plain`` (the summary) as fallback.

    Frontends show the PNG; :meth:`Dashboard.finish` prints the summary text below it, so
    the saved notebook holds the image once and the text once.

    >>> sorted(static_bundle(Run("x", 1, records=[])))
    ['image/png', 'text/plain']
    """
    return {"text/plain": run.summary(), "image/png": render_png(run)}


def _base_figure() -> Any:
    """The dashboard's plotly figure with empty traces (a plain Figure: no widget, no comm)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    # Units go in the subplot titles (no y-axis titles): less clutter in a narrow window.
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=["loss", _TIME_TITLE, "memory per rank", "throughput"],
        horizontal_spacing=0.14,
        vertical_spacing=0.2,
    )
    band = dict(mode="lines", line=dict(width=0, color="rgba(31,119,180,0.3)"))  # _BLUE
    fig.add_trace(go.Scatter(name="min", showlegend=False, **band), row=1, col=1)
    fig.add_trace(
        go.Scatter(name="min–max", fill="tonexty", fillcolor="rgba(31,119,180,0.25)", **band), row=1, col=1
    )
    fig.add_trace(go.Scatter(name="mean", mode="lines", line=dict(color=_BLUE)), row=1, col=1)
    # barmode "group" for the memory bars; communication is stacked on compute through `base`.
    fig.add_trace(go.Bar(name="compute", offsetgroup="time", marker_color=_BLUE), row=1, col=2)
    fig.add_trace(go.Bar(name="communication", offsetgroup="time", marker_color=_ORANGE), row=1, col=2)
    fig.add_trace(go.Bar(name="memory now", offsetgroup="now", marker_color=_BLUE), row=2, col=1)
    fig.add_trace(go.Bar(name="memory peak", offsetgroup="peak", marker_color=_ORANGE), row=2, col=1)
    fig.add_trace(go.Bar(name="model+optimizer", offsetgroup="state", marker_color=_GREEN,
                         texttemplate="%{y:.1f}", textposition="outside", cliponaxis=False), row=2, col=1)
    fig.add_trace(go.Scatter(name="throughput", mode="lines", line=dict(color=_BLUE), showlegend=False), row=2, col=2)
    fig.update_layout(
        height=520,
        margin=dict(l=55, r=15, t=35, b=40),
        barmode="group",
        legend=dict(orientation="h", traceorder="normal", yanchor="top", y=-0.12, x=0),
        font=dict(size=11),
    )
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="step", row=2, col=2)
    fig.update_annotations(font_size=12)  # subplot titles keep plotly's 16 px otherwise: clipped when narrow
    fig.update_yaxes(exponentformat="e", row=1, col=1)  # small losses read 1e-13, not "100f"
    return fig


def live_figure() -> Any:
    """A new plotly ``FigureWidget`` for one dashboard, sized to follow the page (with ``_FitWidth``).

    One per dashboard, closed by :meth:`Dashboard.finish`. Reusing one across cells would
    save sending plotly.js (5 MB) again, but plotly 7.1's widget view leaves its listeners on
    the model when the view is removed, and a reused figure then stays blank in the browser.
    """
    import plotly.graph_objects as go

    fig = go.FigureWidget(_base_figure())
    fig._config = {"responsive": True}
    return fig


@functools.cache
def _fit_width_class() -> type:
    """The class of :class:`Dashboard`'s width helper (defined on first use: importing anywidget takes 0.2 s)."""
    import anywidget

    class _FitWidth(anywidget.AnyWidget):
        """Invisible; in the browser, resizes the plotly figures in its widget box to the box's width.

        plotly's ``FigureWidget`` under anywidget draws once at 700 px and never follows its
        container (plotly/plotly.py#5208). This calls plotly.js's resize when a figure in the
        same box renders and when the box is resized. ``_responsiveChartHandler`` is a plotly.js
        internal (set up by the ``responsive`` config); without it the helper does nothing.
        """

        _esm = """export default { render({ el }) {
          el.style.display = 'none';
          const box = () => el.closest('.widget-box') || el.parentElement;
          const fit = (p) => p && p._responsiveChartHandler && p._responsiveChartHandler();
          const fitAll = () => { const b = box(); if (b) b.querySelectorAll('.js-plotly-plot').forEach(fit); };
          const onRender = (e) => { const b = box(); if (b && b.contains(e.detail.element)) requestAnimationFrame(() => fit(e.detail.element)); };
          document.addEventListener('plotlywidget-after-render', onRender);
          let lastW = -1;
          const ro = new ResizeObserver((es) => { const w = Math.round(es[0].contentRect.width); if (w !== lastW) { lastW = w; fitAll(); } });
          requestAnimationFrame(() => { const b = box(); if (b) ro.observe(b); fitAll(); });
          return () => { document.removeEventListener('plotlywidget-after-render', onRender); ro.disconnect(); };
        } };"""

    return _FitWidth


class Dashboard:
    """Live view of a :class:`Run` under the running cell, replaced by a static summary at the end.

    Call every method from the kernel's main thread: ipykernel 7 restricts display and
    comm messages sent from other threads, so a background receiver must hand the records
    to the main thread, which then calls :meth:`update`. Calls from other threads raise
    ``RuntimeError``. Outside a kernel (plain ``python``, terminal IPython) nothing live is
    displayed and :meth:`finish` prints the text summary.

    Example:
        >>> run = Run("demo", world_size=2, total_steps=100)
        >>> dash = Dashboard(run)
        >>> dash.show()  # live widgets (in a kernel)
        >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "loss": 1.0}])
        >>> dash.update(force=True)
        True
        >>> dash.finish()  # doctest: +ELLIPSIS
        jdist run demo: running ...
    """

    def __init__(self, run: Run, min_interval: float = 0.1) -> None:
        import ipywidgets as widgets

        self.run = run
        self.min_interval = min_interval
        self._last_redraw = -math.inf
        self._drawn: tuple[Any, ...] | None = None
        self._handle: Any = None
        self._finished = False

        self._header = widgets.HTML()
        self._bar = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="50%"))
        self._progress = widgets.Label()
        self._progress_row = widgets.HBox([self._bar, self._progress])

        self._fig = live_figure()
        self._fit = _fit_width_class()()
        self._box = widgets.VBox([self._header, self._progress_row, self._fig, self._fit])

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget`` (:func:`live_figure`); traces:
        loss min, loss max, loss mean, compute, comm, memory now, memory peak, model+optimizer state,
        throughput."""
        return self._fig

    @property
    def widget(self) -> Any:
        """The whole live view (an ipywidgets ``VBox``)."""
        return self._box

    @property
    def progress_bar(self) -> Any:
        """The ``IntProgress`` widget (hidden when ``run.total_steps`` is unknown)."""
        return self._bar

    @property
    def progress_text(self) -> str:
        """The progress line, e.g. ``"step 12 / 100, ETA 01:30"``."""
        return self._progress.value

    def show(self) -> None:
        """Display the live view under the running cell (nothing outside a kernel)."""
        _check_thread()
        self.update(force=True)
        if not _in_kernel():
            return
        from IPython.display import display

        if self._handle is None:
            self._handle = display(self._box, display_id=True)
        else:
            self._handle.display(self._box)

    def update(self, force: bool = False) -> bool:
        """Redraw from the run's current data if ``min_interval`` s passed (or ``force``).

        Returns whether it redrew. The figure is only resent when records, status or
        ``total_steps`` changed; the header and progress line send only changed text.
        """
        _check_thread()
        now = time.monotonic()
        if self._finished or (not force and now - self._last_redraw < self.min_interval):
            return False
        self._last_redraw = now
        self._draw_text()
        state = (len(self.run.records), self.run.status, self.run.total_steps, self.run.world_size)
        if force or state != self._drawn:
            self._draw_figure()
            self._drawn = state
        return True

    def finish(self) -> None:
        """Final redraw, replace the live view in place with :func:`static_bundle`, print the summary.

        Closes every widget of the view, the figure included.
        """
        _check_thread()
        if self._finished:
            return
        self.update(force=True)
        if _in_kernel():
            from IPython.display import display

            bundle = static_bundle(self.run)
            bundle["image/png"] = base64.b64encode(bundle["image/png"]).decode("ascii")
            if self._handle is None:
                display(bundle, raw=True)
            else:
                self._handle.update(bundle, raw=True)
        print(self.run.summary())
        self._close_widgets()
        self._finished = True

    def _close_widgets(self) -> None:
        from ipywidgets import Widget

        for w in (self._fig, self._header, self._bar, self._progress, self._progress_row, self._fit, self._box):
            # Layout and style are widgets of their own; the FigureWidget's layout is plotly's.
            for part in (getattr(w, "layout", None), getattr(w, "style", None), w):
                if isinstance(part, Widget):
                    part.close()

    def _draw_text(self) -> None:
        run = self.run
        status = html.escape(run.status)
        error_lines = (run.error or "").strip().splitlines()
        if error_lines:
            status += f": {html.escape(error_lines[-1])}"
        self._header.value = (
            f"<b>jdist</b> run <code>{html.escape(run.run_id)}</code> · {run.world_size} ranks · "
            f"{html.escape(run.backend or 'no backend')} on {run.device_kind} · <b>{status}</b>"
        )
        done = steps_done(run)
        elapsed = (run.ended or time.time()) - run.started
        if run.total_steps is None:
            self._bar.layout.display = "none"
            self._progress.value = f"{done} steps, elapsed {_mmss(elapsed)}"
            return
        self._bar.layout.display = None
        self._bar.max = max(run.total_steps, 1)
        self._bar.value = done
        per_step = seconds_per_step(run)
        if run.status != "running":
            tail = f"elapsed {_mmss(elapsed)}"
        elif per_step is None:
            tail = "ETA --:--"
        else:
            tail = f"ETA {_mmss((run.total_steps - done) * per_step)}"
        self._progress.value = f"step {done} / {run.total_steps}, {tail}"

    def _draw_figure(self) -> None:
        """Send the run's current data, lines thinned to :data:`MAX_POINTS` (a long run would resend every step)."""
        d = panel_data(self.run)
        fig = self._fig
        lo, hi, mean, compute, comm, mem, peak, state, tput = fig.data
        titles = fig.layout.annotations  # the subplot titles, in panel order
        with fig.batch_update():
            titles[0].text, titles[2].text, titles[3].text = d.loss_name or "loss", d.mem_title, d.throughput_title
            lo.x, lo.y = thin(d.loss_steps, d.loss_min, min)
            hi.x, hi.y = thin(d.loss_steps, d.loss_max, max)
            mean.x, mean.y = thin(d.loss_steps, d.loss_mean)
            compute.x = comm.x = mem.x = peak.x = state.x = d.rank_labels
            compute.y, comm.y = d.compute_s, d.comm_s
            comm.base = [c or 0.0 for c in d.compute_s]
            mem.y, peak.y, state.y = d.mem_mib, d.mem_peak_mib, d.state_mib
            tput.x, tput.y = thin(d.throughput_steps, d.throughput)


def preload() -> None:
    """Import the dashboard's heavy dependencies (plotly, ipywidgets, matplotlib) ahead of time.

    The magics call this in a background thread while the ranks start, so the first
    training cell does not pay ~1-2 s of imports while the ranks compete for the CPU.
    """
    import ipywidgets  # noqa: F401
    import plotly.graph_objects as go
    from matplotlib import figure  # noqa: F401
    from matplotlib.backends import backend_agg  # noqa: F401

    go.FigureWidget  # noqa: B018  (plotly imports the widget class, and anywidget, lazily)
    _base_figure()  # loads plotly's validators for every trace and layout property used


def _in_kernel() -> bool:
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def _check_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("jdist.dashboard.Dashboard must be used from the kernel's main thread")


def _finite(values: list[float]) -> list[float | None]:
    return [None if math.isnan(v) else v for v in values]


def _mib(value: Any) -> float | None:
    return value / _MIB if isinstance(value, (int, float)) and not math.isnan(value) else None


def _mmss(seconds: float) -> str:
    minutes, secs = divmod(max(0, round(seconds)), 60)
    return f"{minutes:02d}:{secs:02d}"
