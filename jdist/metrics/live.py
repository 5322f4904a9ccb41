"""The live dashboard's data, kept up to date incrementally: each update costs O(new records).

:class:`LivePanels` follows a :class:`~jdist.metrics.Run` as its records arrive (:meth:`~LivePanels.feed`)
and says, on each :meth:`~LivePanels.update`, only what changed since the last one:

- ``layout``: every panel (:func:`jdist.metrics.panels.all_panels`) without data, when a title or a
  series changed (the loss panel's metric, a validation series appearing, the throughput panel's unit);
- ``whole``: the panels sent whole (the bar panels: a few numbers per rank), when they changed;
- ``lines``: the new points of the line panels defined by a :class:`~jdist.metrics.panels.LineDef`,
  :class:`LinePoints` per series.

A series' points are computed by :func:`jdist.metrics.panels.line_points`, as for the full
panels, for the new steps only. A step's point is sent once every rank that logs the panel's
metric has reached that step (the slowest rank sets the pace), so a point is normally sent
once, already final; nothing is sent until every rank has sent a record (at most ``hold_s``).
Records that arrive for a step already sent (a rank that started late, a resent batch) make the
series resend from that step (``replace_from``); a line whose metric changed starts over
(``reset``). Once every rank has reached the last step, the points sent equal the line panels of
:func:`~jdist.metrics.panels.panels` (tests check it).

Example:
    >>> from jdist.metrics import Run
    >>> run = Run("demo", world_size=2)
    >>> live = LivePanels(run)
    >>> live.feed(run.add([{"rank": r, "seq": 0, "step": 0, "loss": 1.0 + r} for r in (0, 1)]))
    >>> [(p.x, p.y, p.low, p.high) for p in live.update().lines if p.panel == "loss"]
    [([0], [1.5], [1.0], [2.0])]
    >>> live.feed(run.add([{"rank": 0, "seq": 1, "step": 1, "loss": 0.5}]))
    >>> [p.x for p in live.update().lines if p.panel == "loss"]  # rank 1 has not reached step 1
    []
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jdist.protocol import BarPanel, BarSeries, LinePanel, LineSeries, Panel

from .panels import BarDef, LineDef, PanelDef, SeriesDef, definitions, line_points
from .records import Run
from .store import RecordBatch


@dataclass
class LinePoints:
    """New points of one line series. ``replace_from``: drop the points at steps >= it first
    (``None``: append); ``reset``: drop every point first. ``low``/``high`` are ``None`` for a
    series without a band. Missing values are ``nan``."""

    panel: str
    series: str
    x: list[float]
    y: list[float]
    low: list[float] | None = None
    high: list[float] | None = None
    replace_from: float | None = None
    reset: bool = False


@dataclass
class LiveUpdate:
    """What changed since the previous :meth:`LivePanels.update` (``None``: unchanged)."""

    layout: list[Panel] | None = None
    whole: list[Panel] | None = None
    lines: list[LinePoints] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.layout is not None or self.whole is not None or bool(self.lines)


class _Line:
    """The state of one series of a line panel in the view: which steps were sent."""

    def __init__(self, panel: str, line: SeriesDef) -> None:
        self.panel = panel
        self.line = line
        self.source = _source(line)
        self.sent_to: Any = None  # the highest step sent
        self.reset = True  # the browser's series must be emptied first

    def points(self, run: Run, dirty_from: Any) -> LinePoints | None:
        line = self.line
        frontier = run.frontier(line.metric) if line.metric else None
        replace_from = None
        if self.reset or self.sent_to is None:
            low, inclusive = None, False
        elif dirty_from is not None and dirty_from <= self.sent_to:
            low, inclusive, replace_from = dirty_from, True, dirty_from
        else:
            low, inclusive = self.sent_to, False
        steps, prev = run.step_range(line.metric, low, frontier, inclusive=inclusive) if frontier is not None \
            else ([], None)
        if not steps and not self.reset and replace_from is None:
            return None
        x, y, lo, hi = line_points(run, line, steps, prev)
        out = LinePoints(self.panel, line.name, x, y, lo if line.band else None, hi if line.band else None,
                         replace_from=None if self.reset else replace_from, reset=self.reset)
        self.reset = False
        if steps:
            self.sent_to = steps[-1] if self.sent_to is None else max(self.sent_to, steps[-1])
        return out


def _source(line: SeriesDef) -> tuple[Any, ...]:
    """What a series' points depend on besides the records: when it changes, the series starts over."""
    return (line.name, line.metric, line.point, line.band, line.skip_first, line.every_rank)


class LivePanels:
    """Incremental view of a :class:`Run` for the live dashboard (see the module docstring).

    Call :meth:`feed` with every batch of new records (what :meth:`Run.add` returns) and
    :meth:`update` when the view should change (a few times a second).
    """

    def __init__(self, run: Run, hold_s: float = 1.0) -> None:
        self.run = run
        self.hold_s = hold_s
        self._first_feed: float | None = None
        self._dirty_from: dict[str, Any] = {}  # metric -> lowest step of the records since the last update
        self._lines: dict[tuple[str, str], _Line] = {}  # (panel, series) -> its state
        self._layout_sent: str | None = None
        self._whole_sent: str | None = None

    def feed(self, records: RecordBatch | list[dict[str, Any]], now: float | None = None) -> None:
        """Take note of new records (already added to the run): O(fields) per batch."""
        if not len(records):
            return
        if self._first_feed is None:
            self._first_feed = time.monotonic() if now is None else now
        batch = records if isinstance(records, RecordBatch) else RecordBatch.from_records(records)
        step = batch.columns.get("step")
        if step is None:
            return
        dirty = self._dirty_from
        as_int = "step" in batch.ints
        for name, values in batch.columns.items():
            have = step[~np.isnan(values) & ~np.isnan(step)]
            if have.size:
                s = have.min().item()
                s = int(s) if as_int else s
                low = dirty.get(name)
                if low is None or s < low:
                    dirty[name] = s

    def update(self, now: float | None = None) -> LiveUpdate:
        """What changed since the last call: layout, panels sent whole, new line points.

        Until every rank has sent a record, for at most ``hold_s`` after the first one, no line
        point is sent: a rank whose first records came late would make the lines resend.
        """
        run = self.run
        out = LiveUpdate()
        now = time.monotonic() if now is None else now
        waiting = (len(run.ranks) < run.world_size and self._first_feed is not None
                   and now - self._first_feed < self.hold_s)
        defs = definitions(run)
        layout = [_empty(d) for d in defs]
        key = json.dumps(layout)
        if key != self._layout_sent:
            out.layout, self._layout_sent = layout, key
        whole = [d.panel for d in defs if isinstance(d, BarDef)]
        key = json.dumps(whole)
        if key != self._whole_sent:
            out.whole, self._whole_sent = whole, key
        for d in defs:
            if not isinstance(d, LineDef) or waiting:
                continue
            for s in d.series:
                state = self._lines.get((d.key, s.name))
                if state is None or _source(s) != state.source:
                    state = self._lines[d.key, s.name] = _Line(d.key, s)
                pts = state.points(run, self._dirty_from.get(s.metric) if s.metric else None)
                if pts is not None:
                    out.lines.append(pts)
        if not waiting:
            self._dirty_from.clear()
        return out

    def sent(self, panel: str, series: str | None = None) -> tuple[list[Any], list[float], list[float], list[float]]:
        """The points of a series of line panel ``panel`` (default: its first) that the updates so far
        add up to: ``(x, y, low, high)``."""
        state = next((s for (p, name), s in self._lines.items() if p == panel and series in (None, name)), None)
        if state is None or state.sent_to is None:
            return [], [], [], []
        line = state.line
        steps = self.run.step_range(line.metric, None, state.sent_to)[0] if line.metric else []
        return line_points(self.run, line, steps)


def _empty(d: PanelDef) -> Panel:
    """A panel's titles and series without data (the layout the browser fills in)."""
    if isinstance(d, LineDef):
        return LinePanel(key=d.key, kind="line", title=d.title, x_title=d.x_title, series=[
            LineSeries(name=s.name, color=s.color, x=[], y=[], low=[] if s.band else None, high=[] if s.band else None)
            for s in d.series])
    p = d.panel
    if p["kind"] == "heatmap":
        return {**p, "rows": [], "groups": [], "x": [], "cells": "", "low": None, "high": None}  # type: ignore[return-value]
    if p["kind"] == "table":
        return {**p, "rows": [], "note": ""}  # type: ignore[return-value]
    return BarPanel(key=p["key"], kind="bars", title=p["title"], unit=p["unit"], stacked=p["stacked"], categories=[],
                    series=[BarSeries(name=s["name"], color=s["color"], values=[], labels=s["labels"])
                            for s in p["series"]])


__all__ = ["LivePanels", "LinePoints", "LiveUpdate"]
