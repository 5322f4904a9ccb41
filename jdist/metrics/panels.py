"""The dashboard panels, as data: one definition each, drawn by every view.

:data:`PANELS` lists one function per panel that turns a :class:`~jdist.metrics.Run` into a
:data:`jdist.protocol.Panel` (a line panel or a bar panel, plain JSON-able data with titles,
colours and values). Three renderers draw any panel by its ``kind``, without knowing which
panel it is: the live notebook widget (plotly, :mod:`jdist.kernel.dashboard.widget`), the
static PNG that replaces it (matplotlib, :mod:`jdist.kernel.dashboard.static`) and the
sidebar's run view (SVG, ``labextension/src/runview.ts``, from the server's REST reply).
A new panel is one function here, added to :data:`PANELS`.

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
from collections import defaultdict
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


def _mib(value: Any) -> float | None:
    return value / _MIB if isinstance(value, (int, float)) and math.isfinite(value) else None


def loss_panel(run: Run) -> LinePanel:
    """The loss (or the first logged scalar): mean over ranks per step, with a min–max band."""
    name = loss_metric(run)
    steps, mean, low, high = run.aggregate(name) if name else ([], [], [], [])
    return LinePanel(key="loss", kind="line", title=name or "loss", x_title="step", series=[
        LineSeries(name="mean over ranks", color=BLUE, x=steps, y=finite(mean), low=finite(low), high=finite(high)),
    ])


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
                    categories=[f"rank {r}" for r in ranks], series=[
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
                    categories=[f"rank {r}" for r in ranks], series=[
                        BarSeries(name="current", color=BLUE, values=[_mib(rec.get("mem_bytes")) for rec in latest],
                                  labels=False),
                        BarSeries(name="peak", color=ORANGE, values=[_mib(rec.get("mem_peak_bytes")) for rec in latest],
                                  labels=False),
                        # small next to a process's RSS on CPU ranks: each bar is labelled with its value
                        BarSeries(name="model+optimizer", color=GREEN,
                                  values=[_mib(rec.get("state_bytes")) for rec in latest], labels=True),
                    ])


def throughput_panel(run: Run) -> LinePanel:
    """Samples/s over all ranks once a batch size is known (even before a point can be drawn,
    so the title does not flip), else steps/s."""
    latest = [run.latest(r) or {} for r in _ranks(run)]
    if any(isinstance(rec.get("samples_per_s"), (int, float)) for rec in latest):
        steps, values = total_samples_per_s(run)
        title = "throughput, samples/s (all ranks)"
    else:
        steps, values = steps_per_s(run)
        title = "throughput, steps/s"
    return LinePanel(key="throughput", kind="line", title=title, x_title="step", series=[
        LineSeries(name="throughput", color=BLUE, x=steps, y=finite(values), low=None, high=None),
    ])


#: Every panel of the dashboard, in the order the views lay them out (two per row).
PANELS: tuple[Callable[[Run], Panel], ...] = (loss_panel, time_panel, memory_panel, throughput_panel)


def panels(run: Run) -> list[Panel]:
    """Every panel of :data:`PANELS` for ``run``'s current records."""
    return [build(run) for build in PANELS]


__all__ = [
    "BLUE",
    "GREEN",
    "MAX_POINTS",
    "ORANGE",
    "PANELS",
    "RECENT_STEPS",
    "TIME_TITLE",
    "finite",
    "loss_metric",
    "panels",
    "seconds_per_step",
    "steps_done",
    "steps_per_s",
    "thin",
    "thin_panel",
    "total_samples_per_s",
]
