"""The dashboard panels, as data: one definition each, which every view draws and summarises.

:data:`PANELS` lists one function per panel, taking a :class:`~jdist.metrics.Run`; installed panel
plugins add theirs after jdist's (:func:`all_panels`; entry point group ``jdist.panels``). A line
panel's function returns a :class:`LineDef`: its titles and one or more :class:`SeriesDef` (train
and validation loss on one chart), each a point per step computed from one metric's values
across the ranks. A bar panel's returns a :class:`BarDef`: a :class:`~jdist.protocol.BarPanel`
(a few values per rank). Either may carry the function that gives its lines of the run's text
summary (``summary``, called only when a summary is made, never by the live view) and the
sidebar's sparkline for it (``spark``, a :class:`Spark`).

What is derived from them, so that a panel is defined in one place only:

* :func:`panels`: every panel as :data:`jdist.protocol.Panel` data (titles, colours, values),
  which three renderers draw by ``kind`` without knowing which panel it is: the live notebook
  widget and the sidebar's run view (``labextension/src/panels.ts``), and the static SVG
  (:mod:`jdist.kernel.dashboard.static`); the live dashboard (:mod:`jdist.metrics.live`) computes
  a line's new points with the same :func:`line_points`, a few steps at a time;
* :func:`summary`: the run's text summary (``Run.summary()``);
* :func:`sparks`: the sidebar's sparklines of a run.

Example:
    >>> from jdist.metrics import Run
    >>> run = Run("demo", world_size=1)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "loss": 1.0, "val_loss": 1.5, "step_time_s": 0.5}])
    >>> [p["key"] for p in panels(run)]
    ['loss', 'time', 'memory', 'throughput', 'state']
    >>> [(s["name"], s["y"]) for s in panels(run)[0]["series"]]
    [('loss', [1.0]), ('val_loss', [1.5])]
"""

from __future__ import annotations

import base64
import math
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

import numpy as np

from jdist.protocol import BarPanel, BarSeries, HeatmapPanel, LinePanel, LineSeries, Panel, SparkModel, TablePanel

from .stats import finite, is_number, mean_min_max, row_stats

if TYPE_CHECKING:
    from .records import Run

#: Steps over which the per-rank compute and communication times are averaged.
RECENT_STEPS = 20
#: The most points a line gets in the live views; longer series are bucketed (:func:`thin`).
MAX_POINTS = 1000
#: Points per sparkline in the sidebar's run list.
SPARK_POINTS = 60
#: Colours shared by every view: compute, memory now, loss and throughput in blue;
#: communication, peak memory and validation in orange; model+optimizer state in green.
BLUE, ORANGE, GREEN = "#1f77b4", "#ff7f0e", "#2ca02c"
TIME_TITLE = f"time per step (s), last {RECENT_STEPS} steps"
#: Up to this many ranks the panels draw a bar per rank; beyond it, the ranks' distribution per
#: step, per host bars, heatmaps (rank × step) and the slowest ranks.
BARS_UP_TO = 16
SPREAD_TITLE = "time per step across ranks (s)"
#: Columns of a heatmap (at most; each a power of two steps wide).
HEAT_COLUMNS = 60
#: Ranks in the slowest-ranks table.
SLOWEST = 8
#: A heatmap's colour scale, low to high (evenly spaced stops; a perceptually even blue-yellow scale).
HEAT_COLORS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]
_MIB = 2**20


PointFn = Callable[[Any, "dict[int, float]", Any], "tuple[float, float | None, float | None] | None"]
"""A line's point at one step: ``(step, {rank: value}, previous step or None) -> (y, low, high)``,
or ``None`` to leave the step out."""


@dataclass(frozen=True)
class SeriesDef:
    """One line of a line panel: the point at each step comes from ``point`` applied to the ranks'
    values of ``metric`` at that step.

    ``band``: the point has a low/high band. ``skip_first``: each rank's first record of the
    cell is left out (its times cover the set-up before the first step). ``every_rank``: a
    step counts only once every rank logging the metric has a value there.
    """

    name: str
    color: str
    metric: str | None
    point: PointFn
    band: bool = False
    skip_first: bool = False
    every_rank: bool = False


@dataclass(frozen=True)
class Spark:
    """A panel's sparkline in the sidebar's run list: one series, its label, and the unit of its
    values (``"s"``: seconds, written as ms)."""

    label: str
    series: SeriesDef
    unit: str = ""


#: A panel's lines of the run's text summary, from the run (called only when a summary is made).
SummaryFn = Callable[["Run"], "Sequence[str]"]


@dataclass(frozen=True)
class LineDef:
    """A line panel as a definition: titles and series (see the module doc), plus its summary
    lines and its sparkline."""

    key: str
    title: str
    series: tuple[SeriesDef, ...]
    x_title: str = "step"
    summary: SummaryFn | None = None
    spark: Spark | None = None


@dataclass(frozen=True)
class BarDef:
    """A panel computed whole as a definition: the :class:`~jdist.protocol.BarPanel` (or a
    :class:`~jdist.protocol.HeatmapPanel`, :class:`~jdist.protocol.TablePanel`) drawn, plus its
    summary lines and its sparkline."""

    panel: BarPanel | HeatmapPanel | TablePanel
    summary: SummaryFn | None = None
    spark: Spark | None = None

    @property
    def key(self) -> str:
        return self.panel["key"]


PanelDef = Union[LineDef, BarDef]


def loss_metric(run: Run) -> str | None:
    """The metric the loss panel shows: ``"loss"`` if logged, else the first user scalar that is
    not a validation metric (``val_...``).

    >>> from jdist.metrics import Run
    >>> loss_metric(Run("x", 1, records=[])) is None
    True
    """
    names = run.metric_names
    if "loss" in names:
        return "loss"
    train = [n for n in names if not n.startswith("val_")]
    return (train or names or [None])[0]


def mean_band(step: Any, values: dict[int, float], prev: Any) -> tuple[float, float, float]:
    """Mean over the ranks, with their min and max (NaN left out: :func:`~jdist.metrics.stats.mean_min_max`).

    >>> mean_band(0, {0: 1.0, 1: 3.0, 2: float("nan")}, None)
    (2.0, 1.0, 3.0)
    """
    return mean_min_max(values.values())


def median_band(step: Any, values: dict[int, float], prev: Any) -> tuple[float, float, float]:
    """Median over the ranks, with their min and max (NaN left out).

    >>> median_band(0, {0: 1.0, 1: 5.0, 2: 2.0}, None)
    (2.0, 1.0, 5.0)
    """
    vals = [v for v in values.values() if not math.isnan(v)]
    if not vals:
        return math.nan, math.nan, math.nan
    return statistics.median(vals), min(vals), max(vals)


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


def line_points(run: Run, series: SeriesDef, steps: Sequence[Any], prev: Any = None
                ) -> tuple[list[Any], list[float], list[float], list[float]]:
    """``series``' points at ``steps`` (sorted; ``prev``: the step before them): ``(x, y, low, high)``,
    NaN where a value is missing. :func:`panels` passes every step, the live view a few at a time.
    jdist's point functions run on all steps at once (numpy); another one once per step.

    >>> from jdist.metrics import Run
    >>> run = Run("x", 2)
    >>> _ = run.add([{"rank": r, "seq": s, "step": s, "loss": float(r + s)} for s in (0, 1) for r in (0, 1)])
    >>> line_points(run, loss_panel(run).series[0], run.steps("loss"))
    ([0, 1], [0.5, 1.5], [0.0, 1.0], [1.0, 2.0])
    """
    if not series.metric or not len(steps):
        return [], [], [], []
    at, values, ranks = run.matrix(series.metric, steps)
    if series.skip_first:
        first = run.first_steps()
        values = values.copy()
        for j, rank in enumerate(ranks):
            step = first.get(rank)
            if step is not None:
                values[at == step, j] = np.nan
    before = np.concatenate([[np.nan if prev is None else prev], at[:-1]])
    keep = np.ones(len(at), dtype=bool)
    if series.every_rank:
        need = len(run.metric_ranks(series.metric, skip_first=series.skip_first))
        keep &= (~np.isnan(values)).sum(axis=1) >= need
    vector = _VECTOR.get(series.point)
    if vector is not None:
        ok, y, low, high = vector(at, values, before)
        keep &= ok
    else:
        y, low, high = np.full(len(at), np.nan), np.full(len(at), np.nan), np.full(len(at), np.nan)
        befores = [prev, *steps[:-1]]
        for i in np.flatnonzero(keep).tolist():
            row = values[i]
            pt = series.point(steps[i], {r: float(v) for r, v in zip(ranks, row.tolist()) if v == v}, befores[i])
            if pt is None:
                keep[i] = False
            else:
                y[i], low[i], high[i] = (math.nan if v is None else v for v in pt)
    chosen = np.flatnonzero(keep)
    xs = [steps[i] for i in chosen.tolist()]
    return xs, y[chosen].tolist(), low[chosen].tolist(), high[chosen].tolist()


def _mean_band_rows(at: np.ndarray, values: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, ...]:
    mean, low, high = row_stats(values)
    return np.ones(len(at), dtype=bool), mean, low, high


def _median_band_rows(at: np.ndarray, values: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, ...]:
    _, low, high = row_stats(values)
    if not values.shape[1]:
        return np.ones(len(at), dtype=bool), low, low, high
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row without values: NaN
        median = np.nanmedian(values, axis=1)
    return np.ones(len(at), dtype=bool), median, low, high


def _total_rows(at: np.ndarray, values: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, ...]:
    have = (~np.isnan(values)).any(axis=1) if values.shape[1] else np.zeros(len(at), dtype=bool)
    none = np.full(len(at), np.nan)
    return have, np.where(np.isnan(values), 0.0, values).sum(axis=1), none, none


def _rate_rows(at: np.ndarray, values: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, ...]:
    none = np.full(len(at), np.nan)
    if not values.shape[1]:
        return np.zeros(len(at), dtype=bool), none, none, none
    slowest = np.fmax.reduce(values, axis=1)
    ok = ~np.isnan(before) & ~np.isnan(slowest)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(slowest > 0, (at - before) / slowest, np.nan)
    return ok, rate, none, none


def series_of(run: Run, series: SeriesDef) -> LineSeries:
    """The :class:`~jdist.protocol.LineSeries` of ``series`` over every step logged (NaN as None)."""
    x, y, low, high = line_points(run, series, run.steps(series.metric) if series.metric else [])
    return LineSeries(name=series.name, color=series.color, x=x, y=finite(y),
                      low=finite(low) if series.band else None, high=finite(high) if series.band else None)


def line_panel(run: Run, line: LineDef) -> LinePanel:
    """The :class:`~jdist.protocol.LinePanel` of ``line`` over every step logged."""
    return LinePanel(key=line.key, kind="line", title=line.title, x_title=line.x_title,
                     series=[series_of(run, s) for s in line.series])


def seconds_per_step(run: Run) -> float | None:
    """Wall time per step over the run so far, from the records' ``time``, or ``None``.

    The time from the first logged step to the latest (across ranks), over the steps
    between them: steady over a long run (the ETA does not jump with a few slow steps),
    and the start-up before the first step does not count.

    >>> from jdist.metrics import Run
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

    >>> from jdist.metrics import Run
    >>> run = Run("x", 1, total_steps=10)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 3}])
    >>> steps_done(run)
    4
    """
    last = run.max_step()
    done = 0 if last is None else int(last) + 1
    return min(done, run.total_steps) if run.total_steps is not None else done


def eta_s(run: Run) -> float | None:
    """Seconds until ``total_steps`` at the run's pace so far (None: unknown, or not running).

    >>> from jdist.metrics import Run
    >>> run = Run("x", 1, total_steps=10)
    >>> _ = run.add([{"rank": 0, "seq": s, "step": s, "time": 100.0 + s} for s in range(4)])
    >>> eta_s(run)  # 6 steps left, 1 s each
    6.0
    """
    per_step = seconds_per_step(run)
    if per_step is None or run.total_steps is None or run.status != "running":
        return None
    return (run.total_steps - steps_done(run)) * per_step


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

    >>> from jdist.metrics import Run
    >>> rank_label(Run("x", 2, records=[], hosts={0: "gpu1", 1: "gpu2"}), 1)
    'rank 1 gpu2'
    >>> rank_label(Run("x", 2, records=[]), 1)
    'rank 1'
    """
    host = run.hosts.get(rank)
    return f"rank {rank} {host}" if host else f"rank {rank}"


def _mib(value: Any) -> float | None:
    return value / _MIB if is_number(value) else None


def _size(n: float) -> str:
    """Bytes in KiB/MiB/GiB, one decimal.

    >>> _size(512), _size(3 * 2**20), _size(1.5 * 2**30)
    ('0.5 KiB', '3.0 MiB', '1.5 GiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


# -- jdist's panels ----------------------------------------------------------------------------


def loss_panel(run: Run) -> LineDef:
    """The loss (or the first logged scalar): mean over ranks per step, with a min–max band; and
    its validation counterpart (``val_loss``) on the same chart when one is logged."""
    name = loss_metric(run)
    train = SeriesDef(name=name or "loss", color=BLUE, metric=name, point=mean_band, band=True)
    series = [train]
    if name and f"val_{name}" in run.metric_names:
        series.append(SeriesDef(name=f"val_{name}", color=ORANGE, metric=f"val_{name}", point=mean_band))
    return LineDef(key="loss", title=name or "loss", series=tuple(series),
                   spark=Spark(label=name or "loss", series=train))


def time_panel(run: Run) -> PanelDef:
    """Per rank, compute and communication time per step over the last steps (stacked); in the
    summary, each rank's step and communication time over the run. Beyond :data:`BARS_UP_TO`
    ranks: their distribution per step instead (median, min–max), and the summary names the slowest."""
    spark = Spark(label="step time", series=SeriesDef("step time", ORANGE, "step_time_s", mean_band), unit="s")
    ranks = _ranks(run)
    if len(ranks) > BARS_UP_TO:
        return LineDef(key="time", title=SPREAD_TITLE, x_title="step", series=(
            SeriesDef("step time", ORANGE, "step_time_s", median_band, band=True, skip_first=True),
            SeriesDef("communication", GREEN, "comm_time_s", median_band, band=True, skip_first=True)),
            summary=_spread_summary, spark=spark)
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
    panel = BarPanel(key="time", kind="bars", title=TIME_TITLE, unit="s", stacked=True,
                     categories=[rank_label(run, r) for r in ranks], series=[
                         BarSeries(name="compute", color=BLUE, values=finite(compute), labels=False),
                         BarSeries(name="communication", color=ORANGE, values=finite([comm_t.get(r) for r in ranks]),
                                   labels=False),
                     ])
    return BarDef(panel, summary=_time_summary, spark=spark)


def _spread_summary(run: Run) -> list[str]:
    """The ranks' median step time over the run and the slowest ranks, how much slower."""
    step = run.per_rank_mean("step_time_s", skip_first=True)
    if not step:
        return []
    median = statistics.median(step.values())
    slow = sorted(step, key=step.__getitem__, reverse=True)[:3]
    return [f"step time over {len(step)} ranks: median {median * 1e3:.1f} ms, slowest " + ", ".join(
        f"{rank_label(run, r)} {step[r] * 1e3:.1f} ms ({_slower(step[r], median)})" for r in slow)]


def _slower(value: float, median: float) -> str:
    """How much ``value`` is above ``median``: "+12%".

    >>> _slower(1.5, 1.0), _slower(1.0, 1.0)
    ('+50%', '+0%')
    """
    return f"{(value / median - 1) * 100:+.0f}%" if median > 0 else "-"


def _time_summary(run: Run) -> list[str]:
    """Each rank's step and communication time over the whole run (its first step left out)."""
    step, comm = run.per_rank_mean("step_time_s", skip_first=True), run.per_rank_mean("comm_time_s", skip_first=True)
    if not step:
        return []
    return ["step time per rank: " + ", ".join(
        f"r{r} {step[r] * 1e3:.1f} ms" + (f" (comm {comm[r] * 1e3:.1f})" if r in comm else "")  # no comm: not timed
        for r in sorted(step))]


def memory_panel(run: Run) -> BarDef:
    """Per rank, memory now and at its peak, and the model+optimizer state it holds; in the
    summary, each rank's peak memory and state. Beyond :data:`BARS_UP_TO` ranks: per host, the
    highest of its ranks."""
    ranks = _ranks(run)
    title = "GPU memory (MiB)" if run.device_kind == "cuda" else "host memory RSS (MiB)"
    categories, latest = _by_host(run, ranks)
    if len(categories) != len(ranks):
        title = title.replace(" (MiB)", ", highest rank per host (MiB)")
    panel = BarPanel(key="memory", kind="bars", title=title, unit="MiB", stacked=False,
                     categories=categories, series=[
                         BarSeries(name="current", color=BLUE, values=[_mib(rec.get("mem_bytes")) for rec in latest],
                                   labels=False),
                         BarSeries(name="peak", color=ORANGE, values=[_mib(rec.get("mem_peak_bytes")) for rec in latest],
                                   labels=False),
                         # small next to a process's RSS on CPU ranks: each bar is labelled with its value
                         BarSeries(name="model+optimizer", color=GREEN,
                                   values=[_mib(rec.get("state_bytes")) for rec in latest], labels=True),
                     ])
    return BarDef(panel, summary=_memory_summary)


def _by_host(run: Run, ranks: list[int]) -> tuple[list[str], list[dict[str, Any]]]:
    """Bar categories and the record each shows: a rank's latest, or beyond :data:`BARS_UP_TO`
    ranks one per host with each value the highest of its ranks' latest."""
    latest = [run.latest(r) or {} for r in ranks]
    if len(ranks) <= BARS_UP_TO:
        return [rank_label(run, r) for r in ranks], latest
    groups: dict[str, list[dict[str, Any]]] = {}
    for r, rec in zip(ranks, latest):
        groups.setdefault(run.hosts.get(r, ""), []).append(rec)
    cats, recs = [], []
    for host, members in groups.items():
        cats.append(host or f"all {len(members)} ranks")
        keys = {k for rec in members for k in rec}
        recs.append({k: max((rec[k] for rec in members if is_number(rec.get(k))), default=None) for k in keys})
    return cats, recs


def _memory_summary(run: Run) -> list[str]:
    """Each rank's peak memory and the model+optimizer state it holds (beyond :data:`BARS_UP_TO`
    ranks: the highest and the median)."""
    if len(run.ranks) > BARS_UP_TO:
        return _spread_lines(run, (("peak memory", "mem_peak_bytes"), ("model + optimizer state", "state_bytes")))
    lines = []
    peak = {r: (run.latest(r) or {}).get("mem_peak_bytes") for r in run.ranks}
    if any(peak.values()):
        kind = "GPU" if run.device_kind == "cuda" else "host RSS"
        lines.append(f"peak memory ({kind}): " + ", ".join(f"r{r} {v / _MIB:.0f} MiB" for r, v in peak.items() if v))
    state = {r: (run.latest(r) or {}).get("state_bytes") for r in run.ranks}
    if any(state.values()):
        lines.append("model + optimizer state: " + ", ".join(f"r{r} {_size(v)}" for r, v in state.items() if v))
    return lines


#: The memory breakdown: what each rank holds of the training state, by kind.
STATE_PARTS = (("parameters", "param_bytes", BLUE), ("gradients", "grad_bytes", ORANGE),
               ("optimizer state", "optim_bytes", GREEN))


def state_panel(run: Run) -> BarDef:
    """Per rank, the bytes of parameters, gradients and optimizer state it holds (stacked: local
    shards under FSDP and ZeRO, so DDP, FSDP and ZeRO stages compare at a glance); in the summary,
    each rank's breakdown."""
    ranks = _ranks(run)
    categories, latest = _by_host(run, ranks)
    title = "training state per rank (MiB)" if len(categories) == len(ranks) else \
        "training state, highest rank per host (MiB)"
    panel = BarPanel(key="state", kind="bars", title=title, unit="MiB", stacked=True,
                     categories=categories, series=[
                         BarSeries(name=name, color=color, values=[_mib(rec.get(metric)) for rec in latest], labels=True)
                         for name, metric, color in STATE_PARTS])
    return BarDef(panel, summary=_state_summary)


def _state_summary(run: Run) -> list[str]:
    """Each rank's parameters / gradients / optimizer state.

    >>> from jdist.metrics import Run
    >>> recs = [{"rank": r, "seq": 0, "step": 1, "time": 0.0, "cell": 1, "param_bytes": 2**20 * (2 - r),
    ...          "grad_bytes": 2**20, "optim_bytes": 2**21} for r in (0, 1)]
    >>> run = Run("x", 2); _ = run.add(recs)
    >>> _state_summary(run)
    ['training state (parameters / gradients / optimizer): r0 2.0 MiB / 1.0 MiB / 2.0 MiB, r1 1.0 MiB / 1.0 MiB / 2.0 MiB']
    """
    if len(run.ranks) > BARS_UP_TO:
        return _spread_lines(run, tuple((f"{name} per rank", metric) for name, metric, _ in STATE_PARTS))
    parts = {r: [(run.latest(r) or {}).get(metric) for _, metric, _ in STATE_PARTS] for r in run.ranks}
    shown = {r: v for r, v in parts.items() if any(is_number(x) for x in v)}
    if not shown:
        return []
    return ["training state (parameters / gradients / optimizer): " + ", ".join(
        f"r{r} " + " / ".join(_size(x) if is_number(x) else "-" for x in v) for r, v in shown.items())]


def _spread_lines(run: Run, metrics: Sequence[tuple[str, str]]) -> list[str]:
    """Per metric of the ranks' latest records: the highest (which rank) and the median, in bytes."""
    lines = []
    for label, metric in metrics:
        values = {r: v for r in run.ranks if is_number(v := (run.latest(r) or {}).get(metric))}
        if values:
            top = max(values, key=values.__getitem__)
            lines.append(f"{label}: highest {rank_label(run, top)} {_size(values[top])}, "
                         f"median {_size(statistics.median(values.values()))}")
    return lines


def host_order(run: Run) -> tuple[list[int], list[tuple[str, int, int]]]:
    """The ranks grouped by host (hosts in order of their lowest rank), and the groups as
    ``(host, first row, rows)`` (none when the ranks share one host).

    >>> from jdist.metrics import Run
    >>> host_order(Run("x", 4, hosts={0: "a", 1: "b", 2: "a", 3: "b"}))
    ([0, 2, 1, 3], [('a', 0, 2), ('b', 2, 2)])
    """
    ranks = _ranks(run)
    if not run.hosts:
        return ranks, []
    hosts = list(dict.fromkeys(run.hosts.get(r, "?") for r in ranks))
    order = sorted(ranks, key=lambda r: (hosts.index(run.hosts.get(r, "?")), r))
    groups, row = [], 0
    for host in hosts:
        count = sum(1 for r in order if run.hosts.get(r, "?") == host)
        groups.append((host, row, count))
        row += count
    return order, groups


def heat_cells(run: Run, metric: str, over: str | None = None, columns: int = HEAT_COLUMNS
               ) -> tuple[list[int], list[Any], np.ndarray]:
    """A rank × step grid of ``metric`` (divided by ``over`` when given: the communication share),
    for :func:`heatmap_panel`: the ranks (grouped by host), each column's last step, and the mean
    per (rank, column) (NaN: none), from :meth:`Run.bucket_means <jdist.metrics.Run.bucket_means>`."""
    order, _ = host_order(run)
    ranks, last, means = run.bucket_means(metric, over, columns)
    col_of = {rank: j for j, rank in enumerate(ranks)}
    grid = np.full((len(order), len(last)), np.nan)
    for i, rank in enumerate(order):
        j = col_of.get(rank)
        if j is not None:
            grid[i] = means[:, j]
    return order, last, grid


def heatmap_panel(run: Run, key: str, title: str, metric: str, over: str | None = None, unit: str = "s") -> BarDef:
    """A :class:`~jdist.protocol.HeatmapPanel` of :func:`heat_cells`: colour from the lowest mean
    to the highest (each rank's first step, the set-up, is left out)."""
    order, last, grid = heat_cells(run, metric, over)
    _, groups = host_order(run)
    finite_cells = grid[~np.isnan(grid)]
    low = float(finite_cells.min()) if finite_cells.size else None
    high = float(finite_cells.max()) if finite_cells.size else None
    if low is not None and high is not None and not high > low:
        high = low + (abs(low) or 1.0) * 1e-6
    if low is None or high is None:
        cells = np.full(grid.shape, 255, dtype=np.uint8)
    else:
        scaled = np.clip((grid - low) / (high - low) * 254, 0, 254)
        cells = np.where(np.isnan(grid), 255, np.round(np.nan_to_num(scaled))).astype(np.uint8)
    return BarDef(HeatmapPanel(key=key, kind="heatmap", title=title, unit=unit, x_title="step",
                               rows=[f"r{r}" for r in order], groups=[list(g) for g in groups],  # type: ignore[misc]
                               x=last, cells=base64.b64encode(cells.tobytes()).decode(), low=low, high=high,
                               colors=list(HEAT_COLORS), legend=[]))


def step_heatmap_panel(run: Run) -> BarDef | None:
    """Beyond :data:`BARS_UP_TO` ranks: each rank's step time over the run, as colour (stragglers
    are the bright rows; a host's ranks together)."""
    if len(_ranks(run)) <= BARS_UP_TO:
        return None
    return heatmap_panel(run, "step_heat", "step time per rank (s), rank × step", "step_time_s")


def comm_heatmap_panel(run: Run) -> BarDef | None:
    """Beyond :data:`BARS_UP_TO` ranks: each rank's share of its step spent communicating, as colour
    (a rank that waits on the others communicates longer)."""
    if len(_ranks(run)) <= BARS_UP_TO or not run.has("comm_time_s"):
        return None
    return heatmap_panel(run, "comm_heat", "communication share per rank, rank × step", "comm_time_s",
                         over="step_time_s", unit="")


def slowest_ranks(run: Run, count: int = SLOWEST) -> list[tuple[int, str, float, float, float | None]]:
    """The ``count`` slowest ranks over the last :data:`RECENT_STEPS` steps, slowest first:
    ``(rank, host, step time s, times the median, communication share)``.

    >>> from jdist.metrics import Run
    >>> run = Run("x", 3, hosts={0: "a", 1: "a", 2: "b"})
    >>> _ = run.add([{"rank": r, "seq": s, "step": s, "step_time_s": 0.1 * (1 + (r == 2))}
    ...              for s in range(3) for r in range(3)])
    >>> slowest_ranks(run, 2)
    [(2, 'b', 0.2, 2.0, None), (0, 'a', 0.1, 1.0, None)]
    """
    step = run.per_rank_mean("step_time_s", last=RECENT_STEPS, skip_first=True)
    if not step:
        return []
    share = run.comm_share(last=RECENT_STEPS, skip_first=True)
    median = statistics.median(step.values())
    slow = sorted(step, key=lambda r: (-step[r], r))[:count]
    return [(r, run.hosts.get(r, ""), step[r], step[r] / median if median > 0 else math.nan, share.get(r))
            for r in slow]


def slowest_panel(run: Run) -> BarDef | None:
    """Beyond :data:`BARS_UP_TO` ranks, or once a rank was named a straggler (:mod:`jdist.metrics.stragglers`):
    the slowest ranks, their host, how much slower than the median they are, their communication and data-wait
    shares, and the slowest host (the straggler view); the stragglers first, with their cause."""
    named = {s.rank: s for s in run.stragglers}
    if len(_ranks(run)) <= BARS_UP_TO and not named:
        return None
    slow = slowest_ranks(run)
    if named:  # the stragglers first (in synchronous training every rank's step is as long as the slowest's)
        everyone = slowest_ranks(run, len(_ranks(run)))
        slow = ([row for row in everyone if row[0] in named] + [row for row in slow if row[0] not in named])[:SLOWEST]
    data = run.per_rank_mean("data_time_s", last=RECENT_STEPS, skip_first=True)
    step = run.per_rank_mean("step_time_s", last=RECENT_STEPS, skip_first=True)
    note = ""
    if step:
        median = statistics.median(step.values())
        note = f"median {median * 1e3:.1f} ms over {len(step)} ranks, last {RECENT_STEPS} steps"
        by_host: dict[str, list[float]] = {}
        for r, v in step.items():
            by_host.setdefault(run.hosts.get(r, ""), []).append(v)
        if len(by_host) > 1:
            host, values = max(by_host.items(), key=lambda kv: statistics.mean(kv[1]))
            note += f"; slowest host {host}: {_slower(statistics.mean(values), median)} on average"
    rows = [[f"r{r}", host or "-", f"{t * 1e3:.1f} ms", _slower(ratio, 1.0) if ratio == ratio else "-",
             f"{share:.0%}" if share is not None else "-",
             f"{data[r] / step[r]:.0%}" if r in data and step.get(r) else "-",
             f"straggler ({named[r].cause})" if r in named else ""]
            for r, host, t, ratio, share in slow]
    if named:  # (the whole line is in the summary)
        note = "; ".join([*(f"straggler: rank {s.rank}, {s.score:.1f}x the others' time outside communication, "
                            + {"data": "waiting for data", "host load": "starved of CPU (host load)"}.get(
                                s.cause, "in its own computation")
                            for s in named.values()), *([note] if note else [])])
    return BarDef(TablePanel(key="slowest", kind="table", title="slowest ranks",
                             columns=["rank", "host", "step time", "vs median", "comm", "data wait", "flag"],
                             rows=rows, note=note),
                  summary=lambda r: [f"straggler: {s.line()}" for s in r.stragglers])


def hosts_panel(run: Run) -> BarDef | None:
    """The load of the ranks' hosts, each host's latest sample (its lowest rank samples it about
    once a second: :class:`jdist.protocol.HostMessage`): CPU, memory, network and GPUs, the busiest
    :data:`SLOWEST` hosts first. Shown when the ranks run on several hosts or beyond
    :data:`BARS_UP_TO` ranks."""
    latest = run.host_latest()
    if not latest or (len(latest) < 2 and len(_ranks(run)) <= BARS_UP_TO):
        return None
    ranks_on: dict[str, int] = {}
    for host in run.hosts.values():
        ranks_on[host] = ranks_on.get(host, 0) + 1
    busy = sorted(latest, key=lambda h: (-(latest[h].get("cpu") or 0.0), h))
    rows = []
    for host in busy[:SLOWEST]:
        x = latest[host]
        gpus = x.get("gpus") or []
        utils = [g["util"] for g in gpus if g.get("util") is not None]
        rows.append([host, str(ranks_on.get(host, run.world_size if len(latest) == 1 else "?")),
                     _share(x.get("cpu")), f"{_gib(x['mem_used'])} / {_gib(x['mem_total'])}" if x.get("mem_total") else "-",
                     f"{x['net_bytes_s'] / 1e6:.1f} MB/s" if is_number(x.get("net_bytes_s")) else "-",
                     f"{_share(statistics.mean(utils))} of {len(gpus)}" if utils else "-",
                     f"{_gib(sum(g['mem_used'] for g in gpus))} / {_gib(sum(g['mem_total'] for g in gpus))}"
                     if gpus else "-"])
    return BarDef(TablePanel(key="hosts", kind="table", title="hosts, busiest first",
                             columns=["host", "ranks", "CPU", "memory (GiB)", "network", "GPU", "GPU memory (GiB)"],
                             rows=rows, note=_hosts_line(latest)), summary=lambda r: [_hosts_line(latest)])


def _hosts_line(latest: dict[str, dict[str, Any]]) -> str:
    """The hosts' CPU and network, median and highest (which host)."""
    parts = [f"{len(latest)} hosts"]
    for label, key, show in (("CPU", "cpu", _share), ("network", "net_bytes_s", lambda v: f"{v / 1e6:.1f} MB/s")):
        values = {h: x[key] for h, x in latest.items() if is_number(x.get(key))}
        if values:
            top = max(values, key=values.__getitem__)
            parts.append(f"{label} median {show(statistics.median(values.values()))}, highest {top} {show(values[top])}")
    return "; ".join(parts)


def _share(value: Any) -> str:
    """A fraction as a percentage: "45%" ("-" when unknown)."""
    return f"{value:.0%}" if is_number(value) else "-"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


#: Colours of the mesh dimensions in the communication-by-dimension panel, in the order first seen.
DIM_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
#: The pipeline panel's colour scale: forward of an even / odd micro-batch, backward of an even / odd one,
#: a weight-gradient action (values 0, .25, .5, .75, 1; idle: no value).
PIPE_COLORS = ["#1f77b4", "#9ecae1", "#e6550d", "#fdae6b", "#31a354"]
#: Columns of the pipeline panel (time bins of its step).
PIPE_COLUMNS = 120


def comm_dims_panel(run: Run) -> BarDef | None:
    """With device meshes: per rank, the communication time per step on each mesh dimension over the last
    steps (stacked; ``comm_time_<dim>_s``). Beyond :data:`BARS_UP_TO` ranks: a bar per dimension, the
    ranks' median. None without a mesh."""
    dims = run.comm_dims
    if not dims:
        return None
    means = {d: run.per_rank_mean(f"comm_time_{d}_s", last=RECENT_STEPS, skip_first=True) for d in dims}
    ranks = _ranks(run)
    title = f"communication by mesh dimension per step (s), last {RECENT_STEPS} steps"
    if len(ranks) > BARS_UP_TO:
        values = [statistics.median(means[d].values()) if means[d] else None for d in dims]
        panel = BarPanel(key="comm_dims", kind="bars", title=title + ", median of the ranks", unit="s", stacked=False,
                         categories=list(dims), series=[BarSeries(name="median", color=ORANGE, values=finite(values),
                                                                  labels=True)])
    else:
        panel = BarPanel(key="comm_dims", kind="bars", title=title, unit="s", stacked=True,
                         categories=[rank_label(run, r) for r in ranks], series=[
                             BarSeries(name=d, color=DIM_COLORS[i % len(DIM_COLORS)],
                                       values=finite([means[d].get(r) for r in ranks]), labels=False)
                             for i, d in enumerate(dims)])
    return BarDef(panel, summary=_dims_summary)


def _dims_summary(run: Run) -> list[str]:
    """Communication per step on each mesh dimension: the mean over the ranks, and its highest rank."""
    parts = []
    for d in run.comm_dims:
        per = run.per_rank_mean(f"comm_time_{d}_s", skip_first=True)
        if per:
            top = max(per, key=per.__getitem__)
            parts.append(f"{d} {statistics.mean(per.values()) * 1e3:.1f} ms (highest {rank_label(run, top)} "
                         f"{per[top] * 1e3:.1f})")
    return ["communication per step by mesh dimension: " + ", ".join(parts)] if parts else []


def pipeline_theory(stages: int, microbatches: int) -> float:
    """The bubble of a GPipe or 1F1B schedule of equal stages: ``(p - 1) / (m + p - 1)``.

    >>> round(pipeline_theory(4, 4), 3), round(pipeline_theory(4, 8), 3)
    (0.429, 0.273)
    """
    return (stages - 1) / (microbatches + stages - 1)


def pipeline_panel(run: Run) -> BarDef | None:
    """A pipeline's newest step as a Gantt chart (``torch.distributed.pipelining``; :attr:`Run.pipeline`):
    a row per stage (and its rank), time across, each forward and backward of a micro-batch as colour (even
    and odd micro-batches in two shades, a legend instead of a colour scale), idle time blank; the title has the measured bubble (``bubble_frac``, the
    mean over the stages' last steps) beside ``(p - 1) / (m + p - 1)``. None without a pipeline."""
    latest = run.pipeline_step()
    if latest is None:
        return None
    step, rows = latest
    t0 = min(row[5] for row in rows)
    span = max(row[6] for row in rows) - t0 or 1e-9
    stages = sorted({(row[2], row[1]) for row in rows})
    order = {key: i for i, key in enumerate(stages)}
    grid = np.full((len(stages), PIPE_COLUMNS), 255, dtype=np.uint8)
    code = {"F": 0, "B": 2, "I": 2, "W": 4}
    for _, rank, stage, mb, action, start, end in rows:
        value = code.get(action, 4)
        value = value + (1 if value < 4 and isinstance(mb, int) and mb % 2 else 0)
        lo = int((start - t0) / span * PIPE_COLUMNS)
        hi = max(lo + 1, int(math.ceil((end - t0) / span * PIPE_COLUMNS)))
        grid[order[(stage, rank)], lo:min(hi, PIPE_COLUMNS)] = round(value / 4 * 254)
    m, p = _pipe_shape(rows)
    bubble = run.per_rank_mean("bubble_frac", last=RECENT_STEPS, skip_first=True)
    measured = f"bubble {statistics.mean(bubble.values()):.2f} measured" if bubble else "bubble not measured yet"
    title = f"pipeline, step {step}: {measured}, (p-1)/(m+p-1) = {pipeline_theory(p, m):.2f} (p={p}, m={m})"
    panel = HeatmapPanel(key="pipeline", kind="heatmap", title=title, unit="", x_title=f"ms into step {step}",
                         rows=[f"stage {stage} r{rank}" for stage, rank in stages], groups=[],
                         x=[round((j + 1) * span / PIPE_COLUMNS * 1e3, 3) for j in range(PIPE_COLUMNS)],
                         cells=base64.b64encode(grid.tobytes()).decode(), low=0.0, high=1.0,
                         colors=list(PIPE_COLORS), legend=_pipe_legend(rows))
    return BarDef(panel, summary=_pipeline_summary)


def _pipe_shape(rows: list[list[Any]]) -> tuple[int, int]:
    """A pipeline step's micro-batches and stage ranks per pipeline (``m``, ``p`` of the bubble's theory): the
    stages over the stages each rank runs (Interleaved 1F1B: several; on a 3-D mesh each stage has several
    ranks, which count once).

    >>> _pipe_shape([[0, r, r % 2 + 2 * (i % 2), 0, "F", 0, 1] for r in range(2) for i in range(2)])
    (1, 2)
    """
    m = len({row[3] for row in rows if row[4] == "F"})
    per_rank: dict[int, set[int]] = {}
    for row in rows:
        per_rank.setdefault(row[1], set()).add(row[2])
    stages = len({row[2] for row in rows})
    return m, max(1, stages // max(len(s) for s in per_rank.values()))


def _pipe_legend(rows: list[list[Any]]) -> list[tuple[str, str]]:
    """The pipeline panel's legend: the actions its step has (idle time is blank)."""
    actions = {row[4] for row in rows}
    legend = [("forward", PIPE_COLORS[0]), ("backward", PIPE_COLORS[2])]
    return legend + [("weight grad", PIPE_COLORS[4])] if "W" in actions else legend


def _pipeline_summary(run: Run) -> list[str]:
    latest = run.pipeline_step()
    if latest is None:
        return []
    _, rows = latest
    m, p = _pipe_shape(rows)
    stages = len({row[2] for row in rows})
    ranks = len({row[1] for row in rows})
    bubble = run.per_rank_mean("bubble_frac", skip_first=True)
    measured = (f"bubble {statistics.mean(bubble.values()):.2f} measured (mean over stages, "
                f"{min(bubble.values()):.2f}..{max(bubble.values()):.2f})") if bubble else "bubble not measured"
    return [f"pipeline: {stages} stages on {ranks} ranks, {m} micro-batches a step; {measured}, "
            f"{pipeline_theory(p, m):.2f} = (p-1)/(m+p-1)"]


def throughput_panel(run: Run) -> LineDef:
    """Samples/s summed over the ranks once a batch size is known (even before a point can be
    drawn, so the title does not flip), at steps every rank reporting it has reached; else steps/s."""
    if any(isinstance((run.latest(r) or {}).get("samples_per_s"), (int, float)) for r in run.ranks):
        return LineDef(key="throughput", title="throughput, samples/s (all ranks)", series=(
            SeriesDef(name="throughput", color=BLUE, metric="samples_per_s", point=total, skip_first=True,
                      every_rank=True),))
    return LineDef(key="throughput", title="throughput, steps/s", series=(
        SeriesDef(name="throughput", color=BLUE, metric="step_time_s", point=rate_of_slowest),))


#: jdist's panels, in the order the views lay them out (two per row); plugins' follow (:func:`all_panels`).
PANELS: tuple[Callable[[Run], PanelDef | None], ...] = (
    loss_panel, time_panel, memory_panel, throughput_panel, state_panel, comm_dims_panel, pipeline_panel,
    slowest_panel, step_heatmap_panel, comm_heatmap_panel, hosts_panel)


def all_panels() -> tuple[Callable[[Run], PanelDef | None], ...]:
    """jdist's panels, then those of installed panel plugins (entry point group ``jdist.panels``).
    A panel's function returns ``None`` for a run it has nothing to show for (the large-world
    panels at up to :data:`BARS_UP_TO` ranks)."""
    from jdist.plugins import panel_plugins

    return (*PANELS, *panel_plugins())


def definitions(run: Run) -> list[PanelDef]:
    """Every panel's definition for ``run``'s current records."""
    return [d for build in all_panels() if (d := build(run)) is not None]


def to_panel(run: Run, d: PanelDef) -> Panel:
    """A definition as the data the renderers draw."""
    return line_panel(run, d) if isinstance(d, LineDef) else d.panel


def panels(run: Run) -> list[Panel]:
    """Every panel for ``run``'s current records."""
    return [to_panel(run, d) for d in definitions(run)]


def summary(run: Run) -> str:
    """The run's plain-text summary (``Run.summary()``): status, steps, each logged metric's last
    mean over ranks, then each panel's summary lines.

    >>> from jdist.metrics import Run
    >>> run = Run("x", 1, status="finished", started=0.0, ended=2.0)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "loss": 0.5}])
    >>> print(summary(run))
    jdist run x: finished after 2.0 s, 1 ranks (no backend, cpu), 1 records
      last step: 0
      loss: 0.5 (mean over ranks, range 0.5..0.5) at step 0
    """
    dur = (run.ended or time.time()) - run.started
    lines = [f"jdist run {run.run_id}: {run.status} after {dur:.1f} s, {run.world_size} ranks"
             f" ({run.backend or 'no backend'}, {run.device_kind}), {run.count()} records"]
    last = run.max_step()
    if last is not None:
        lines.append(f"  last step: {last}")
    for name in run.metric_names:
        steps, mean, lo, hi = run.aggregate(name)
        if steps:
            lines.append(f"  {name}: {mean[-1]:.4g} (mean over ranks, range {lo[-1]:.4g}..{hi[-1]:.4g}) "
                         f"at step {steps[-1]}")
    lines += [f"  {line}" for d in definitions(run) if d.summary is not None for line in d.summary(run)]
    if run.path:
        lines.append(f"  run log: {run.path}")
    return "\n".join(lines)


def sparks(run: Run, max_points: int = SPARK_POINTS) -> list[SparkModel]:
    """The sidebar's sparklines of ``run``: one per panel that has a :class:`Spark`."""
    out = []
    for d in definitions(run):
        if d.spark is None:
            continue
        s = d.spark.series
        x, y, _, _ = line_points(run, s, run.steps(s.metric) if s.metric else [])
        y_ok = finite(y)
        xs, ys = thin(x, y_ok, max_points=max_points)
        out.append(SparkModel(key=d.key, label=d.spark.label, color=s.color, unit=d.spark.unit, x=xs, y=ys,
                              last=y_ok[-1] if y_ok else None))
    return out


#: jdist's point functions, each computed for many steps at once (same results as the function).
_VECTOR: dict[Any, Callable[..., tuple[np.ndarray, ...]]] = {
    mean_band: _mean_band_rows, median_band: _median_band_rows, total: _total_rows, rate_of_slowest: _rate_rows}


__all__ = [
    "BARS_UP_TO",
    "BLUE",
    "GREEN",
    "MAX_POINTS",
    "ORANGE",
    "PANELS",
    "RECENT_STEPS",
    "TIME_TITLE",
    "BarDef",
    "LineDef",
    "PanelDef",
    "PointFn",
    "SeriesDef",
    "Spark",
    "SummaryFn",
    "all_panels",
    "definitions",
    "eta_s",
    "line_panel",
    "line_points",
    "loss_metric",
    "heat_cells",
    "host_order",
    "mean_band",
    "median_band",
    "panels",
    "rate_of_slowest",
    "seconds_per_step",
    "slowest_ranks",
    "sparks",
    "steps_done",
    "summary",
    "thin",
    "thin_panel",
    "total",
]
