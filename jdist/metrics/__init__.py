"""Metric records, their aggregation, the run log and the dashboard panels (pure data code:
no ipyparallel, widgets or torch; used by the kernel, the ranks and the server alike).

- :mod:`~jdist.metrics.records`: the record format, :data:`AUTO_METRICS`, :class:`Run`;
- :mod:`~jdist.metrics.store`: a run's values as columns (:class:`~jdist.metrics.store.RecordStore`), the
  records as they travel and are logged (:class:`~jdist.metrics.store.RecordBatch`);
  :mod:`~jdist.metrics.budget`: how much memory the kernel's runs may hold;
- :mod:`~jdist.metrics.runlog`: run folders on disk (:class:`RunLog`, :func:`read_run`);
- :mod:`~jdist.metrics.panels`: what each dashboard panel shows, as data every view renders, and
  what each adds to a run's summary and sidebar entry; :mod:`~jdist.metrics.stats`: the numeric
  rules they share; :mod:`~jdist.metrics.live`: the live dashboard's incremental view;
  :mod:`~jdist.metrics.export`: a run to TensorBoard / MLflow.
"""

from .records import AUTO_METRICS, CORE_METRICS, MESH_METRICS, RECORD_KEYS, Run, new_run_id, reserved
from .runlog import RunLog, RunReader, default_run_dir, list_runs, read_records, read_run

__all__ = [
    "AUTO_METRICS",
    "CORE_METRICS",
    "MESH_METRICS",
    "RECORD_KEYS",
    "Run",
    "RunLog",
    "RunReader",
    "default_run_dir",
    "list_runs",
    "new_run_id",
    "read_records",
    "read_run",
    "reserved",
]
