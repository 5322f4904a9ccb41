"""The few numeric rules every view of a run shares, defined once: what counts as a value
(:func:`is_number`), values as JSON has them (:func:`finite`), and the cross-rank statistic the
dashboard, the summary, the sidebar and the trackers show (:func:`mean_min_max`).

Example:
    >>> is_number(1.5), is_number(float("nan")), is_number(True)
    (True, False, False)
    >>> mean_min_max([1.0, 3.0, float("nan")])
    (2.0, 1.0, 3.0)
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np


def is_number(value: Any) -> bool:
    """A finite int or float (bools and None are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def finite(values: Iterable[Any]) -> list[float | None]:
    """Values that are not finite numbers as None (JSON and the charts have no NaN).

    >>> finite([1.0, float("nan"), float("inf"), None])
    [1.0, None, None, None]
    """
    return [v if is_number(v) else None for v in values]


def mean_min_max(values: Iterable[float]) -> tuple[float, float, float]:
    """Mean, min and max of ``values``, NaN left out; all NaN when none is left.

    >>> mean_min_max([float("nan")])
    (nan, nan, nan)
    """
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan, math.nan, math.nan
    return sum(vals) / len(vals), min(vals), max(vals)


def row_stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``values``: mean, min and max of its values (NaN left out; all NaN for a row
    without any): :func:`jdist.metrics.stats.mean_min_max` for many steps at once.

    >>> [x.tolist() for x in row_stats(np.array([[1.0, 3.0], [np.nan, np.nan]]))]
    [[2.0, nan], [1.0, nan], [3.0, nan]]
    """
    rows = values.shape[0]
    if not values.shape[1]:
        empty = np.full(rows, np.nan)
        return empty, empty.copy(), empty.copy()
    have = ~np.isnan(values)
    count = have.sum(axis=1)
    total = np.where(have, values, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, np.nan)
    return mean, np.fmin.reduce(values, axis=1), np.fmax.reduce(values, axis=1)


def tail_sums(data: np.ndarray, take: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column of ``data``: the sum of its last ``take[col]`` values (NaN skipped, not counted) and
    how many were summed. Reads only the rows those values are in (a window from the end, widened
    for columns with gaps)."""
    width = data.shape[1]
    sums, got = np.zeros(width), np.zeros(width, dtype=np.int64)
    need = take.copy()
    rows = data.shape[0]
    todo = np.flatnonzero(need > 0)
    window = int(need.max(initial=0)) + 8
    while todo.size:
        block = data[max(rows - window, 0):, todo]
        have = ~np.isnan(block)
        from_end = np.cumsum(have[::-1], axis=0)[::-1]  # values at or after each row
        chosen = have & (from_end <= need[todo])
        sums[todo] = np.where(chosen, block, 0.0).sum(axis=0)
        got[todo] = chosen.sum(axis=0)
        if window >= rows:
            break
        todo = todo[got[todo] < need[todo]]
        window *= 4
    return sums, got
