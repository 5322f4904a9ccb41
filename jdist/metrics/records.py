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
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Iterable

import dataclasses

import numpy as np

from jdist.protocol import RECORD_KEYS, Record, RunMeta

from .stats import row_stats, tail_sums
from .store import RecordBatch, RecordStore

#: jdist's own automatic metrics, added to every record by the rank runtime (``None`` when unknown).
CORE_METRICS: dict[str, str] = {
    "step_time_s": "wall time since the previous record on this rank: a jdist.log call, or without jdist.log an "
    "optimizer step (--auto-metrics); the first: since the cell started",
    "comm_time_s": "wall time within the step during which the rank communicated: DDP/Horovod gradient "
    "all-reduces, FSDP all-gathers and reduce-scatters, the script's own torch.distributed collectives with "
    "--auto-metrics (intervals in flight, overlaps counted once)",
    "compute_time_s": "step_time_s - comm_time_s",
    "comm_bytes": "bytes of the tensors the step's collectives carried, counted as they ran (every step, also "
    "those whose comm_time_s was not sampled): a DDP's gradient buckets as its all-reduce sends them (compressed "
    "under jdist.prepare(compression=...)), and with --auto-metrics the torch.distributed collectives' inputs "
    "(FSDP2's all-gathers and reduce-scatters, the script's own), and --backend fsdp's; not counted: DTensor's "
    "functional collectives, pipeline sends, Horovod, DeepSpeed, a comm hook of the script's own; None where "
    "nothing is timed (torchrun's group)",
    "data_time_s": "seconds within the step the rank waited for its next batch: time in the __next__ of every "
    "torch DataLoader iterator (a prepared loader's too), with --auto-metrics; None without",
    "mem_bytes": "CUDA memory allocated on GPU ranks; process RSS (host memory) on CPU ranks",
    "mem_peak_bytes": "peak CUDA memory allocated on GPU ranks; peak process RSS on CPU ranks",
    "cpu_wait_s": "seconds the rank's training thread waited for a CPU (runnable while another process or thread "
    "had its core: the kernel's run-queue delay, /proc/self/schedstat), read once per published batch and split "
    "over its records; a straggler's host load; None where the kernel keeps no such count",
    "samples_per_s": "batch_size x batches since the previous log (training forwards of prepared models, at "
    "least 1) / step_time_s on this rank, when a batch size is known",
    "state_bytes": "bytes this rank holds of the prepared models' parameters and gradients and the prepared "
    "optimizers' state (local shards under FSDP and ZeRO): param_bytes + grad_bytes + optim_bytes",
    "param_bytes": "bytes of the prepared models' parameters this rank holds (FSDP, ZeRO-3: its shard)",
    "grad_bytes": "bytes of gradients this rank holds (FSDP, ZeRO-2/3: the partition it reduces)",
    "optim_bytes": "bytes of optimizer state this rank holds (FSDP, ZeRO-1/2/3: its partition, with "
    "ZeRO's fp32 master weights), wherever it lives (host memory under --offload)",
}


#: Automatic metrics of model parallelism, on the records of the ranks whose code uses it: a field per mesh
#: dimension name (on every record of a rank once it built a mesh) and a pipeline stage's: name -> meaning.
MESH_METRICS: dict[str, str] = {
    "comm_time_<dim>_s": "the part of comm_time_s on one dimension of the device meshes the code built (--mesh, "
    "init_device_mesh: comm_time_dp_s, comm_time_tp_s...): collectives on that dimension's groups, DTensor's "
    "functional collectives (tensor and sequence parallel), FSDP on its dimension, DDP on its group; one field "
    "per dimension, 0 where it did not communicate",
    "pp_stage": "a pipeline stage's records (torch.distributed.pipelining schedules): the lowest stage index the "
    "rank runs",
    "bubble_frac": "a pipeline stage's records: the share of the time since the rank's previous record in which "
    "it ran no forward or backward of a micro-batch (its bubble)",
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


def is_mesh_metric(name: str) -> bool:
    """Whether ``name`` is one of :data:`MESH_METRICS` (``comm_time_<dim>_s``, ``pp_stage``, ``bubble_frac``).

    >>> is_mesh_metric("comm_time_tp_s"), is_mesh_metric("bubble_frac"), is_mesh_metric("loss")
    (True, True, False)
    """
    return name in MESH_METRICS or is_dim_comm(name)


def is_dim_comm(name: str) -> bool:
    """Whether ``name`` is a mesh dimension's communication time (``comm_time_<dim>_s``, automatic).

    >>> is_dim_comm("comm_time_tp_s"), is_dim_comm("comm_time_s"), is_dim_comm("loss")
    (True, False, False)
    """
    return name.startswith("comm_time_") and name.endswith("_s") and len(name) > len("comm_time__s")


@cache
def reserved() -> frozenset[str]:
    """Names ``jdist.log`` refuses: the record keys and the automatic metrics (``comm_time_<dim>_s`` is
    refused by its prefix)."""
    return frozenset(RECORD_KEYS) | frozenset(_auto_metrics()) | (frozenset(MESH_METRICS) - {"comm_time_<dim>_s"})


def new_run_id() -> str:
    """A sortable, unique run id such as ``20261122-041501-3f9a1c``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


#: Load samples kept in memory per host (about ten minutes at one a second).
HOST_SAMPLES = 600
#: Pipeline actions (:attr:`Run.pipeline` rows) a run keeps in memory, the newest (the run folder's
#: ``pipeline.jsonl`` has every one): 4 stages x 8 micro-batches x 2 actions a step, 1500 steps.
PIPELINE_ROWS = 100_000


class Run:
    """All records of one ``%%distributed`` cell execution, kept as columns (:mod:`jdist.metrics.store`).

    ``history`` gives them as a pandas DataFrame, built on demand; ``aggregate`` gives the
    cross-rank mean/min/max of one metric per step, as the dashboard shows it. A run that
    has a run folder can be :meth:`release` d: its values leave memory and come back from the
    folder the next time anything asks for them (:class:`jdist.metrics.budget.RunBudget` does
    this for the kernel's older runs).
    """

    def __init__(self, run_id: str, world_size: int, backend: str = "", device_kind: str = "cpu", code: str = "",
                 total_steps: int | None = None, started: float | None = None, ended: float | None = None,
                 status: str = "running", error: str | None = None, path: Path | None = None,
                 cluster_id: str | None = None, hosts: dict[int, str] | None = None,
                 records: Iterable[Record] | None = None):
        self.run_id = run_id
        self.world_size = world_size
        self.backend = backend
        self.device_kind = device_kind
        self.code = code
        self.total_steps = total_steps
        self.started = time.time() if started is None else started
        self.ended = ended
        self.status = status
        self.error = error
        self.path = path
        self.cluster_id = cluster_id  # the ipyparallel cluster that ran it (links runs to clusters)
        #: rank -> host, when the ranks ran on several hosts (empty on one: the panels then leave it out)
        self.hosts: dict[int, str] = dict(hosts or {})
        #: the ranks named as stragglers while it ran (:class:`jdist.metrics.stragglers.Straggler`, in order)
        self.stragglers: list[Any] = []
        self._count = 0
        self._released = False
        self._reset()
        if records:
            self.add(list(records))

    def _reset(self) -> None:
        self._store = RecordStore(self.world_size)
        self._rank_count: dict[int, int] = defaultdict(int)
        #: (rank, cell) -> the lowest seq not seen yet (every lower one was), and seqs above it seen early
        self._next_seq: dict[tuple[int, int], int] = {}
        self._ahead: dict[tuple[int, int], set[int]] = {}
        self._latest: dict[int, Record] = {}
        self._first_step: dict[int, Any] = {}  # rank -> step of its seq 0 record
        self._timed: list[tuple[Any, float]] = []  # lowest, highest (step, time)
        self._unstepped: dict[str, dict[int, float]] = defaultdict(dict)  # metric -> rank -> latest value
        self._buckets: dict[tuple[str, str | None], dict[str, Any]] = {}  # bucket_means' finished columns
        #: host -> its latest load samples (:class:`jdist.protocol.HostMessage`), oldest first
        self._hosts: dict[str, deque[dict[str, Any]]] = {}
        #: the newest pipeline actions (:class:`jdist.protocol.PipelineMessage` rows), oldest first
        self._pipeline: deque[list[Any]] = deque(maxlen=PIPELINE_ROWS)
        self._pipe_steps: dict[Any, list[list[Any]]] = {}  # the last few steps' rows, by step (the panel's)
        self._pipe_ranks: set[int] = set()  # the ranks that sent pipeline actions

    def __repr__(self) -> str:
        return (f"Run({self.run_id!r}, world_size={self.world_size}, status={self.status!r}, records={self._count}"
                f"{', released' if self._released else ''})")

    # -- adding ---------------------------------------------------------------------------------

    def add(self, records: Iterable[Record]) -> list[Record]:
        """Add records, dropping duplicates (same rank, cell and seq); return the new ones."""
        batch = records if isinstance(records, RecordBatch) else RecordBatch.from_records(list(records))
        return self.add_batch(batch).rows()

    def add_batch(self, batch: RecordBatch) -> RecordBatch:
        """Add a batch (:meth:`RecordBatch.from_records`), dropping duplicates; return the new records."""
        store = self._data()
        if not batch.n:
            return batch
        cols = batch.columns
        ranks, seqs = cols["rank"], cols["seq"]
        cells = cols.get("cell")
        new = self._new_mask(ranks, cells, seqs)
        if new is not None:
            batch = batch.take(new)
            if not batch.n:
                return batch
            cols = batch.columns
            ranks, seqs = cols["rank"], cols["seq"]
        store.add(batch)
        self._count += batch.n
        step = cols.get("step")
        rank_list = ranks.tolist()
        last: dict[int, int] = {}
        for i, r in enumerate(rank_list):
            last[r] = i
            self._rank_count[r] += 1
        for r, i in last.items():
            self._latest[r] = batch.row(i)
        if step is not None:
            as_int = "step" in batch.ints
            for i in np.flatnonzero(seqs == 0).tolist():
                s = step[i].item()
                self._first_step[rank_list[i]] = None if s != s else (int(s) if as_int else s)
            when = cols.get("time")
            if when is not None:
                ok = ~(np.isnan(step) | np.isnan(when))
                if ok.any():
                    self._note_times(step[ok], when[ok], as_int)
            if np.isnan(step).any():
                for i in np.flatnonzero(np.isnan(step)).tolist():
                    for name, value in batch.row(i).items():
                        if name not in RECORD_KEYS and type(value) in (int, float):
                            self._unstepped[name][rank_list[i]] = float(value)
        return batch

    def _new_mask(self, ranks: np.ndarray, cells: np.ndarray | None, seqs: np.ndarray) -> np.ndarray | None:
        """Which records were not added before (``None``: all of them), noting them. A (rank, cell)'s
        records that follow on from what was added costs O(1); others one check each."""
        cells = cells if cells is not None else np.zeros(len(seqs), dtype=np.int64)
        if (ranks[0] == ranks).all() and (cells[0] == cells).all():
            groups = [np.arange(len(seqs))]
        else:
            order = np.lexsort((cells, ranks))  # stable: arrival order within a (rank, cell)
            key = ranks[order] * (int(cells.max()) + 1) + cells[order]
            groups = np.split(order, np.flatnonzero(key[1:] != key[:-1]) + 1)
        mask = None
        for idx in groups:
            key = (int(ranks[idx[0]]), int(cells[idx[0]]))
            run = seqs[idx]
            first = int(run[0])
            if first == self._next_seq.get(key, 0) and not self._ahead.get(key) and \
                    (len(run) == 1 or (np.diff(run) == 1).all()):
                self._next_seq[key] = first + len(run)  # records in order, after the others: the usual case
                continue
            if mask is None:
                mask = np.ones(len(seqs), dtype=bool)
            mask[idx] = [self._first_time(key[0], key[1], s) for s in run.tolist()]
        return mask

    def _first_time(self, rank: int, cell: int, seq: int) -> bool:
        """Whether (rank, cell, seq) was not added before (and note it)."""
        key = (rank, cell)
        nxt = self._next_seq.get(key, 0)
        if seq == nxt:
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

    def _note_times(self, step: np.ndarray, when: np.ndarray, as_int: bool) -> None:
        lo = step.min()
        hi = step.max()
        num = int if as_int else float
        low = (num(lo), float(when[step == lo].min()))
        high = (num(hi), float(when[step == hi].max()))
        if not self._timed:
            self._timed = [low, high]
        else:
            self._timed = [min(self._timed[0], low), max(self._timed[1], high)]

    def add_host(self, sample: dict[str, Any]) -> None:
        """A host's load (:class:`jdist.protocol.HostMessage`); the latest :data:`HOST_SAMPLES` per
        host are kept (the run folder's ``hosts.jsonl`` has every one)."""
        self._data()
        kept = self._hosts.get(sample["host"])
        if kept is None:
            kept = self._hosts[sample["host"]] = deque(maxlen=HOST_SAMPLES)
        kept.append(sample)

    def add_pipeline(self, message: dict[str, Any]) -> None:
        """A rank's pipeline actions (:class:`jdist.protocol.PipelineMessage`); the newest
        :data:`PIPELINE_ROWS` are kept."""
        self._data()
        rows = message["rows"]
        self._pipeline.extend(rows)
        steps = self._pipe_steps
        for row in rows:
            bucket = steps.get(row[0])
            if bucket is None:
                bucket = steps[row[0]] = []
                if len(steps) > 4:  # (a dict keeps its order: the oldest step first)
                    del steps[next(iter(steps))]
            bucket.append(row)
            self._pipe_ranks.add(row[1])

    def pipeline_step(self) -> tuple[Any, list[list[Any]]] | None:
        """The newest step of the timeline that every pipeline rank sent (else the newest), and its rows
        (unix times), for the pipeline panel; None: no pipeline."""
        self._data()
        steps = self._pipe_steps
        for step in reversed(list(steps)):
            if {row[1] for row in steps[step]} >= self._pipe_ranks:
                return step, steps[step]
        return next(((step, steps[step]) for step in reversed(list(steps))), None)

    @property
    def pipeline(self):
        """The pipeline schedules' actions (``torch.distributed.pipelining``, docs/model-parallel.md), one row
        per forward ("F"), backward ("B") or weight-gradient ("W") of a micro-batch on a stage: a DataFrame
        with ``step, rank, stage, microbatch, action, start_s, end_s`` (seconds since the run started), the
        newest :data:`PIPELINE_ROWS`, in the order the ranks sent them.

        >>> run = Run("x", 2, started=100.0)
        >>> run.add_pipeline({"rows": [[0, 1, 1, 0, "F", 100.5, 100.75]]})
        >>> run.pipeline.to_dict("records")
        [{'step': 0, 'rank': 1, 'stage': 1, 'microbatch': 0, 'action': 'F', 'start_s': 0.5, 'end_s': 0.75}]
        """
        import pandas as pd

        self._data()
        cols = ["step", "rank", "stage", "microbatch", "action", "start_s", "end_s"]
        df = pd.DataFrame(list(self._pipeline), columns=cols)
        if len(df):
            df["start_s"] -= self.started
            df["end_s"] -= self.started
        return df

    def host_load(self) -> dict[str, list[dict[str, Any]]]:
        """host -> its load samples, oldest first (the latest :data:`HOST_SAMPLES`)."""
        self._data()
        return {host: list(samples) for host, samples in self._hosts.items()}

    def host_latest(self) -> dict[str, dict[str, Any]]:
        """host -> its latest load sample."""
        self._data()
        return {host: samples[-1] for host, samples in self._hosts.items()}

    def missing_seqs(self, rank: int, cell: int, count: int) -> list[int]:
        """The seqs below ``count`` of (rank, cell) that were not added (a rank's records lost in transport).

        >>> run = Run("x", 1)
        >>> _ = run.add([{"rank": 0, "cell": 1, "seq": s, "step": s} for s in (0, 1, 3)])
        >>> run.missing_seqs(0, 1, 5)
        [2, 4]
        """
        self._data()
        nxt = self._next_seq.get((rank, cell), 0)
        ahead = self._ahead.get((rank, cell), set())
        return [s for s in range(nxt, count) if s not in ahead]

    # -- memory ---------------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes the run's values take in memory (0 once released)."""
        return 0 if self._released else self._store.nbytes

    @property
    def released(self) -> bool:
        """Whether the values left memory (:meth:`release`); the next read loads them from the run folder."""
        return self._released

    def release(self) -> bool:
        """Let the values go from memory: they come back from the run folder when next asked for.
        Only a run that has ended and has a folder is released; returns whether it was."""
        if self._released or self.status == "running" or self.path is None or not Path(self.path).is_dir():
            return False
        self._reset()
        self._store = None  # type: ignore[assignment]
        self._released = True
        return True

    def finished_adding(self) -> None:
        """The run ended: give back the rows allocated ahead."""
        if not self._released:
            self._store.trim()

    def _data(self) -> RecordStore:
        """The store, loaded again from the run folder if the run was released."""
        if self._released:
            from .store import load_batches, load_hosts, load_pipeline

            assert self.path is not None
            self._released = False
            self._reset()
            count = self._count
            self._count = 0
            for batch in load_batches(self.path):
                self.add_batch(batch)
            for sample in load_hosts(self.path):
                self.add_host(sample)
            for message in load_pipeline(self.path):
                self.add_pipeline(message)
            self._store.trim()
            if self._count != count:
                import warnings

                warnings.warn(f"jdist: run {self.run_id} had {count} records; its run folder {self.path} has "
                              f"{self._count}", stacklevel=3)
            from .budget import loaded

            loaded(self)
        return self._store

    # -- reading --------------------------------------------------------------------------------

    def _steps_out(self, steps: np.ndarray) -> list[Any]:
        """Steps as Python numbers: ints when every step logged was one."""
        return steps.astype(np.int64).tolist() if self._store.step_ints else steps.tolist()

    def steps(self, metric: str) -> list[Any]:
        """The steps at which some rank logged ``metric``, sorted (``None`` steps left out)."""
        return self._steps_out(self._data().steps(metric))

    def matrix(self, metric: str, steps: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """``(steps, values[step, column], ranks of the columns)`` of ``metric`` at ``steps`` (sorted
        steps of the run; NaN: no value). The dashboard's panels compute their points from it."""
        store = self._data()
        at = np.asarray(steps, dtype=np.float64)
        values = store.field(metric)
        if values is None or not len(at):
            return at, np.full((len(at), 0), np.nan), []
        rows = np.minimum(np.searchsorted(store.keys, at), store.n - 1)
        return at, values[rows], store.ranks

    def step_range(self, metric: str, low: Any, high: Any, inclusive: bool = False) -> tuple[list[Any], Any]:
        """The steps of ``metric`` from ``low`` (``None``: the first; excluded unless ``inclusive``) to
        ``high`` (included), sorted, and the step of it before them (``None``: none)."""
        store = self._data()
        keys = store.keys
        if high is None:
            return [], None
        lo = 0 if low is None else int(np.searchsorted(keys, low, side="left" if inclusive else "right"))
        hi = int(np.searchsorted(keys, high, side="right"))
        values = store.field(metric)
        if values is None or hi <= lo:
            return [], None
        has = ~np.isnan(values[lo:hi]).all(axis=1)
        steps = self._steps_out(keys[lo:hi][has])
        prev = None
        back = lo
        while back > 0 and prev is None:  # the step before: usually the row just before
            start = max(back - 64, 0)
            earlier = np.flatnonzero(~np.isnan(values[start:back]).all(axis=1))
            if earlier.size:
                prev = self._steps_out(keys[start + earlier[-1:]])[0]
            back = start
        return steps, prev

    def has(self, metric: str) -> bool:
        """Whether some rank logged ``metric`` at a step."""
        store = self._data()
        f = store.fields.get(metric)
        return f is not None and bool(store.count[:, f].any())

    def bucket_means(self, metric: str, over: str | None = None, columns: int = 60
                     ) -> tuple[list[int], list[Any], np.ndarray]:
        """``metric`` (divided by ``over`` where given) averaged per rank over consecutive steps:
        at most ``columns`` buckets of a power of two steps each. Returns the ranks (one per
        column of the result), each bucket's last step, and the means ``[bucket, rank]`` (NaN:
        none). Each rank's first step is left out (it covers the cell's set-up). Finished buckets
        are kept: a call costs O(steps since the last call × ranks), and O(steps × ranks) when the
        bucket width doubles.

        >>> run = Run("x", 2)
        >>> _ = run.add([{"rank": r, "seq": s, "step": s, "t": float(s + r)} for s in range(5) for r in (0, 1)])
        >>> ranks, last, means = run.bucket_means("t", columns=2)
        >>> ranks, last, means.tolist()
        ([0, 1], [3, 4], [[2.0, 3.0], [4.0, 5.0]])
        """
        store = self._data()
        n, ranks = store.n, list(store.ranks)
        f = store.fields.get(metric)
        g = store.fields.get(over) if over is not None else None
        if f is None or not n or (over is not None and g is None):
            return ranks, [], np.full((0, len(ranks)), np.nan)
        width = 1 << max(0, math.ceil(math.log2(n / columns))) if n > columns else 1
        state = self._buckets.get((metric, over))
        if state is None or (state["width"], state["version"], state["ranks"]) != (width, store.version, len(ranks)):
            state = self._buckets[metric, over] = {"width": width, "version": store.version, "ranks": len(ranks),
                                                   "done": 0, "sums": [], "counts": []}
        first = np.array([self._first_step.get(r, np.nan) for r in ranks], dtype=np.float64)
        keys = store.keys

        def sums(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
            values = store.data[lo:hi, :, f].copy()
            if g is not None:
                with np.errstate(invalid="ignore", divide="ignore"):
                    below = store.data[lo:hi, :, g]
                    values = np.where(below > 0, values / below, np.nan)
            values[keys[lo:hi, None] == first[None, :]] = np.nan
            have = ~np.isnan(values)
            starts = np.arange(0, hi - lo, width)
            return (np.add.reduceat(np.where(have, values, 0.0), starts, axis=0),
                    np.add.reduceat(have.astype(np.int64), starts, axis=0))

        whole = n // width * width
        if state["done"] < whole:
            s_, c_ = sums(state["done"], whole)
            state["sums"].append(s_)
            state["counts"].append(c_)
            state["done"] = whole
        parts_s, parts_c = list(state["sums"]), list(state["counts"])
        if whole < n:
            s_, c_ = sums(whole, n)
            parts_s.append(s_)
            parts_c.append(c_)
        total, count = np.concatenate(parts_s), np.concatenate(parts_c)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        last = self._steps_out(keys[np.minimum(np.arange(width, n + width, width), n) - 1])
        return ranks, last, means

    def first_steps(self) -> dict[int, Any]:
        """``{rank: step}`` of each rank's first record of the cell (``seq`` 0)."""
        self._data()
        return self._first_step

    def metric_ranks(self, metric: str, skip_first: bool = False) -> list[int]:
        """The ranks that logged ``metric`` at a step (other than at their first record's step, if ``skip_first``).

        >>> run = Run("x", 2)
        >>> _ = run.add([{"rank": 0, "seq": 0, "step": 0, "v": 1.0}, {"rank": 0, "seq": 1, "step": 1, "v": 1.0},
        ...              {"rank": 1, "seq": 0, "step": 0, "v": 1.0}])
        >>> run.metric_ranks("v"), run.metric_ranks("v", skip_first=True)
        ([0, 1], [0])
        """
        store = self._data()
        f = store.fields.get(metric)
        if f is None:
            return []
        out = []
        for rank, count, top in zip(store.ranks, store.count[:, f].tolist(), store.top[:, f].tolist()):
            only_first = skip_first and count == 1 and self._first_step.get(rank) == top
            if count and not only_first:
                out.append(rank)
        return sorted(out)

    def frontier(self, metric: str) -> Any:
        """The highest step every rank that logs ``metric`` has reached (``None`` before any): the
        slowest rank's latest step of it."""
        store = self._data()
        f = store.fields.get(metric)
        if f is None or not (store.count[:, f] > 0).any():
            return None
        low = store.top[:, f][store.count[:, f] > 0].min()
        return int(low) if self._store.step_ints else float(low)

    def time_span(self) -> tuple[tuple[Any, float], tuple[Any, float]] | None:
        """The lowest and highest ``(step, time)`` of the records that have both, or ``None``."""
        self._data()
        return (self._timed[0], self._timed[1]) if self._timed else None

    @property
    def metric_names(self) -> list[str]:
        """User-logged scalar names, in first-seen order (automatic metrics excluded)."""
        auto = _auto_metrics()
        store = self._data()
        names = [m for m in list(store.fields)[2:] if m not in auto and not is_mesh_metric(m)]
        return names + [m for m in self._unstepped if m not in auto and m not in names and not is_mesh_metric(m)]

    @property
    def comm_dims(self) -> list[str]:
        """The mesh dimensions whose communication the records time (``comm_time_<dim>_s``), first seen first."""
        return [m[len("comm_time_"):-2] for m in list(self._data().fields) if is_dim_comm(m)]

    @property
    def ranks(self) -> list[int]:
        self._data()
        return sorted(self._latest)

    def latest(self, rank: int) -> dict[str, Any] | None:
        """The most recent record of ``rank``."""
        self._data()
        return self._latest.get(rank)

    def count(self, rank: int | None = None) -> int:
        """Number of records (of one rank, or all)."""
        if rank is None:
            return self._count
        self._data()
        return self._rank_count.get(rank, 0)

    def aggregate(self, metric: str) -> tuple[list[Any], list[float], list[float], list[float]]:
        """Per step: (steps, mean, min, max) of ``metric`` across the ranks that logged it.

        Steps are sorted; ``None`` steps (``jdist.log`` without ``step=``) are left out.
        """
        store = self._data()
        steps = store.steps(metric)
        _, values, _ = self.matrix(metric, steps)
        mean, low, high = row_stats(values)
        return self._steps_out(steps), mean.tolist(), low.tolist(), high.tolist()

    def comm_share(self, last: int | None = None, skip_first: bool = False) -> dict[int, float]:
        """Per rank, the share of its step time spent communicating, over the steps whose communication was
        timed: ``comm_time_s`` and ``compute_time_s`` come together, and a DDP timed on a sample of short steps
        leaves both out of the others (:mod:`jdist.rank.auto_metrics`), so ``comm / step`` would mix two sets.

        >>> run = Run("x", 1)
        >>> timed = {"comm_time_s": 0.5, "compute_time_s": 1.5}
        >>> _ = run.add([{"rank": 0, "seq": s, "step": s, "step_time_s": 1.0, **(timed if s % 2 else {})}
        ...              for s in range(4)])
        >>> run.comm_share()
        {0: 0.25}
        """
        comm = self.per_rank_mean("comm_time_s", last, skip_first)
        compute = self.per_rank_mean("compute_time_s", last, skip_first)
        step = self.per_rank_mean("step_time_s", last, skip_first) if set(comm) - set(compute) else {}
        share = {}
        for r, c in comm.items():
            whole = c + compute[r] if r in compute else step.get(r)  # (records with comm but no compute: the step)
            if whole:
                share[r] = c / whole
        return share

    def per_rank_mean(self, metric: str, last: int | None = None, skip_first: bool = False) -> dict[int, float]:
        """Mean of ``metric`` per rank, over all steps or the ``last`` N steps of each rank.

        ``skip_first``: leave out each rank's first step when it has others (the first
        ``step_time_s`` counts from the start of the cell, set-up code included). Values
        logged without a step count as the latest. Costs O(``last``) rows for all ranks at
        once, not O(steps).

        >>> run = Run("x", 1)
        >>> _ = run.add([{"rank": 0, "seq": s, "step": s, "t": float(s)} for s in range(5)])
        >>> run.per_rank_mean("t", last=2, skip_first=True)
        {0: 3.5}
        """
        store = self._data()
        f = store.fields.get(metric)
        unstepped = self._unstepped.get(metric, {})
        out: dict[int, float] = {}
        if f is not None:
            count = store.count[:, f]
            extra = np.array([r in unstepped for r in store.ranks], dtype=np.int64)
            total = count + extra
            start = np.where(skip_first & (total > 1), 1, 0)
            if last:
                start = np.maximum(start, total - last)
            take = np.maximum(count - start, 0)  # each column's values to average, from its end
            sums, got = tail_sums(store.data[: store.n, :, f], take)
            for j, rank in enumerate(store.ranks):
                s, k = sums[j], int(got[j])
                if extra[j] and total[j] > start[j] and not math.isnan(unstepped[rank]):
                    s, k = s + unstepped[rank], k + 1
                if k:
                    out[rank] = float(s / k)
        for rank, value in unstepped.items():
            if (f is None or not store.count[store.ranks.index(rank), f]) and not math.isnan(value):
                out[rank] = value
        return dict(sorted(out.items()))

    def max_step(self) -> Any:
        """The highest step any rank has logged, or ``None``."""
        self._data()
        steps = [r.get("step") for r in self._latest.values() if isinstance(r.get("step"), (int, float))]
        return max(steps) if steps else None

    @property
    def history(self):
        """One row per (rank, step), sorted so: ``rank``, ``step``, ``time``, every logged scalar and
        the automatic metrics (NaN where a value is missing). Where a rank logged a step twice, the
        row has the latest value of each metric. Built on demand.

        >>> Run("x", 1, records=[]).history.empty
        True
        """
        import pandas as pd

        store = self._data()
        auto = list(AUTO_METRICS)
        names = self.metric_names
        dims = [f"comm_time_{d}_s" for d in self.comm_dims]
        dims += [m for m in ("pp_stage", "bubble_frac") if m in store.fields]
        cols = ["rank", "step", "time", *names, *[m for m in auto if m not in names], *dims]
        if not self._count:
            return pd.DataFrame(columns=cols)
        order = sorted(range(len(store.ranks)), key=store.ranks.__getitem__)
        present = ~np.isnan(store.field("seq")[:, order])
        col_idx, rows = np.nonzero(present.T)  # rank-major, steps ascending within a rank
        where = np.array(order, dtype=np.int64)[col_idx]
        ranks = np.array(store.ranks, dtype=np.int64)[where]
        steps = store.keys[rows]
        data: dict[str, Any] = {"rank": ranks, "step": steps.astype(np.int64) if store.step_ints else steps}
        for name in cols[2:]:
            values = store.field(name)
            if values is None:
                data[name] = np.full(len(rows), np.nan)
                continue
            data[name] = values[rows, where]
            if store.ints.get(name) and not np.isnan(data[name]).any():
                data[name] = data[name].astype(np.int64)
        df = pd.DataFrame(data)
        if store.extras:
            at = {(float(s), int(r)): i for i, (s, r) in enumerate(zip(steps.tolist(), ranks.tolist()))}
            for (s, r), extra in store.extras.items():
                for name, value in extra.items():
                    if name not in df.columns:
                        df[name] = None
                    df.at[at[s, r], name] = value
        if store.unstepped:
            batch = RecordBatch.from_records(store.unstepped)
            rest = pd.DataFrame({c: batch.columns[c] if c in batch.columns else np.nan for c in df.columns})
            rest["rank"] = batch.columns["rank"]
            for i, extra in batch.extras.items():
                for name, value in extra.items():
                    if name not in rest.columns:
                        rest[name] = None
                    rest.at[i, name] = value
            df = pd.concat([df, rest], ignore_index=True)
            df = df.sort_values(["rank", "step"], kind="stable", na_position="last").reset_index(drop=True)
        return df

    @property
    def records(self) -> list[Record]:
        """The records as dicts, one per (rank, step) as in :attr:`history` (built on demand: for a
        long run, read :attr:`history`)."""
        out = []
        for row in self.history.to_dict("records"):
            out.append({k: v for k, v in row.items() if v is not None and v == v})
        return out

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
            records=self._count,
            cluster_id=self.cluster_id,
            hosts={str(r): h for r, h in sorted(self.hosts.items())},
            stragglers=[dataclasses.asdict(s) for s in self.stragglers],
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
