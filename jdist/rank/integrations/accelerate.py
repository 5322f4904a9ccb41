"""``jdist.AccelerateTracker``: ``accelerator.log(...)`` on jdist's dashboard.

Accelerate logs on its main process only (rank 0), so the values come from rank 0; write
``jdist.log(step=..., loss=...)`` in the loop instead to see every rank.

Example (in a ``%%distributed`` cell):
    >>> accelerator = Accelerator(log_with=jdist.AccelerateTracker())   # doctest: +SKIP
    >>> accelerator.init_trackers("demo")                               # doctest: +SKIP
    >>> accelerator.log({"loss": loss.item()}, step=step)               # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from jdist.errors import need

from . import scalars

_tracking = need("accelerate.tracking", "jdist.AccelerateTracker", "hf")


class AccelerateTracker(_tracking.GeneralTracker):
    """An Accelerate tracker whose ``log`` is ``jdist.log``."""

    name = "jdist"
    requires_logging_directory = False

    def __init__(self, run_name: str = "jdist", **kwargs: Any) -> None:
        super().__init__()
        from ..auto_metrics import logs_itself

        logs_itself()  # accelerator.log(...) gives the records, in this cell and later ones: no automatic ones
        self.run_name = run_name
        self.config: dict[str, Any] = {}

    @property
    def tracker(self) -> None:
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.config = dict(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        import jdist

        jdist.log(step=step, **scalars(values))
