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

import bisect
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Iterable

from jdist.protocol import RECORD_KEYS, Record, RunMeta

from .stats import mean_min_max

#: jdist's own automatic metrics, added to every record by the rank runtime (``None`` when unknown).
CORE_METRICS: dict[str, str] = {
    "step_time_s": "wall time since the previous jdist.log call on this rank (first step: since the cell started)",
    "comm_time_s": "wall time within the step during which the backend communicated: DDP/Horovod gradient "
    "all-reduces, FSDP all-gathers and reduce-scatters (intervals in flight, overlaps counted once)",
    "compute_time_s": "step_time_s - comm_time_s",
    "mem_bytes": "CUDA memory allocated on GPU ranks; process RSS (host memory) on CPU ranks",
    "mem_peak_bytes": "peak CUDA memory allocated on GPU ranks; peak process RSS on CPU ranks",
    "samples_per_s": "batch_size x batches since the previous log (training forwards of prepared models, at "
    "least 1) / step_time_s on this rank, when a batch size is known",
    "state_bytes": "bytes this rank holds of the prepared models' parameters and gradients and the prepared "
    "optimizers' state (local shards under FSDP and ZeRO): param_bytes + grad_bytes + optim_bytes",
    "param_bytes": "bytes of the prepared models' parameters this rank holds (FSDP, ZeRO-3: its shard)",
    "grad_bytes": "bytes of gradients this rank holds (FSDP, ZeRO-2/3: the partition it reduces)",
    "optim_bytes": "bytes of optimizer state this rank holds (FSDP, ZeRO-1/2/3: its partition, with "
    "ZeRO's fp32 master weights), wherever it lives (host memory under --offload)",
}



@cache
def _auto_metrics() -> dict[str, str]:
    from jdist.plugins import metric_specs

    return {**CORE_METRICS, **{name: meaning for spec in metric_specs() for name, meaning in spec.metrics}}


class _AutoMetrics(Mapping[str, str]):
    """Every automatic metric: jdist's own, then installed metric plugins' (:class:`jdist.plugins.MetricSpec`),
    read on first use."""

    def __getitem__(self, name: str) -> str:
        return _auto_metrics()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_auto_metrics())

    def __len__(self) -> int:
        return len(_auto_metrics())

    def __repr__(self) -> str:
        return repr(_auto_metrics())


#: Automatic metrics added to every record: name -> meaning (jdist's own, then plugins').
AUTO_METRICS: Mapping[str, str] = _AutoMetrics()


@cache
def reserved() -> frozenset[str]:
    """Names ``jdist.log`` refuses: the record keys and the automatic metrics."""
    return frozenset(RECORD_KEYS) | frozenset(_auto_metrics())


def _insert_sorted(steps: list[Any], step: Any) -> None:
    """Insert ``step`` into the sorted list ``steps``; O(1) when it is the highest (records come in step order)."""
    if not steps or step > steps[-1]:
        steps.append(step)
    else:
        bisect.insort(steps, step)


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
    #: rank -> host, when the ranks ran on several hosts (empty on one: the panels then leave it out)
    hosts: dict[int, str] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    #: (rank, cell) -> the lowest seq not seen yet (every lower one was), and seqs above it seen early:
    #: O(1) per record and no memory per record, where a set of every (rank, cell, seq) grew with the run
    _next_seq: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)
    _ahead: dict[tuple[int, int], set[int]] = field(default_factory=dict, repr=False)
    _by_metric: dict[str, dict[Any, dict[int, float]]] = field(
        default_factory=lambda: defaultdict(dict), repr=False
    )
    _latest: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    #: (metric, rank) -> the numeric steps at which that rank logged it, sorted
    _rank_steps: dict[tuple[str, int], list[Any]] = field(default_factory=lambda: defaultdict(list), repr=False)
    _steps: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list), repr=False)  # metric -> sorted
    _first_step: dict[int, Any] = field(default_factory=dict, repr=False)  # rank -> step of its seq 0 record
    _timed: list[tuple[Any, float]] = field(default_factory=list, repr=False)  # lowest, highest (step, time)

    def add(self, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Add records, dropping duplicates (same rank, cell and seq); return the new ones."""
        new = []
        by_metric, steps_of, rank_steps = self._by_metric, self._steps, self._rank_steps
        for rec in records:
            if not self._first_time(rec["rank"], rec.get("cell", 0), rec["seq"]):
                continue
            self.records.append(rec)
            new.append(rec)
            rank = rec["rank"]
            self._latest[rank] = rec
            step = rec.get("step")
            if rec["seq"] == 0:
                self._first_step[rank] = step
            when = rec.get("time")
            if step is not None and when is not None:
                timed = (step, when)
                if not self._timed:
                    self._timed = [timed, timed]
                elif timed < self._timed[0]:
                    self._timed[0] = timed
                elif timed > self._timed[1]:
                    self._timed[1] = timed
            for name, value in rec.items():  # per record and field: the kernel's hottest loop
                kind = type(value)
                if kind is not float and kind is not int:  # None, strings, bools (type(True) is bool)
                    if not isinstance(value, (int, float)) or isinstance(value, bool):
                        continue
                if name in RECORD_KEYS:
                    continue
                by_step = by_metric[name]
                at_step = by_step.get(step)
                if at_step is None:
                    at_step = by_step[step] = {}
                    if step is not None:
                        _insert_sorted(steps_of[name], step)
                if rank not in at_step and step is not None:
                    _insert_sorted(rank_steps[name, rank], step)
                at_step[rank] = float(value)
        return new

    def _first_time(self, rank: int, cell: int, seq: int) -> bool:
        """Whether (rank, cell, seq) was not added before (and note it)."""
        key = (rank, cell)
        nxt = self._next_seq.get(key, 0)
        if seq == nxt:  # the usual case: records come in order
            nxt += 1
            ahead = self._ahead.get(key)
            while ahead and nxt in ahead:
                ahead.discard(nxt)
                nxt += 1
            self._next_seq[key] = nxt
            return True
        if seq < nxt:
            return False
        ahead = self._ahead.setdefault(key, set())
        if seq in ahead:
            return False
        ahead.add(seq)
        return True

    def steps(self, metric: str) -> list[Any]:
        """The steps at which some rank logged ``metric``, sorted (``None`` steps left out). Do not modify."""
        return self._steps.get(metric, [])

    def step_values(self, metric: str) -> dict[Any, dict[int, float]]:
        """``{step: {rank: value}}`` of ``metric`` (a rank's latest value where it logged a step twice).
        Do not modify."""
        return self._by_metric.get(metric, {})

    def first_steps(self) -> dict[int, Any]:
        """``{rank: step}`` of each rank's first record of the cell (``seq`` 0)."""
        return self._first_step

    def metric_ranks(self, metric: str, skip_first: bool = False) -> list[int]:
        """The ranks that logged ``metric`` at a step (other than at their first record's step, if ``skip_first``).

        >>> run = Run("x", 2)
        >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "v": 1.0}, {"rank": 0, "seq": 1, "step": 1, "v": 1.0},
        ...              {"rank": 1, "seq": 0, "step": 0, "v": 1.0}])
        >>> run.metric_ranks("v"), run.metric_ranks("v", skip_first=True)
        ([0, 1], [0])
        """
        out = []
        for (m, rank), steps in self._rank_steps.items():
            only_first = skip_first and len(steps) == 1 and self._first_step.get(rank) == steps[0]
            if m == metric and steps and not only_first:
                out.append(rank)
        return sorted(out)

    def frontier(self, metric: str) -> Any:
        """The highest step every rank that logs ``metric`` has reached (``None`` before any): the
        slowest rank's latest step of it."""
        tops = [steps[-1] for (m, _), steps in self._rank_steps.items() if m == metric and steps]
        return min(tops) if tops else None

    def time_span(self) -> tuple[tuple[Any, float], tuple[Any, float]] | None:
        """The lowest and highest ``(step, time)`` of the records that have both, or ``None``."""
        return (self._timed[0], self._timed[1]) if self._timed else None

    @property
    def metric_names(self) -> list[str]:
        """User-logged scalar names, in first-seen order (automatic metrics excluded)."""
        auto = _auto_metrics()
        return [m for m in self._by_metric if m not in auto]

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
        steps = list(self.steps(metric))
        stats = [mean_min_max(per_step[s].values()) for s in steps]
        return steps, [m for m, _, _ in stats], [lo for _, lo, _ in stats], [hi for _, _, hi in stats]

    def per_rank_mean(self, metric: str, last: int | None = None, skip_first: bool = False) -> dict[int, float]:
        """Mean of ``metric`` per rank, over all steps or the ``last`` N steps of each rank.

        ``skip_first``: leave out each rank's first step when it has others (the first
        ``step_time_s`` counts from the start of the cell, set-up code included). Values
        logged without a step count as the latest. Costs O(``last``) per rank, not O(steps).

        >>> run = Run("x", 1)
        >>> _ = run.add([{"rank": 0, "seq": s, "step": s, "t": float(s)} for s in range(5)])
        >>> run.per_rank_mean("t", last=2, skip_first=True)
        {0: 3.5}
        """
        per_step = self._by_metric.get(metric, {})
        unstepped = per_step.get(None, {})
        out = {}
        for rank in sorted({r for (m, r) in self._rank_steps if m == metric} | set(unstepped)):
            steps: list[Any] = self._rank_steps.get((metric, rank), [])
            count = len(steps) + (rank in unstepped)
            start = 1 if skip_first and count > 1 else 0
            if last:
                start = max(start, count - last)
            chosen = steps[start:]
            vals = [per_step[s][rank] for s in chosen]
            if rank in unstepped and count > start:
                vals.append(unstepped[rank])
            vals = [v for v in vals if not math.isnan(v)]
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
            hosts={str(r): h for r, h in sorted(self.hosts.items())},
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
        """A short plain-text summary: status, steps, final loss-like metrics, timings (each panel's
        summary lines: :func:`jdist.metrics.panels.summary`)."""
        from .panels import summary

        return summary(self)
