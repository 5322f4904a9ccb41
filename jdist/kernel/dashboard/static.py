"""The kernel-free dashboard: every panel of :data:`jdist.metrics.panels.PANELS` drawn with
matplotlib into a PNG (every step, no thinning), which replaces the live view at the end of a
cell so a saved notebook shows the results without a kernel (GitHub, nbviewer).

Example:
    >>> from jdist.metrics import Run
    >>> len(static_figure(Run("x", 1, records=[])).axes)
    4
"""

from __future__ import annotations

import io
import math
from typing import Any

from jdist.metrics import Run
from jdist.metrics.panels import panels
from jdist.protocol import BarPanel, LinePanel


def _array(values: list[Any]) -> Any:
    import numpy as np

    return np.array([math.nan if v is None else v for v in values], dtype=float)


def _line(ax: Any, panel: LinePanel) -> None:
    banded = False
    for s in panel["series"]:
        if not s["x"]:
            continue
        if s["low"] is not None and s["high"] is not None:
            ax.fill_between(s["x"], _array(s["low"]), _array(s["high"]), color=s["color"], alpha=0.25, label="min–max")
            banded = True
        ax.plot(s["x"], _array(s["y"]), color=s["color"], label=s["name"])
    if banded:
        ax.legend(fontsize=8)
    ax.set_xlabel(panel["x_title"])


def _bars(ax: Any, panel: BarPanel) -> None:
    import numpy as np

    x = np.arange(len(panel["categories"]))
    series = panel["series"]
    width = 0.8 if panel["stacked"] else 0.8 / max(1, len(series))
    bottom = np.zeros(len(x))
    for j, s in enumerate(series):
        values = np.nan_to_num(_array(s["values"]))
        if panel["stacked"]:
            bars = ax.bar(x, values, width, bottom=bottom, color=s["color"], label=s["name"])
            bottom = bottom + values
        else:
            offset = (j - (len(series) - 1) / 2) * width
            bars = ax.bar(x + offset, values, width, color=s["color"], label=s["name"])
        if s["labels"] and any(v for v in s["values"]):
            ax.bar_label(bars, fmt="%.1f", fontsize=7, color=s["color"])
    ax.set_xticks(x, panel["categories"])
    ax.margins(y=0.25)  # room above the bars for a legend that does not cover them
    ax.legend(fontsize=8, ncols=len(series), loc="upper center", columnspacing=1.0, handlelength=1.5)


def static_figure(run: Run, dpi: int = 100) -> Any:
    """The panels of ``run`` as a matplotlib ``Figure`` on an Agg canvas (no pyplot), every step drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    drawn = panels(run)
    rows = math.ceil(len(drawn) / 2)
    fig = Figure(figsize=(10, 3.1 * rows), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(f"jdist run {run.run_id}: {run.status}, {run.world_size} ranks", fontsize=11)
    axes = fig.subplots(rows, 2, squeeze=False).flatten()
    for ax, panel in zip(axes, drawn):
        ax.set_title(panel["title"], fontsize=10)
        if panel["kind"] == "line":
            _line(ax, panel)
        else:
            _bars(ax, panel)
    for ax in axes[len(drawn):]:
        ax.remove()
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

    Frontends show the PNG; the dashboard prints the summary text below it, so the saved
    notebook holds the image once and the text once.

    >>> sorted(static_bundle(Run("x", 1, records=[])))
    ['image/png', 'text/plain']
    """
    return {"text/plain": run.summary(), "image/png": render_png(run)}
