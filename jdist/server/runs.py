"""The runs the server can see: run folders followed incrementally, as REST models.

:class:`RunIndex` keeps one :class:`~jdist.metrics.RunReader` per listed run. The server's
pool threads use it concurrently (the sidebar's list and a run view poll the same live run),
so each reader has a lock, held while it reads new records *and* while anything is computed
from its :class:`~jdist.metrics.Run`: no thread ever reads a Run that another thread is
changing. The REST models (:class:`jdist.protocol.RunSummaryModel`,
:class:`~jdist.protocol.RunDetailModel`) carry the same panels as the notebook dashboard
(:mod:`jdist.metrics.panels`), thinned for transport.

Example:
    >>> import tempfile
    >>> RunIndex(tempfile.mkdtemp()).summaries([], limit=5, live=set(), notebooks={})
    []
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from jdist.metrics import Run, RunReader, list_runs
from jdist.metrics.panels import MAX_POINTS, eta_s, panels, sparks, steps_done, thin_panel
from jdist.metrics.stats import finite
from jdist.protocol import FOLDER_NAME, RunDetailModel, RunHeadModel, RunSummaryModel

#: Run views whose last reply is kept (a run view polls every second).
DETAIL_CACHE = 8
T = TypeVar("T")


class _Followed:
    def __init__(self, path: Path):
        self.reader = RunReader(path)
        self.lock = threading.Lock()


def effective_status(run: Run, live: set[str]) -> str:
    """The run's status; a "running" run whose cluster is gone is "lost" (it never finished)."""
    if run.status == "running" and run.cluster_id and run.cluster_id not in live:
        return "lost"
    return run.status


def run_head(run: Run, live: set[str], notebook: str | None) -> RunHeadModel:
    return RunHeadModel(run_id=run.run_id, status=effective_status(run, live), world_size=run.world_size,
                        backend=run.backend, device_kind=run.device_kind, started=run.started, ended=run.ended,
                        records=run.count(), total_steps=run.total_steps, cluster_id=run.cluster_id,
                        error=run.error, notebook=notebook, steps_done=steps_done(run))


def run_summary(run: Run, live: set[str], notebook: str | None) -> RunSummaryModel:
    """A run for the sidebar's list: head, and the sparkline of each panel that has one (with its last value)."""
    return RunSummaryModel(**run_head(run, live, notebook), sparks=sparks(run))


def run_detail(run: Run, live: set[str], notebook: str | None, path: Path) -> RunDetailModel:
    """A run for the run view: every dashboard panel, long lines thinned as in the live dashboard."""
    head = run_head(run, live, notebook)
    return RunDetailModel(**head, code=run.code, path=str(path), eta_s=finite([eta_s(run)])[0], summary=run.summary(),
                          panels=[thin_panel(p, MAX_POINTS) for p in panels(run)])


class RunIndex:
    """Run folders under ``run_dir`` (and other roots given per call), newest first."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self._lock = threading.Lock()  # guards the dicts below (not the runs)
        self._followed: dict[Path, _Followed] = {}
        self._details: dict[Path, tuple[Any, RunDetailModel]] = {}

    def roots(self, extra: Iterable[str | Path]) -> list[Path]:
        return list(dict.fromkeys(Path(p).resolve() for p in [self.run_dir, *extra]))

    def paths(self, roots: Iterable[Path]) -> list[Path]:
        found = [p for root in roots for p in list_runs(root)]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def read(self, path: Path, compute: Callable[[Run], T]) -> T:
        """``compute(run)`` on the run at ``path`` brought up to date, under its reader's lock."""
        with self._lock:
            followed = self._followed.get(path)
            if followed is None:
                followed = self._followed[path] = _Followed(path)
        with followed.lock:
            return compute(followed.reader.update())

    def running(self) -> dict[str, str]:
        """cluster id -> id of its newest running run (from the runs already followed)."""
        with self._lock:
            followed = sorted(self._followed.values(), key=lambda f: f.reader.path.name)
        out: dict[str, str] = {}
        for f in followed:
            with f.lock:
                run = f.reader.run
                if run is not None and run.status == "running" and run.cluster_id:
                    out[run.cluster_id] = run.run_id
        return out

    def summaries(self, extra_roots: Iterable[str | Path], limit: int, live: set[str],
                  notebooks: dict[str, str | None]) -> list[RunSummaryModel]:
        """The newest ``limit`` runs (sidebar list); stops following the runs no longer listed."""
        paths = self.paths(self.roots(extra_roots))[: max(1, limit)]
        out = []
        for path in paths:
            try:
                out.append(self.read(path, lambda run: run_summary(run, live, notebooks.get(run.cluster_id or ""))))
            except (OSError, ValueError, KeyError):
                continue  # removed, or not a complete run folder yet
        with self._lock:
            keep = set(paths) | set(self._details)
            for p in set(self._followed) - keep:
                del self._followed[p]  # their Run objects hold every record
        return out

    def detail(self, run_id: str, extra_roots: Iterable[str | Path], live: set[str],
               notebooks: dict[str, str | None]) -> RunDetailModel | None:
        """One run with every panel; None if there is no run ``run_id`` (ValueError: a bad id)."""
        if not FOLDER_NAME.fullmatch(run_id):
            raise ValueError(f"Bad run id {run_id!r}.")
        path = next((root / run_id for root in self.roots(extra_roots) if (root / run_id / "meta.json").exists()), None)
        if path is None:
            return None

        def compute(run: Run) -> RunDetailModel:
            key = (run.count(), run.status, run.ended, run.total_steps, run.cluster_id in live)
            with self._lock:
                cached = self._details.get(path)
            if cached and cached[0] == key:
                return cached[1]
            detail = run_detail(run, live, notebooks.get(run.cluster_id or ""), path)
            with self._lock:
                self._details[path] = (key, detail)
                while len(self._details) > DETAIL_CACHE:  # the oldest opened run views
                    self._details.pop(next(iter(self._details)))
            return detail

        return self.read(path, compute)
