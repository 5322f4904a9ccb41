"""A cell's data messages: records into its :class:`~jdist.metrics.Run` and the run's sinks,
checkpoint messages to a callback (the cluster's recovery log), and at the end a check that no
record was lost (the missing ones are fetched again from the ranks).

The run is created with the first record or progress message (a cell that logs nothing has no
run), started when the cell started (a short cell's records all come at its end); each record sink
(:mod:`jdist.kernel.sinks`) then gets the new records as they arrive.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Callable, Sequence

from jdist.metrics import Run, new_run_id
from jdist.metrics.store import RecordBatch
from jdist.protocol import DataMessage, HostMessage, Record

if TYPE_CHECKING:
    from ..cluster import ClusterSession
    from ..sinks import RecordSink


class RecordCollector:
    """Main thread only (sinks may be widgets)."""

    def __init__(self, cluster: ClusterSession | None, code: str, sinks: Callable[[Run], list[RecordSink]],
                 on_checkpoint: Callable[[DataMessage], None] | None = None, ranks: Sequence[int] | None = None,
                 make_run: Callable[[], Run] | None = None):
        """``ranks``: the ranks the run has (default the cluster's; a sweep's trial: its slot's ranks,
        numbered from 0 in its records). ``make_run``: how the run is made, for ranks that are no
        cluster's (``jdist.ray``: then ``cluster`` is None and nothing is fetched again)."""
        self.cluster = cluster
        self.make_run = make_run
        self.world_ranks = list(ranks) if ranks is not None else None
        self.code = code
        self.make_sinks = sinks
        self.on_checkpoint = on_checkpoint  # rank 0's checkpoint_every / checkpoint_saved messages
        self.run: Run | None = None
        self.started = time.time()  # the cell's (or trial's) start: the run's, whenever its first record comes
        self.sinks: list[RecordSink] = []
        self.cells: dict[int, int] = {}  # rank -> cell id on the rank
        self.done: dict[int, int] = {}  # rank -> record count reported at cell end
        self.paused_ranks: list[int] = []
        self._pending: list[RecordBatch] = []  # records received since the last flush, as they came
        self._hosts_before: dict[str, HostMessage] = {}  # each host's latest load before the run began

    def ensure_run(self) -> Run:
        """The cell's run, created (and its sinks started, with what came before it) on first use."""
        if self.run is None:
            self.run = self.make_run() if self.make_run is not None else self._cluster_run()
            self.sinks = self.make_sinks(self.run)
            for sink in self.sinks:
                sink.start(self.run)
            if self.paused_ranks:
                self.paused(self.paused_ranks)
            for msg in self._hosts_before.values():
                self._host(msg)
            self._hosts_before.clear()
        return self.run

    def _cluster_run(self) -> Run:
        """A new run of the cluster's ranks (or of the sweep slot's)."""
        assert self.cluster is not None
        cfg = self.cluster.config
        hosts = {info["rank"]: info["host"] for info in self.cluster.ranks}
        if self.world_ranks is not None:
            hosts = {i: hosts[r] for i, r in enumerate(self.world_ranks) if r in hosts}
        world_size = cfg.n if self.world_ranks is None else len(self.world_ranks)
        return Run(run_id=new_run_id(), world_size=world_size, backend=cfg.backend,
                   device_kind="cuda" if cfg.gpus else "cpu", code=self.code, cluster_id=self.cluster.cluster_id,
                   hosts=hosts if len(set(hosts.values())) > 1 else {}, started=self.started)

    def handle(self, rank: int, msg: DataMessage) -> None:
        self.cells[rank] = msg["cell"]
        kind = msg["kind"]
        if kind == "records":
            self.add(msg["records"])
        elif kind == "progress" and msg["total_steps"] is not None:
            self.ensure_run().total_steps = msg["total_steps"]
        elif kind == "cell_end":
            if msg["total_steps"] is not None:
                self.ensure_run().total_steps = msg["total_steps"]
            self.add(msg["records"])
            self.done[rank] = msg["count"]
            if rank == 0 and self.on_checkpoint is not None:  # again: the stream's may have been missed
                for checkpoint in msg.get("checkpoints", ()):
                    self.on_checkpoint(checkpoint)
        elif kind in ("checkpoint_every", "checkpoint_saved") and rank == 0 and self.on_checkpoint is not None:
            self.on_checkpoint(msg)
        elif kind == "pipeline":
            self.ensure_run().add_pipeline(msg)
            for sink in self.sinks:
                keep = getattr(sink, "pipeline", None)
                if keep is not None:
                    keep(msg)
        elif kind == "host":
            if self.run is None:  # a cell that logs nothing has no run: keep the latest until one has
                self._hosts_before[msg["host"]] = msg
            else:
                self._host(msg)

    def _host(self, msg: HostMessage) -> None:
        assert self.run is not None
        self.run.add_host(msg)
        for sink in self.sinks:
            keep = getattr(sink, "host", None)
            if keep is not None:
                keep(msg)

    def add(self, records: RecordBatch | list[Record]) -> None:
        """Keep records for the next :meth:`flush` (one batch per poll, whatever the ranks sent)."""
        if len(records):
            self.ensure_run()
            self._pending.append(records if isinstance(records, RecordBatch) else RecordBatch.from_records(records))

    def flush(self) -> None:
        """Add the records received since the last flush to the run, and give the new ones to the sinks."""
        if not self._pending:
            return
        batches, self._pending = self._pending, []
        assert self.run is not None
        new = self.run.add_batch(RecordBatch.concat(batches))
        if new.n:
            for sink in self.sinks:
                sink.add(new)

    def paused(self, ranks: list[int]) -> None:
        """The ranks stopped in a debugger now (pdb or the Debugger panel): to the sinks that show it (the
        dashboard's header; sinks started later get them too)."""
        self.paused_ranks = list(ranks)
        for sink in self.sinks:
            show = getattr(sink, "paused", None)
            if show is not None:
                show(ranks)

    def tick(self) -> None:
        self.flush()
        for sink in self.sinks:
            sink.tick()

    def refetch(self, ranks: Sequence[int]) -> int:
        """Fetch again the records the stream missed, using each rank's final count. Returns how many.

        A rank whose end-of-cell message was not seen (it can come before the IOPub
        callbacks are attached, for a very short cell) is asked for its count directly.
        """
        self.flush()
        assert self.cluster is not None
        unknown = [r for r in ranks if r not in self.done]
        if unknown:
            for rank, (cell, count) in zip(unknown, self.cluster.call("cell_count", ranks=unknown, timeout=10)):
                self.cells[rank], self.done[rank] = cell, count
        fetched = 0
        for rank, count in self.done.items():
            missing = (self.run.missing_seqs(rank, self.cells[rank], count) if self.run is not None
                       else list(range(count)))
            if missing:
                recs = self.cluster.call("records", self.cells[rank], missing, ranks=[rank])[0]
                self.add(recs)
                self.flush()
                fetched += len(recs)
                if len(recs) < len(missing):
                    print(
                        f"jdist: {len(missing) - len(recs)} of {count} records of rank {rank} were lost in transport "
                        "and are no longer kept on the rank (it keeps the first and the latest records of a cell: "
                        "jdist.rank.stream.RecordStream.keep_first / keep_last).",
                        file=sys.stderr,
                    )
        return fetched

    def finish(self, status: str, error: str | None) -> None:
        self.flush()
        if self.run is None:
            return
        self.run.ended = time.time()
        self.run.status = status
        self.run.error = error
        for sink in self.sinks:
            sink.finish(self.run)
