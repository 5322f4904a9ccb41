"""Metric records, their aggregation, the run log and the dashboard panels (pure data code:
no ipyparallel, widgets or torch; used by the kernel, the ranks and the server alike).

- :mod:`~jdist.metrics.records`: the record format, :data:`AUTO_METRICS`, :class:`Run`;
- :mod:`~jdist.metrics.runlog`: run folders on disk (:class:`RunLog`, :func:`read_run`);
- :mod:`~jdist.metrics.panels`: what each dashboard panel shows, as data every view renders.
"""

from .records import AUTO_METRICS, RECORD_KEYS, RESERVED, Run, missing_seqs, new_run_id
from .runlog import RunLog, RunReader, default_run_dir, list_runs, read_records, read_run

__all__ = [
    "AUTO_METRICS",
    "RECORD_KEYS",
    "RESERVED",
    "Run",
    "RunLog",
    "RunReader",
    "default_run_dir",
    "list_runs",
    "missing_seqs",
    "new_run_id",
    "read_records",
    "read_run",
]
