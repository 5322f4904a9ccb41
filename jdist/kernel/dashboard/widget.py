"""Live notebook dashboard for a :class:`~jdist.metrics.Run`, drawn by the browser, replaced by a
static summary at the end.

While a ``%%distributed`` cell runs, :class:`Dashboard` shows one anywidget under the cell. The
kernel does little: it keeps the panels up to date incrementally (:class:`jdist.metrics.live.LivePanels`,
O(new records) per update) and, at most every ``min_interval`` seconds, sends the line panels' new
points as one custom message (float64 buffers, :class:`jdist.protocol.LivePoints`) and the
layout, the bar panels and the header as widget state when they changed. The browser keeps
the points and draws every panel (``labextension/src/notebook.ts``, bundled into ``charts.js``,
loaded once per page by the hidden :class:`ChartsLib` widget). :meth:`Dashboard.finish`
replaces the live view in place with a static SVG of every panel
(:mod:`jdist.kernel.dashboard.static`) and prints the summary as text.

Example:
    >>> from jdist.metrics import Run
    >>> run = Run("demo", world_size=1, total_steps=100)
    >>> dash = Dashboard(run)
    >>> dash.show()  # the live widget (in a kernel)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "loss": 1.0}])
    >>> dash.update(force=True)
    True
    >>> dash.points("loss")["y"]
    [1.0]
    >>> dash.finish()  # doctest: +ELLIPSIS
    jdist run demo: running ...
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
import time
import uuid
from array import array
from pathlib import Path
from typing import Any

from jdist.metrics import Run
from jdist.metrics.live import LivePanels, LiveUpdate
from jdist.metrics.panels import eta_s, steps_done
from jdist.protocol import DashboardHead, LiveLine, LivePoints

from .static import static_bundle

HERE = Path(__file__).resolve().parent
#: The browser's chart code (built from labextension/src/notebook.ts) and its CSS.
CHARTS_JS, CHARTS_CSS = HERE / "charts.js", HERE / "charts.css"
#: The ES module of each dashboard widget: keeps the points, waits for the chart code.
LIVE_JS = HERE / "live.js"


@functools.cache
def _classes() -> tuple[type, type]:
    """The two widget classes (defined on first use: importing anywidget takes 0.2 s)."""
    import anywidget
    import traitlets

    class ChartsLib(anywidget.AnyWidget):
        """Hidden, one per kernel: its ES module is the chart code, registered in the page under ``key``."""

        _esm = CHARTS_JS
        _css = CHARTS_CSS
        key = traitlets.Unicode().tag(sync=True)

    class LiveDashboard(anywidget.AnyWidget):
        """One per dashboard: the panels' layout, the panels sent whole and the header as state;
        the line points as custom messages."""

        _esm = LIVE_JS
        uid = traitlets.Unicode().tag(sync=True)
        lib = traitlets.Unicode().tag(sync=True)
        layout = traitlets.List().tag(sync=True)
        whole = traitlets.List().tag(sync=True)
        head = traitlets.Dict().tag(sync=True)

    return ChartsLib, LiveDashboard


_lib: Any = None


def charts_lib() -> Any:
    """The kernel's :class:`ChartsLib` widget, created on first use (again if it was closed).

    Its ES module reaches each page once (with the widget's ``comm_open``), however many
    dashboards follow: they only name its ``key``, a hash of the chart code.
    """
    global _lib
    if _lib is None or getattr(_lib, "comm", None) is None:
        lib_class, _ = _classes()
        _lib = lib_class(key=hashlib.sha256(CHARTS_JS.read_bytes()).hexdigest()[:16])
    return _lib


def _column(values: list[float]) -> bytes:
    return array("d", values).tobytes()


class Dashboard:
    """Live view of a :class:`Run` under the running cell, replaced by a static summary at the end.

    Call every method from the kernel's main thread: ipykernel 7 restricts display and
    comm messages sent from other threads, so a background receiver must hand the records
    to the main thread, which then calls :meth:`update`. Calls from other threads raise
    ``RuntimeError``. Outside a kernel (plain ``python``, terminal IPython) nothing live is
    displayed and :meth:`finish` prints the text summary.
    """

    def __init__(self, run: Run, min_interval: float = 0.25) -> None:
        self.run = run
        self.min_interval = min_interval
        self.live = LivePanels(run)
        self._seq = 0
        self._last_redraw = -math.inf
        self._handle: Any = None
        self._finished = False
        self.paused: list[int] = []  # ranks stopped in a debugger now (the progress line says so)
        _, live_class = _classes()
        self._widget = live_class(uid=uuid.uuid4().hex, lib=charts_lib().key)

    @property
    def widget(self) -> Any:
        """The live widget (an anywidget)."""
        return self._widget

    @property
    def head(self) -> DashboardHead:
        """The header and progress line as last sent, e.g. ``progress`` ``"step 12 / 100, ETA 01:30"``."""
        return self._widget.head  # type: ignore[no-any-return]

    def points(self, panel: str, series: str | None = None) -> dict[str, list[float]]:
        """The points of a series of a line panel (default: its first) the browser holds after the
        updates so far: ``x``, ``y``, ``low``, ``high`` (NaN where no value). Computed again on each
        call, for tests and debugging."""
        x, y, low, high = self.live.sent(panel, series)
        return {"x": x, "y": y, "low": low, "high": high}

    def feed(self, records: Any) -> None:
        """New records of the run (already added to it): which points they change (O(fields) per batch)."""
        self.live.feed(records)

    def show(self) -> None:
        """Display the live view under the running cell (nothing outside a kernel)."""
        _check_thread()
        self.update(force=True)
        if not _in_kernel():
            return
        from IPython.display import display

        if self._handle is None:
            self._handle = display(self._widget, display_id=True)
        else:
            self._handle.display(self._widget)

    def update(self, force: bool = False) -> bool:
        """Send what changed if ``min_interval`` s passed (or ``force``); returns whether it looked.

        Costs O(records since the last update): new points, and the layout, bar panels and
        header only when they changed.
        """
        _check_thread()
        now = time.monotonic()
        if self._finished or (not force and now - self._last_redraw < self.min_interval):
            return False
        self._last_redraw = now
        self._send(self.live.update())
        head = self._head()
        if head != self._widget.head:
            self._widget.head = head
        return True

    def finish(self) -> None:
        """Final update, replace the live view in place with the static summary, print the summary text.

        Closes the dashboard's widget (not the shared :class:`ChartsLib`).
        """
        _check_thread()
        if self._finished:
            return
        if _in_kernel():
            from IPython.display import display

            bundle = static_bundle(self.run)
            if self._handle is None:
                display(bundle, raw=True)
            else:
                self._handle.update(bundle, raw=True)
        print(self.run.summary())
        self._widget.close()
        self._finished = True

    def _send(self, update: LiveUpdate) -> None:
        w = self._widget
        if update.layout is not None or update.whole is not None:
            with w.hold_sync():
                if update.layout is not None:
                    w.layout = update.layout
                if update.whole is not None:
                    w.whole = update.whole
        if not update.lines:
            return
        lines: list[LiveLine] = []
        buffers: list[bytes] = []
        for p in update.lines:
            band = p.low is not None and p.high is not None
            lines.append(LiveLine(panel=p.panel, series=p.series, n=len(p.x), band=band, reset=p.reset,
                                  replace_from=p.replace_from))
            buffers += [_column(p.x), _column(p.y)]
            if band:
                buffers += [_column(p.low or []), _column(p.high or [])]
        w.send(LivePoints(type="points", seq=self._seq, lines=lines), buffers)
        self._seq += 1

    def _head(self) -> DashboardHead:
        run = self.run
        error_lines = (run.error or "").strip().splitlines()
        done = steps_done(run)
        elapsed = (run.ended or time.time()) - run.started
        if run.total_steps is None:
            progress = f"{done} steps, elapsed {_mmss(elapsed)}"
        else:
            eta = eta_s(run)
            if run.status != "running":
                tail = f"elapsed {_mmss(elapsed)}"
            elif eta is None:
                tail = "ETA --:--"
            else:
                tail = f"ETA {_mmss(eta)}"
            progress = f"step {done} / {run.total_steps}, {tail}"
        if self.paused and run.status == "running":
            progress += f"; rank {', '.join(map(str, self.paused))} paused in the debugger"
        return DashboardHead(
            title=f"run {run.run_id} · {run.world_size} ranks · {run.backend or 'no backend'} on {run.device_kind}",
            status=run.status, problem=error_lines[-1] if error_lines else None, done=done,
            total=run.total_steps, progress=progress)


def preload() -> None:
    """Import the dashboard's dependencies (ipywidgets, anywidget) and read its chart code ahead of time.

    The magics call this in a background thread while the ranks start, so the first
    training cell does not pay the imports while the ranks compete for the CPU.
    """
    _classes()
    CHARTS_JS.read_bytes()


def _in_kernel() -> bool:
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def _check_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("jdist.kernel.dashboard.Dashboard must be used from the kernel's main thread")


def _mmss(seconds: float) -> str:
    minutes, secs = divmod(max(0, round(seconds)), 60)
    return f"{minutes:02d}:{secs:02d}"


__all__ = ["Dashboard", "charts_lib", "preload"]
