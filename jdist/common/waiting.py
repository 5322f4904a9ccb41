"""Waiting for a condition, in one place: :func:`poll_until`.

Example:
    >>> import itertools
    >>> counter = itertools.count()
    >>> poll_until(lambda: next(counter) >= 3, timeout=5, interval=0.001)
    True
    >>> poll_until(lambda: None, timeout=0.01, interval=0.001) is None
    True
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def poll_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """Call ``predicate()`` every ``interval`` seconds until it returns something truthy, or
    ``timeout`` seconds have passed; return its last value (falsy: it timed out). It is called
    at least once, and once more at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return value
        time.sleep(min(interval, remaining))
