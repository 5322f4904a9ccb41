"""The dashboard panels, as data: one definition each, drawn by every view.

:data:`PANELS` lists one function per panel. A bar panel's function turns a
:class:`~jdist.metrics.Run` into a :class:`~jdist.protocol.BarPanel` (a few values per rank);
a line panel's function gives a :class:`LineDef`: its titles, and the point of each step
computed from one metric's values across the ranks. :func:`panels` turns them all into
:data:`jdist.protocol.Panel` (plain JSON-able data with titles, colours and values); the live
dashboard (:mod:`jdist.metrics.live`) computes a line's new points with the same
:func:`line_points`, one batch of steps at a time. Three renderers draw any panel by its
``kind``, without knowing which panel it is: the live notebook widget and the sidebar's run view
(SVG, ``labextension/src/panels.ts``) and the static SVG that replaces the live widget
(:mod:`jdist.kernel.dashboard.static`). A new panel is one function here, added to :data:`PANELS`.

Example:
    >>> from jdist.metrics import Run
    >>> run = Run("demo", world_size=1)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "loss": 1.0, "step_time_s": 0.5}])
    >>> [p["key"] for p in panels(run)]
    ['loss', 'time', 'memory', 'throughput']
    >>> panels(run)[0]["series"][0]["y"]
    [1.0]
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from jdist.protocol import BarPanel, BarSeries, LinePanel, LineSeries, Panel

from .records import Run

#: Steps over which the per-rank compute and communication times are averaged.
RECENT_STEPS = 20
#: The most points a line gets in the live views; longer series are bucketed (:func:`thin`).
MAX_POINTS = 1000
#: Colours shared by every view: compute, memory now, loss and throughput in blue;
#: communication and peak memory in orange; model+optimizer state in green.
BLUE, ORANGE, GREEN = "#1f77b4", "#ff7f0e", "#2ca02c"
TIME_TITLE = f"time per step (s), last {RECENT_STEPS} steps"
_MIB = 2**20


def finite(values: list[Any]) -> list[float | None]:
    """NaN and infinities as None (JSON and the charts have no NaN).

    >>> finite([1.0, float("nan"), float("inf")])
    [1.0, None, None]
    """
    return [v if isinstance(v, (int, float)) and math.isfinite(v) else None for v in values]


def loss_metric(run: Run) -> str | None:
    """The metric the loss panel shows: ``"loss"`` if logged, else the first user scalar.

    >>> loss_metric(Run("x", 1, records=[])) is None
    True
    """
    names = run.metric_names
    if "loss" in names:
        return "loss"
    return names[0] if names else None


PointFn = Callable[[Any, "dict[int, float]", Any], "tuple[float, float | None, float | None] | None"]
"""A line's point at one step: ``(step, {rank: value}, previous step or None) -> (y, low, high)``,
or ``None`` to leave the step out."""


@dataclass(frozen=True)
class LineDef:
    """A line panel as a definition: one series whose point at each step comes from ``point``
    applied to the ranks' values of ``metric`` at that step.

    ``band``: the point has a low/high band. ``skip_first``: each rank's first record of the
    cell is left out (its times cover the set-up before the first step). ``every_rank``: a
    step counts only once every rank logging the metric has a value there.
    """

    key: str
    title: str
    name: str
    color: str
    metric: str | None
    point: PointFn
    x_title: str = "step"
    band: bool = False
    skip_first: bool = False
    every_rank: bool = False


def mean_band(step: Any, values: dict[int, float], prev: Any) -> tuple[float, float, float]:
    """Mean over the ranks, with their min and max (NaN left out, as :meth:`Run.aggregate`).

    >>> mean_band(0, {0: 1.0, 1: 3.0, 2: float("nan")}, None)
    (2.0, 1.0, 3.0)
    """
    vals = [v for v in values.values() if not math.isnan(v)] or [math.nan]
    return sum(vals) / len(vals), min(vals), max(vals)


def rate_of_slowest(step: Any, values: dict[int, float], prev: Any) -> tuple[float, None, None] | None:
    """Steps/s since the previous logged step, from the slowest rank's ``step_time_s`` (a record's
    ``step_time_s`` covers the steps since the previous log, so logging every k-th step still gives
    steps/s). The first logged step has none: its ``step_time_s`` covers the time since the cell started.

    >>> rate_of_slowest(6, {0: 1.0, 1: 2.0}, 4)
    (1.0, None, None)
    """
    vals = [v for v in values.values() if not math.isnan(v)]
    if prev is None or not vals:
        return None
    slowest = max(vals)
    return ((step - prev) / slowest if slowest > 0 else math.nan), None, None


def total(step: Any, values: dict[int, float], prev: Any) -> tuple[float, None, None] | None:
    """The sum over the ranks (NaN left out).

    >>> total(0, {0: 1.0, 1: 2.5}, None)
    (3.5, None, None)
    """
    vals = [v for v in values.values() if not math.isnan(v)]
    return (sum(vals), None, None) if vals else None


def line_points(run: Run, line: LineDef, steps: list[Any], prev: Any = None
                ) -> tuple[list[Any], list[float], list[float], list[float]]:
    """``line``'s points at ``steps`` (sorted; ``prev``: the step before them): ``(x, y, low, high)``,
    NaN where a value is missing. :func:`panels` passes every step, the live view a few at a time.

    >>> run = Run("x", 2)
    >>> _ = run.add([{"rank": r, "seq": s, "step": s, "loss": float(r + s)} for s in (0, 1) for r in (0, 1)])
    >>> line_points(run, loss_panel(run), run.steps("loss"))
    ([0, 1], [0.5, 1.5], [0.0, 1.0], [1.0, 2.0])
    """
    per_step = run.step_values(line.metric) if line.metric else {}
    first = run.first_steps() if line.skip_first else {}
    need = len(run.metric_ranks(line.metric, skip_first=line.skip_first)) if line.every_rank and line.metric else 0
    xs: list[Any] = []
    ys: list[float] = []
    lows: list[float] = []
    highs: list[float] = []
    for step in steps:
        values = per_step.get(step, {})
        if first:
            values = {r: v for r, v in values.items() if first.get(r, _NONE) != step}
        pt = None if need and len(values) < need else line.point(step, values, prev)
        prev = step
        if pt is None:
            continue
        y, low, high = pt
        xs.append(step)
        ys.append(y)
        lows.append(math.nan if low is None else low)
        highs.append(math.nan if high is None else high)
    return xs, ys, lows, highs


_NONE = object()


def line_panel(run: Run, line: LineDef) -> LinePanel:
    """The :class:`~jdist.protocol.LinePanel` of ``line`` over every step logged (NaN as None)."""
    x, y, low, high = line_points(run, line, run.steps(line.metric) if line.metric else [])
    return LinePanel(key=line.key, kind="line", title=line.title, x_title=line.x_title, series=[
        LineSeries(name=line.name, color=line.color, x=x, y=finite(y), low=finite(low) if line.band else None,
                   high=finite(high) if line.band else None)])


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
    span = run.time_span()
    if span is None:
        return None
    (first_step, first_time), (last_step, last_time) = span
    return (last_time - first_time) / (last_step - first_step) if last_step > first_step else None


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


def thin_panel(panel: Panel, max_points: int = MAX_POINTS) -> Panel:
    """``panel`` with every line thinned to ``max_points`` (a band keeps its extremes: min of
    the lows, max of the highs); bar panels are returned as they are.

    >>> p = {"key": "k", "kind": "line", "title": "t", "x_title": "step", "series": [
    ...     {"name": "s", "color": BLUE, "x": [0, 1, 2, 3], "y": [1.0, 2.0, 3.0, 4.0], "low": [0.0, 1.0, 2.0, 3.0],
    ...      "high": [2.0, 3.0, 4.0, 5.0]}]}
    >>> s = thin_panel(p, max_points=2)["series"][0]
    >>> s["x"], s["y"], s["low"], s["high"]
    ([1, 3], [1.5, 3.5], [0.0, 2.0], [3.0, 5.0])
    """
    if panel["kind"] != "line":
        return panel
    series = []
    for s in panel["series"]:
        x, y = thin(s["x"], s["y"], max_points=max_points)
        low = thin(s["x"], s["low"], min, max_points)[1] if s["low"] is not None else None
        high = thin(s["x"], s["high"], max, max_points)[1] if s["high"] is not None else None
        series.append(LineSeries(name=s["name"], color=s["color"], x=x, y=y, low=low, high=high))
    return LinePanel(key=panel["key"], kind="line", title=panel["title"], x_title=panel["x_title"], series=series)


def _ranks(run: Run) -> list[int]:
    return sorted(set(range(run.world_size)) | set(run.ranks))


def rank_label(run: Run, rank: int) -> str:
    """A rank as the bar panels name it: with its host when the ranks run on several.

    >>> rank_label(Run("x", 2, records=[], hosts={0: "gpu1", 1: "gpu2"}), 1)
    'rank 1 gpu2'
    >>> rank_label(Run("x", 2, records=[]), 1)
    'rank 1'
    """
    host = run.hosts.get(rank)
    return f"rank {rank} {host}" if host else f"rank {rank}"


def _mib(value: Any) -> float | None:
    return value / _MIB if isinstance(value, (int, float)) and math.isfinite(value) else None


def loss_panel(run: Run) -> LineDef:
    """The loss (or the first logged scalar): mean over ranks per step, with a min–max band."""
    name = loss_metric(run)
    return LineDef(key="loss", title=name or "loss", name="mean over ranks", color=BLUE, metric=name,
                   point=mean_band, band=True)


def time_panel(run: Run) -> BarPanel:
    """Per rank, compute and communication time per step over the last steps (stacked)."""
    ranks = _ranks(run)
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
    return BarPanel(key="time", kind="bars", title=TIME_TITLE, unit="s", stacked=True,
                    categories=[rank_label(run, r) for r in ranks], series=[
                        BarSeries(name="compute", color=BLUE, values=finite(compute), labels=False),
                        BarSeries(name="communication", color=ORANGE, values=finite([comm_t.get(r) for r in ranks]),
                                  labels=False),
                    ])


def memory_panel(run: Run) -> BarPanel:
    """Per rank, memory now and at its peak, and the model+optimizer state it holds."""
    ranks = _ranks(run)
    latest = [run.latest(r) or {} for r in ranks]
    title = "GPU memory (MiB)" if run.device_kind == "cuda" else "host memory RSS (MiB)"
    return BarPanel(key="memory", kind="bars", title=title, unit="MiB", stacked=False,
                    categories=[rank_label(run, r) for r in ranks], series=[
                        BarSeries(name="current", color=BLUE, values=[_mib(rec.get("mem_bytes")) for rec in latest],
                                  labels=False),
                        BarSeries(name="peak", color=ORANGE, values=[_mib(rec.get("mem_peak_bytes")) for rec in latest],
                                  labels=False),
                        # small next to a process's RSS on CPU ranks: each bar is labelled with its value
                        BarSeries(name="model+optimizer", color=GREEN,
                                  values=[_mib(rec.get("state_bytes")) for rec in latest], labels=True),
                    ])


def throughput_panel(run: Run) -> LineDef:
    """Samples/s summed over the ranks once a batch size is known (even before a point can be
    drawn, so the title does not flip), at steps every rank reporting it has reached; else steps/s."""
    if any(isinstance((run.latest(r) or {}).get("samples_per_s"), (int, float)) for r in run.ranks):
        return LineDef(key="throughput", title="throughput, samples/s (all ranks)", name="throughput", color=BLUE,
                       metric="samples_per_s", point=total, skip_first=True, every_rank=True)
    return LineDef(key="throughput", title="throughput, steps/s", name="throughput", color=BLUE,
                   metric="step_time_s", point=rate_of_slowest)


#: Every panel of the dashboard, in the order the views lay them out (two per row).
PANELS: tuple[Callable[[Run], "LineDef | Panel"], ...] = (loss_panel, time_panel, memory_panel, throughput_panel)


def panels(run: Run) -> list[Panel]:
    """Every panel of :data:`PANELS` for ``run``'s current records."""
    return [line_panel(run, d) if isinstance(d, LineDef) else d for d in (build(run) for build in PANELS)]


__all__ = [
    "BLUE",
    "GREEN",
    "MAX_POINTS",
    "ORANGE",
    "PANELS",
    "RECENT_STEPS",
    "TIME_TITLE",
    "LineDef",
    "PointFn",
    "finite",
    "line_panel",
    "line_points",
    "loss_metric",
    "mean_band",
    "panels",
    "rate_of_slowest",
    "seconds_per_step",
    "steps_done",
    "thin",
    "thin_panel",
    "total",
]
