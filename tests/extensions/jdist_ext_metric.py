"""An automatic metric of one's own: ``log_index``, how many ``jdist.log`` calls this rank made
before this one, counted on the training thread (``at_log``)."""

from __future__ import annotations

from typing import Any, Sequence

from jdist.plugins import MetricSpec

LOG_INDEX = MetricSpec("log_index", "jdist_ext_metric:LogIndex",
                       metrics=(("log_index", "jdist.log calls this rank made before this one"),))


class LogIndex:
    names = ("log_index",)

    def __init__(self) -> None:
        self.calls = 0

    def begin_cell(self, s: Any, now: float) -> None:
        pass

    def at_log(self, s: Any, rec: dict[str, Any], now: float) -> None:
        rec["log_index"] = self.calls
        self.calls += 1

    def fill(self, s: Any, entries: Sequence[Any], now: float, final: bool) -> None:
        pass
