"""The sweeps the server can see: ``jdist.tune`` folders under each run log root, as REST models.

A sweep's kernel keeps two files in its folder (``<run dir>/sweeps/<name>/``) up to date while it
runs: ``sweep.json`` (a :class:`jdist.protocol.SweepSummaryModel`) and ``view.html`` (the view the
notebook shows, :mod:`jdist.metrics.sweep`). Each is replaced whole, so reading needs no lock. A
sweep written "running" whose cluster is gone is "lost" (its kernel died or was restarted while it
ran; the journal keeps every finished trial: ``jdist.tune(..., resume=True)``).

Example:
    >>> import tempfile
    >>> SweepIndex(tempfile.mkdtemp()).summaries([], limit=5, live=set(), notebooks={})
    []
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Iterable

from jdist.protocol import FOLDER_NAME, SweepDetailModel, SweepSummaryModel


def read_sweep(folder: Path, live: set[str], notebooks: dict[str, str | None]) -> SweepSummaryModel | None:
    """The sweep in ``folder`` with its status as the server sees it; None if it has no readable summary."""
    try:
        data = json.loads((folder / "sweep.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "name" not in data:
        return None
    cluster = data.get("cluster_id")
    if data.get("status") == "running" and cluster not in live:
        data["status"] = "lost"
    data["notebook"] = notebooks.get(cluster or "") or data.get("notebook")
    return data  # type: ignore[return-value]


class SweepIndex:
    """Sweep folders under ``<root>/sweeps`` of ``run_dir`` (and other roots given per call), newest first."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)

    def folders(self, extra_roots: Iterable[str | Path]) -> list[Path]:
        roots = dict.fromkeys(Path(p).resolve() for p in [self.run_dir, *extra_roots])
        return [p.parent for root in roots for p in (root / "sweeps").glob("*/sweep.json")]

    def summaries(self, extra_roots: Iterable[str | Path], limit: int, live: set[str],
                  notebooks: dict[str, str | None]) -> list[SweepSummaryModel]:
        """The ``limit`` sweeps written last (the sidebar's list; a running one is rewritten twice a second):
        only their summaries are read."""
        def written(folder: Path) -> float:
            try:
                return (folder / "sweep.json").stat().st_mtime
            except OSError:
                return 0.0

        newest = sorted(self.folders(extra_roots), key=written, reverse=True)
        found = (s for s in (read_sweep(f, live, notebooks) for f in newest) if s is not None)
        return list(itertools.islice(found, max(1, limit)))

    def detail(self, name: str, extra_roots: Iterable[str | Path], live: set[str],
               notebooks: dict[str, str | None]) -> SweepDetailModel | None:
        """One sweep with its view; None if there is none called ``name`` (ValueError: a bad name)."""
        if not FOLDER_NAME.fullmatch(name) or name.startswith("."):
            raise ValueError(f"Bad sweep name {name!r}.")
        for folder in self.folders(extra_roots):
            if folder.name == name:
                summary = read_sweep(folder, live, notebooks)
                if summary is None:
                    continue
                try:
                    page = (folder / "view.html").read_text()
                except OSError:
                    page = ""
                return SweepDetailModel(**summary, html=page)
        return None
