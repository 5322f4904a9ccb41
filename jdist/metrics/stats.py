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
