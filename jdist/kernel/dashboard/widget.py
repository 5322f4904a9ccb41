"""Live notebook dashboard for a :class:`~jdist.metrics.Run`, replaced by a static summary at the end.

While a ``%%distributed`` cell runs, :class:`Dashboard` shows an ipywidgets view under the
cell: a header line, a progress bar and a plotly ``FigureWidget`` with every panel of
:data:`jdist.metrics.panels.PANELS` (two per row), drawn by kind: a line panel as lines
(a band as a filled min–max area), a bar panel as grouped or stacked bars per rank.
:meth:`Dashboard.finish` replaces that view in place with a PNG drawn by matplotlib
(:mod:`jdist.kernel.dashboard.static`) and the summary as text.

Long series are thinned to :data:`~jdist.metrics.panels.MAX_POINTS` points in the live
figure; the PNG shows every step.

Example:
    >>> from jdist.metrics import Run
    >>> run = Run("demo", world_size=2, total_steps=100)
    >>> dash = Dashboard(run)
    >>> dash.show()  # live widgets (in a kernel)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "loss": 1.0}])
    >>> dash.update(force=True)
    True
    >>> list(dash.trace("loss", "mean over ranks").y)
    [1.0]
    >>> dash.finish()  # doctest: +ELLIPSIS
    jdist run demo: running ...
"""

from __future__ import annotations

import base64
import functools
import html
import math
import threading
import time
from pathlib import Path
from typing import Any

from jdist.metrics import Run
from jdist.metrics.panels import panels, seconds_per_step, steps_done, thin_panel
from jdist.protocol import Panel

from .static import static_bundle

#: Trace parts of a line series: its band (two traces) and the line itself.
_BAND_LOW, _BAND_HIGH, _LINE = "low", "high", "line"


def _rgba(hex_color: str, alpha: float) -> str:
    """``#1f77b4`` -> ``rgba(31,119,180,0.25)``.

    >>> _rgba("#1f77b4", 0.25)
    'rgba(31,119,180,0.25)'
    """
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _grid(n: int) -> tuple[int, int]:
    return math.ceil(n / 2), 2


def base_figure(layout: list[Panel]) -> Any:
    """A plotly Figure (no widget, no comm) with the traces of the panels ``layout`` (their data is
    drawn later). Each trace's ``meta`` is ``"<panel key>/<series name>/<part>"``."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows, cols = _grid(len(layout))
    # Units go in the subplot titles (no y-axis titles): less clutter in a narrow window.
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[p["title"] for p in layout],
                        horizontal_spacing=0.14, vertical_spacing=0.2 if rows <= 2 else 0.12)
    for i, panel in enumerate(layout):
        row, col = divmod(i, cols)
        at = dict(row=row + 1, col=col + 1)
        key = panel["key"]
        if panel["kind"] == "line":
            for s in panel["series"]:
                meta = f"{key}/{s['name']}"
                if s["low"] is not None:
                    band = dict(mode="lines", line=dict(width=0, color=_rgba(s["color"], 0.3)))
                    fig.add_trace(go.Scatter(name="min", showlegend=False, meta=f"{meta}/{_BAND_LOW}", **band), **at)
                    fig.add_trace(go.Scatter(name="min–max", fill="tonexty", fillcolor=_rgba(s["color"], 0.25),
                                             meta=f"{meta}/{_BAND_HIGH}", **band), **at)
                fig.add_trace(go.Scatter(name=s["name"], mode="lines", line=dict(color=s["color"]),
                                         showlegend=s["low"] is not None, meta=f"{meta}/{_LINE}"), **at)
            fig.update_xaxes(title_text=panel["x_title"], **at)
            fig.update_yaxes(exponentformat="e", **at)  # small losses read 1e-13, not "100f"
        else:
            for s in panel["series"]:
                # barmode "group" for grouped bars; stacked ones share an offset group and stack through `base`
                group = key if panel["stacked"] else f"{key}/{s['name']}"
                labels = dict(texttemplate="%{y:.1f}", textposition="outside", cliponaxis=False) if s["labels"] else {}
                fig.add_trace(go.Bar(name=s["name"], offsetgroup=group, marker_color=s["color"],
                                     meta=f"{key}/{s['name']}/{_LINE}", **labels), **at)
    fig.update_layout(
        height=260 * rows,
        margin=dict(l=55, r=15, t=35, b=40),
        barmode="group",
        legend=dict(orientation="h", traceorder="normal", yanchor="top", y=-0.12, x=0),
        font=dict(size=11),
    )
    fig.update_annotations(font_size=12)  # subplot titles keep plotly's 16 px otherwise: clipped when narrow
    return fig


def live_figure(layout: list[Panel]) -> Any:
    """A new plotly ``FigureWidget`` for one dashboard, sized to follow the page (with ``_FitWidth``).

    One per dashboard, closed by :meth:`Dashboard.finish`. Reusing one across cells would
    save sending plotly.js (5 MB) again, but plotly 7.1's widget view leaves its listeners on
    the model when the view is removed, and a reused figure then stays blank in the browser.
    """
    import plotly.graph_objects as go

    fig = go.FigureWidget(base_figure(layout))
    fig._config = {"responsive": True}
    return fig


@functools.cache
def _fit_width_class() -> type:
    """The class of :class:`Dashboard`'s width helper (defined on first use: importing anywidget takes 0.2 s)."""
    import anywidget

    class _FitWidth(anywidget.AnyWidget):
        """Invisible; in the browser, resizes the plotly figures in its widget box to the box's width."""

        _esm = Path(__file__).with_name("fitwidth.js")

    return _FitWidth


class Dashboard:
    """Live view of a :class:`Run` under the running cell, replaced by a static summary at the end.

    Call every method from the kernel's main thread: ipykernel 7 restricts display and
    comm messages sent from other threads, so a background receiver must hand the records
    to the main thread, which then calls :meth:`update`. Calls from other threads raise
    ``RuntimeError``. Outside a kernel (plain ``python``, terminal IPython) nothing live is
    displayed and :meth:`finish` prints the text summary.
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

        self._fig = live_figure(panels(run))
        self._traces = {trace.meta: trace for trace in self._fig.data}
        self._fit = _fit_width_class()()
        self._box = widgets.VBox([self._header, self._progress_row, self._fig, self._fit])

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget`` (:func:`live_figure`)."""
        return self._fig

    def trace(self, panel: str, series: str, part: str = _LINE) -> Any:
        """The figure's trace of one panel's series: ``part`` "line", or "low"/"high" of its band."""
        return self._traces[f"{panel}/{series}/{part}"]

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
        """Final redraw, replace the live view in place with the static bundle, print the summary.

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
        """Send the run's current panels, lines thinned (a long run would resend every step)."""
        fig = self._fig
        titles = fig.layout.annotations  # the subplot titles, in panel order
        with fig.batch_update():
            for i, panel in enumerate(panels(self.run)):
                titles[i].text = panel["title"]
                key = panel["key"]
                if panel["kind"] == "line":
                    for s in thin_panel(panel)["series"]:
                        meta = f"{key}/{s['name']}"
                        line = self._traces[f"{meta}/{_LINE}"]
                        line.x, line.y = s["x"], s["y"]
                        if s["low"] is not None:
                            low, high = self._traces[f"{meta}/{_BAND_LOW}"], self._traces[f"{meta}/{_BAND_HIGH}"]
                            low.x, low.y = s["x"], s["low"]
                            high.x, high.y = s["x"], s["high"]
                else:
                    base = [0.0] * len(panel["categories"])
                    for s in panel["series"]:
                        bar = self._traces[f"{key}/{s['name']}/{_LINE}"]
                        bar.x, bar.y = panel["categories"], s["values"]
                        if panel["stacked"]:
                            bar.base = list(base)
                            base = [b + (v or 0.0) for b, v in zip(base, s["values"])]


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
    base_figure(panels(Run("preload", 1)))  # loads plotly's validators for every trace and layout property used


def _in_kernel() -> bool:
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def _check_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("jdist.kernel.dashboard.Dashboard must be used from the kernel's main thread")


def _mmss(seconds: float) -> str:
    minutes, secs = divmod(max(0, round(seconds)), 60)
    return f"{minutes:02d}:{secs:02d}"
