"""Live notebook dashboard for a :class:`~jdist.metrics.Run`, and its static replacement.

While a ``%%distributed`` cell runs, :class:`Dashboard` shows an ipywidgets view under
the cell: a header line, a progress bar and a plotly ``FigureWidget`` with four panels
(loss across ranks, per-rank compute/communication time, per-rank memory, throughput).
:meth:`Dashboard.finish` replaces that view in place with :func:`static_bundle`: plain
a PNG drawn with matplotlib (and the summary as text), so a saved notebook shows the results
without a kernel (GitHub, nbviewer).

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
import html
import io
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from jdist.metrics import Run

#: Steps over which per-rank step times and the ETA are averaged.
RECENT_STEPS = 20
_MIB = 2**20


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

    Only steps that every rank reporting ``samples_per_s`` has reached are included,
    so a live curve does not dip at a step that some ranks have not logged yet.

    >>> run = Run("x", 2)
    >>> _ = run.add([{"rank": r, "seq": 0, "step": 0, "samples_per_s": 10.0 * (r + 1)} for r in (0, 1)])
    >>> total_samples_per_s(run)
    ([0], [30.0])
    """
    per_step: dict[Any, dict[int, float]] = defaultdict(dict)
    for rec in run.records:
        value, step = rec.get("samples_per_s"), rec.get("step")
        if step is None or not isinstance(value, (int, float)) or math.isnan(value):
            continue
        per_step[step][rec["rank"]] = float(value)
    reporting = {rank for by_rank in per_step.values() for rank in by_rank}
    steps = sorted(s for s, by_rank in per_step.items() if len(by_rank) == len(reporting))
    return steps, [sum(per_step[s].values()) for s in steps]


def steps_per_s(run: Run) -> tuple[list[Any], list[float]]:
    """Per logged step, steps/s from the slowest rank's ``step_time_s``: ``(steps, rates)``.

    A record's ``step_time_s`` covers the steps since the previous logged step, so
    logging every k-th step still gives steps/s (the first logged step counts as one).

    >>> run = Run("x", 1)
    >>> _ = run.add([{"rank": 0, "seq": i, "step": s, "step_time_s": 2.0} for i, s in enumerate((0, 4))])
    >>> steps_per_s(run)
    ([0, 4], [0.5, 2.0])
    """
    steps, _, _, slowest = run.aggregate("step_time_s")
    rates = []
    for i, (step, seconds) in enumerate(zip(steps, slowest)):
        covered = step - steps[i - 1] if i else 1
        rates.append(covered / seconds if seconds > 0 else math.nan)
    return steps, rates


def seconds_per_step(run: Run, last: int = RECENT_STEPS) -> float | None:
    """Mean wall time per step over the ``last`` logged steps (rank mean), or ``None``.

    >>> run = Run("x", 1)
    >>> _ = run.add([{"rank": 0, "seq": s, "step": s, "step_time_s": 0.5} for s in range(3)])
    >>> seconds_per_step(run)
    0.5
    """
    steps, means, _, _ = run.aggregate("step_time_s")
    pairs = [(s, t) for s, t in zip(steps, means) if not math.isnan(t)][-last:]
    if not pairs:
        return None
    if len(pairs) == 1:
        return pairs[0][1]
    covered = pairs[-1][0] - pairs[0][0]
    return sum(t for _, t in pairs[1:]) / covered if covered > 0 else None


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
    step_t = run.per_rank_mean("step_time_s", last=RECENT_STEPS)
    comm_t = run.per_rank_mean("comm_time_s", last=RECENT_STEPS)
    compute_t = run.per_rank_mean("compute_time_s", last=RECENT_STEPS)
    compute: list[float | None] = []
    for r in ranks:
        if r in compute_t:
            compute.append(compute_t[r])
        elif r in step_t:
            compute.append(step_t[r] - comm_t.get(r, 0.0))
        else:
            compute.append(None)
    latest = [run.latest(r) or {} for r in ranks]
    tput_steps, tput = total_samples_per_s(run)
    tput_title = "samples/s (all ranks)"
    if not tput_steps:
        tput_steps, tput = steps_per_s(run)
        tput_title = "steps/s"
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
        throughput_title=tput_title,
        throughput_steps=tput_steps,
        throughput=_finite(tput),
    )


def render_png(run: Run, dpi: int = 100) -> bytes:
    """The four panels of ``run`` as a PNG, drawn with matplotlib's Agg canvas (no pyplot).

    >>> render_png(Run("x", 1, records=[]))[:4]
    b'\\x89PNG'
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
        ax_loss.fill_between(d.loss_steps, arr(d.loss_min), arr(d.loss_max), alpha=0.25, label="min–max")
        ax_loss.plot(d.loss_steps, arr(d.loss_mean), label="mean over ranks")
        ax_loss.legend(fontsize=8)
    ax_loss.set_xlabel("step")

    x = np.arange(len(d.rank_labels))
    compute = np.nan_to_num(arr(d.compute_s))
    ax_time.set_title(f"time per step, last {RECENT_STEPS} steps (s)", fontsize=10)
    ax_time.bar(x, compute, label="compute")
    ax_time.bar(x, np.nan_to_num(arr(d.comm_s)), bottom=compute, label="communication")
    ax_time.set_xticks(x, d.rank_labels)
    ax_time.legend(fontsize=8)

    ax_mem.set_title(d.mem_title, fontsize=10)
    ax_mem.bar(x - 0.2, np.nan_to_num(arr(d.mem_mib)), 0.4, label="current")
    ax_mem.bar(x + 0.2, np.nan_to_num(arr(d.mem_peak_mib)), 0.4, label="peak")
    ax_mem.set_xticks(x, d.rank_labels)
    ax_mem.legend(fontsize=8)

    ax_tput.set_title(d.throughput_title, fontsize=10)
    if d.throughput_steps:
        ax_tput.plot(d.throughput_steps, arr(d.throughput))
    ax_tput.set_xlabel("step")

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
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

    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=["loss", f"time per step, last {RECENT_STEPS} steps", "memory per rank", "throughput"],
        horizontal_spacing=0.1,
        vertical_spacing=0.2,
    )
    band = dict(mode="lines", line=dict(width=0, color="rgba(31,119,180,0.3)"))
    fig.add_trace(go.Scatter(name="min", showlegend=False, **band), row=1, col=1)
    fig.add_trace(
        go.Scatter(name="min–max", fill="tonexty", fillcolor="rgba(31,119,180,0.25)", **band), row=1, col=1
    )
    fig.add_trace(go.Scatter(name="mean", mode="lines", line=dict(color="rgb(31,119,180)")), row=1, col=1)
    # barmode "group" for the memory bars; communication is stacked on compute through `base`.
    fig.add_trace(go.Bar(name="compute", offsetgroup="time"), row=1, col=2)
    fig.add_trace(go.Bar(name="communication", offsetgroup="time"), row=1, col=2)
    fig.add_trace(go.Bar(name="memory now", offsetgroup="now"), row=2, col=1)
    fig.add_trace(go.Bar(name="memory peak", offsetgroup="peak"), row=2, col=1)
    fig.add_trace(go.Scatter(name="throughput", mode="lines", showlegend=False), row=2, col=2)
    fig.update_layout(
        height=520,
        margin=dict(l=55, r=15, t=35, b=40),
        barmode="group",
        legend=dict(orientation="h", traceorder="normal", yanchor="top", y=-0.12, x=0),
        font=dict(size=11),
    )
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="step", row=2, col=2)
    fig.update_yaxes(title_text="seconds", row=1, col=2)
    return fig


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
        import plotly.graph_objects as go

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

        self._fig = go.FigureWidget(_base_figure())
        self._box = widgets.VBox([self._header, self._progress_row, self._fig])

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget``; traces: loss min, loss max, loss mean, compute, comm,
        memory now, memory peak, throughput."""
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
        """Final redraw, replace the live view in place with :func:`static_bundle`, print the summary; close the widgets."""
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

        for w in (self._fig, self._header, self._bar, self._progress, self._progress_row, self._box):
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
        d = panel_data(self.run)
        fig = self._fig
        lo, hi, mean, compute, comm, mem, peak, tput = fig.data
        with fig.batch_update():
            fig.layout.annotations[0].text = d.loss_name or "loss"
            fig.layout.yaxis3.title.text = d.mem_title
            fig.layout.yaxis4.title.text = d.throughput_title
            lo.x = hi.x = mean.x = d.loss_steps
            lo.y, hi.y, mean.y = d.loss_min, d.loss_max, d.loss_mean
            compute.x = comm.x = mem.x = peak.x = d.rank_labels
            compute.y, comm.y = d.compute_s, d.comm_s
            comm.base = [c or 0.0 for c in d.compute_s]
            mem.y, peak.y = d.mem_mib, d.mem_peak_mib
            tput.x, tput.y = d.throughput_steps, d.throughput


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
