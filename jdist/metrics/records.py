"""Metric records and their cross-rank aggregation (pure: no ipyparallel, widgets or torch).

The rank runtime (:mod:`jdist.rank`) produces records, the kernel feeds them into a
:class:`Run`, the dashboard panels (:mod:`jdist.metrics.panels`) read aggregates from it and
the run log (:mod:`jdist.metrics.runlog`) persists it.

A record is a flat ``dict``: ``rank``, ``cell``, ``seq`` (per-rank sequence number within a
cell), ``step``, ``time`` (unix seconds), the automatic metrics of :data:`AUTO_METRICS` and
every scalar given to ``jdist.log``.

Example:
    >>> run = Run("demo", world_size=2)
    >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "loss": 1.0},
    ...              {"rank": 1, "seq": 0, "step": 0, "loss": 3.0}])
    >>> run.aggregate("loss")
    ([0], [2.0], [1.0], [3.0])
"""

from __future__ import annotations

import math
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from jdist.protocol import RECORD_KEYS, Record, RunMeta

#: Automatic metrics added to every record by the rank runtime (``None`` when unknown).
AUTO_METRICS: dict[str, str] = {
    "step_time_s": "wall time since the previous jdist.log call on this rank (first step: since the cell started)",
    "comm_time_s": "wall time within the step during which the backend communicated: DDP/Horovod gradient "
    "all-reduces, FSDP all-gathers and reduce-scatters (intervals in flight, overlaps counted once)",
    "compute_time_s": "step_time_s - comm_time_s",
    "mem_bytes": "CUDA memory allocated on GPU ranks; process RSS (host memory) on CPU ranks",
    "mem_peak_bytes": "peak CUDA memory allocated on GPU ranks; peak process RSS on CPU ranks",
    "samples_per_s": "batch_size x batches since the previous log (training forwards of prepared models, at "
    "least 1) / step_time_s on this rank, when a batch size is known",
    "state_bytes": "bytes this rank holds of the prepared models' parameters and gradients and the prepared "
    "optimizers' state (local shards under FSDP)",
}

RESERVED: frozenset[str] = frozenset(RECORD_KEYS) | frozenset(AUTO_METRICS)


def new_run_id() -> str:
    """A sortable, unique run id such as ``20261122-041501-3f9a1c``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def missing_seqs(received: Iterable[int], count: int) -> list[int]:
    """Sequence numbers in ``range(count)`` that are not in ``received``.

    >>> missing_seqs([0, 1, 3], 5)
    [2, 4]
    """
    seen = set(received)
    return [s for s in range(count) if s not in seen]


@dataclass
class Run:
    """All records of one ``%%distributed`` cell execution, in arrival order.

    ``history`` gives them as a pandas DataFrame; ``aggregate`` gives the
    cross-rank mean/min/max of one metric per step, as the dashboard shows it.
    """

    run_id: str
    world_size: int
    backend: str = ""
    device_kind: str = "cpu"
    code: str = ""
    total_steps: int | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None
    status: str = "running"
    error: str | None = None
    path: Path | None = None
    cluster_id: str | None = None  # the ipyparallel cluster that ran it (links runs to clusters)
    records: list[Record] = field(default_factory=list)
    _seen: set[tuple[int, int, int]] = field(default_factory=set, repr=False)
    _by_metric: dict[str, dict[Any, dict[int, float]]] = field(
        default_factory=lambda: defaultdict(dict), repr=False
    )
    _latest: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)

    def add(self, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Add records, dropping duplicates (same rank, cell and seq); return the new ones."""
        new = []
        for rec in records:
            key = (rec["rank"], rec.get("cell", 0), rec["seq"])
            if key in self._seen:
                continue
            self._seen.add(key)
            self.records.append(rec)
            new.append(rec)
            rank = rec["rank"]
            self._latest[rank] = rec
            step = rec.get("step")
            for name, value in rec.items():
                if name in RECORD_KEYS or not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                self._by_metric[name].setdefault(step, {})[rank] = float(value)
        return new

    @property
    def metric_names(self) -> list[str]:
        """User-logged scalar names, in first-seen order (automatic metrics excluded)."""
        return [m for m in self._by_metric if m not in AUTO_METRICS]

    @property
    def ranks(self) -> list[int]:
        return sorted(self._latest)

    def latest(self, rank: int) -> dict[str, Any] | None:
        """The most recent record of ``rank``."""
        return self._latest.get(rank)

    def count(self, rank: int | None = None) -> int:
        """Number of records (of one rank, or all)."""
        if rank is None:
            return len(self.records)
        return sum(1 for r in self.records if r["rank"] == rank)

    def aggregate(self, metric: str) -> tuple[list[Any], list[float], list[float], list[float]]:
        """Per step: (steps, mean, min, max) of ``metric`` across the ranks that logged it.

        Steps are sorted; ``None`` steps (``jdist.log`` without ``step=``) are left out.
        """
        per_step = self._by_metric.get(metric, {})
        steps = sorted(s for s in per_step if s is not None)
        means, lows, highs = [], [], []
        for s in steps:
            vals = [v for v in per_step[s].values() if not math.isnan(v)]
            if not vals:
                vals = [math.nan]
            means.append(sum(vals) / len(vals))
            lows.append(min(vals))
            highs.append(max(vals))
        return steps, means, lows, highs

    def per_rank_mean(self, metric: str, last: int | None = None, skip_first: bool = False) -> dict[int, float]:
        """Mean of ``metric`` per rank, over all steps or the ``last`` N steps of each rank.

        ``skip_first``: leave out each rank's first step when it has others (the first
        ``step_time_s`` counts from the start of the cell, set-up code included).
        """
        values: dict[int, list[float]] = defaultdict(list)
        per_step = self._by_metric.get(metric, {})
        for s in sorted(per_step, key=lambda x: (x is None, x)):
            for rank, v in per_step[s].items():
                values[rank].append(v)
        out = {}
        for rank, vals in values.items():
            if skip_first and len(vals) > 1:
                vals = vals[1:]
            vals = [v for v in (vals[-last:] if last else vals) if not math.isnan(v)]
            if vals:
                out[rank] = sum(vals) / len(vals)
        return out

    def max_step(self) -> Any:
        """The highest step any rank has logged, or ``None``."""
        steps = [r.get("step") for r in self._latest.values() if isinstance(r.get("step"), (int, float))]
        return max(steps) if steps else None

    @property
    def history(self):
        """One row per (rank, step): ``rank``, ``step``, every logged scalar and the automatic metrics.

        >>> Run("x", 1, records=[]).history.empty
        True
        """
        import pandas as pd

        cols = ["rank", "step", "time", *self.metric_names, *AUTO_METRICS]
        if not self.records:
            return pd.DataFrame(columns=cols)
        df = pd.DataFrame.from_records(self.records)
        for c in cols:
            if c not in df.columns:
                df[c] = None
        df = df[cols + [c for c in df.columns if c not in cols and c not in ("seq", "cell")]]
        return df.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)

    def meta(self) -> RunMeta:
        """The JSON-able description of this run (what ``meta.json`` holds)."""
        return RunMeta(
            run_id=self.run_id,
            world_size=self.world_size,
            backend=self.backend,
            device_kind=self.device_kind,
            code=self.code,
            total_steps=self.total_steps,
            started=self.started,
            ended=self.ended,
            status=self.status,
            error=self.error,
            records=len(self.records),
            cluster_id=self.cluster_id,
        )

    def to_tensorboard(self, logdir: str | Path) -> Path:
        """Write this run as TensorBoard event files, per rank and mean (:mod:`jdist.metrics.export`);
        returns ``<logdir>/<run_id>``. Needs ``jdist[tracking]``.

        >>> jdist.last_run().to_tensorboard("tb")   # doctest: +SKIP
        """
        from .export import to_tensorboard

        return to_tensorboard(self, logdir)

    def to_mlflow(self, tracking_uri: str | None = None, experiment: str = "jdist", run_name: str | None = None) -> str:
        """Write this run as an MLflow run, per rank and mean, with its parameters
        (:mod:`jdist.metrics.export`); returns the MLflow run id. Needs ``jdist[tracking]``.

        >>> jdist.last_run().to_mlflow("sqlite:///mlflow.db")   # doctest: +SKIP
        """
        from .export import to_mlflow

        return to_mlflow(self, tracking_uri, experiment, run_name)

    def summary(self) -> str:
        """A short plain-text summary: status, steps, final loss-like metrics, timings."""
        dur = (self.ended or time.time()) - self.started
        lines = [
            f"jdist run {self.run_id}: {self.status} after {dur:.1f} s, {self.world_size} ranks"
            f" ({self.backend or 'no backend'}, {self.device_kind}), {len(self.records)} records"
        ]
        last = self.max_step()
        if last is not None:
            lines.append(f"  last step: {last}")
        for name in self.metric_names:
            steps, mean, lo, hi = self.aggregate(name)
            if steps:
                lines.append(f"  {name}: {mean[-1]:.4g} (mean over ranks, range {lo[-1]:.4g}..{hi[-1]:.4g}) at step {steps[-1]}")
        st = self.per_rank_mean("step_time_s", skip_first=True)
        ct = self.per_rank_mean("comm_time_s", skip_first=True)
        if st:
            parts = ", ".join(
                f"r{r} {st[r] * 1e3:.1f} ms (comm {ct.get(r, 0.0) * 1e3:.1f})" for r in sorted(st)
            )
            lines.append(f"  step time per rank: {parts}")
        mem = {r: self._latest[r].get("mem_peak_bytes") for r in self.ranks}
        if any(v for v in mem.values()):
            kind = "GPU" if self.device_kind == "cuda" else "host RSS"
            parts = ", ".join(f"r{r} {v / 2**20:.0f} MiB" for r, v in mem.items() if v)
            lines.append(f"  peak memory ({kind}): {parts}")
        state = {r: self._latest[r].get("state_bytes") for r in self.ranks}
        if any(v for v in state.values()):
            parts = ", ".join(f"r{r} {_size(v)}" for r, v in state.items() if v)
            lines.append(f"  model + optimizer state: {parts}")
        if self.path:
            lines.append(f"  run log: {self.path}")
        return "\n".join(lines)


def _size(n: float) -> str:
    """Bytes in KiB/MiB/GiB, one decimal.

    >>> _size(512), _size(3 * 2**20), _size(1.5 * 2**30)
    ('0.5 KiB', '3.0 MiB', '1.5 GiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


