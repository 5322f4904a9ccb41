"""The run log: one folder per run, written by the kernel, read by anyone (the server extension,
other tools) while it is being written.

``<run dir>/<run id>/meta.json`` (:class:`jdist.protocol.RunMeta`, rewritten atomically) and
``hosts.jsonl``: the load of the ranks' hosts, a line per sample (:class:`jdist.protocol.HostMessage`);
``pipeline.jsonl``: the pipeline schedules' actions, a line per rank's message (:class:`jdist.protocol.PipelineMessage`);
``metrics.jdc``: the records, one binary frame per batch as it arrived (:meth:`RecordBatch.encode
<jdist.metrics.store.RecordBatch.encode>`: a JSON header naming the columns, then each column's
bytes), appended and flushed. Read it with :func:`read_run` (``read_run(path).history`` is a
DataFrame). A run of another launcher's ranks (:mod:`jdist.rank.filelog`) has one
``metrics.r<rank>.jsonl`` per rank instead (a record per line), as had the runs of earlier
versions of jdist (``metrics.jsonl``); both are read too. The run dir is ``$JDIST_RUN_DIR``, else
``<jupyter data dir>/jdist/runs`` (:func:`default_run_dir`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from .records import Run
from .stragglers import Straggler
from .store import HOSTS_FILE, PIPELINE_FILE, RECORDS_FILE, RecordBatch, folder_files, load_batches, read_file, read_frames, read_records

__all__ = ["RECORDS_FILE", "RunLog", "RunReader", "default_run_dir", "list_runs", "load_batches", "read_frames",
           "read_records", "read_run"]


def default_run_dir() -> Path:
    """Where run folders go: ``$JDIST_RUN_DIR``, else ``<jupyter data dir>/jdist/runs``."""
    env = os.environ.get("JDIST_RUN_DIR")
    if env:
        return Path(env).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "jdist" / "runs"


class RunLog:
    """One folder per run: ``meta.json`` and ``metrics.jdc`` (a frame per batch of records).

    >>> import tempfile
    >>> log = RunLog(Run("r1", 1), tempfile.mkdtemp())
    >>> log.append([{"rank": 0, "seq": 0, "step": 0, "loss": 0.5}]); log.close()
    >>> read_run(log.path).history["loss"].tolist()
    [0.5]
    """

    def __init__(self, run: Run, root: str | os.PathLike | None = None):
        self.run = run
        self.path = Path(root) if root is not None else default_run_dir()
        self.path = self.path / run.run_id
        self.path.mkdir(parents=True, exist_ok=True)
        run.path = self.path
        self._fh = open(self.path / RECORDS_FILE, "ab")
        self._hosts: Any = None  # hosts.jsonl, opened with the first host sample
        self._pipeline: Any = None  # pipeline.jsonl, opened with the first pipeline message
        self.write_meta()

    def write_meta(self) -> None:
        """Rewrite ``meta.json`` atomically from the run's current state."""
        tmp = self.path / "meta.json.tmp"
        tmp.write_text(json.dumps(self.run.meta(), indent=1))
        tmp.replace(self.path / "meta.json")

    def append(self, records: RecordBatch | Iterable[dict[str, Any]]) -> None:
        """Append a batch of records as one frame and flush it to disk."""
        batch = records if isinstance(records, RecordBatch) else RecordBatch.from_records(list(records))
        if batch.n:
            self._fh.write(batch.encode())
            self._fh.flush()

    def append_host(self, sample: dict[str, Any]) -> None:
        """Append a host's load (:class:`jdist.protocol.HostMessage`) to ``hosts.jsonl``."""
        if self._hosts is None:
            self._hosts = open(self.path / HOSTS_FILE, "a", encoding="utf-8")
        self._hosts.write(json.dumps(sample) + "\n")
        self._hosts.flush()

    def append_pipeline(self, message: dict[str, Any]) -> None:
        """Append a rank's pipeline actions (:class:`jdist.protocol.PipelineMessage`) to ``pipeline.jsonl``."""
        if self._pipeline is None:
            self._pipeline = open(self.path / PIPELINE_FILE, "a", encoding="utf-8")
        self._pipeline.write(json.dumps(message) + "\n")
        self._pipeline.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        for side in (self._hosts, self._pipeline):
            if side is not None and not side.closed:
                side.close()
        self.write_meta()


def read_run(path: str | os.PathLike) -> Run:
    """Load a run folder written by :class:`RunLog` (also while it is still being written)."""
    return RunReader(path).update()


class RunReader:
    """Follows a run folder while it is written: each :meth:`update` re-reads ``meta.json``
    if it changed and only the new complete frames (or lines) of the records files.

    >>> import tempfile
    >>> log = RunLog(Run("r2", 1), tempfile.mkdtemp())
    >>> reader = RunReader(log.path)
    >>> log.append([{"rank": 0, "seq": 0, "step": 0, "loss": 0.5}])
    >>> reader.update().count()
    1
    >>> log.append([{"rank": 0, "seq": 1, "step": 1, "loss": 0.4}]); log.close()
    >>> run = reader.update(); run.count(), run.status
    (2, 'running')
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.run: Run | None = None
        self._offsets: dict[str, int] = {}  # per records file: bytes read
        self._meta_stamp: tuple[int, int] | None = None
        #: the batches of new records the last :meth:`update` added
        self.new: list[RecordBatch] = []

    def update(self) -> Run:
        """The run with everything written so far (the same :class:`Run` object each time)."""
        st = (self.path / "meta.json").stat()
        stamp = (st.st_mtime_ns, st.st_size)
        if self.run is None or stamp != self._meta_stamp:
            meta = json.loads((self.path / "meta.json").read_text())
            self._meta_stamp = stamp
            fields = dict(
                backend=meta.get("backend", ""),
                device_kind=meta.get("device_kind", "cpu"),
                code=meta.get("code", ""),
                total_steps=meta.get("total_steps"),
                started=meta.get("started", 0.0),
                ended=meta.get("ended"),
                status=meta.get("status", "unknown"),
                error=meta.get("error"),
                cluster_id=meta.get("cluster_id"),
                hosts={int(r): h for r, h in (meta.get("hosts") or {}).items()},
            )
            if self.run is None:
                self.run = Run(run_id=meta["run_id"], world_size=meta["world_size"], path=self.path, **fields)
            else:
                for name, value in fields.items():
                    setattr(self.run, name, value)
            self.run.stragglers[:] = [Straggler(**s) for s in meta.get("stragglers") or ()]
        names = folder_files(self.path)
        self.new = [self.run.add_batch(batch) for name in names for batch in self._read(name)]
        for name in names:
            if name.startswith("hosts") and name.endswith(".jsonl"):
                samples, self._offsets[name] = read_records(self.path / name, self._offsets.get(name, 0))
                for sample in samples:
                    self.run.add_host(sample)
            elif name.startswith("pipeline") and name.endswith(".jsonl"):
                messages, self._offsets[name] = read_records(self.path / name, self._offsets.get(name, 0))
                for message in messages:
                    self.run.add_pipeline(message)
        failed = [n for n in names if n.startswith("failed.r") and n.endswith(".json")]
        if failed and self.run.status != "failed":  # a rank of another launcher failed (jdist.rank.filelog)
            first = min((json.loads((self.path / n).read_text()) for n in failed), key=lambda f: f["time"])
            self.run.status, self.run.error = "failed", first["error"]
        return self.run


    def _read(self, name: str) -> list[RecordBatch]:
        """The new complete batches of one file of the folder (none for a file without records)."""
        batches, self._offsets[name] = read_file(self.path / name, self._offsets.get(name, 0))
        return batches


def list_runs(root: str | os.PathLike | None = None) -> list[Path]:
    """Run folders under ``root`` (default :func:`default_run_dir`), newest first."""
    root = Path(root) if root is not None else default_run_dir()
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if (p / "meta.json").exists()), reverse=True)
