"""A cell's records on one rank: numbered, batched to the kernel, kept for repair.

Every record gets the next sequence number of the cell (``seq``). ``jdist.log`` only appends an
:data:`Entry` (the record plus what was known at that moment: the clock, the communication
intervals and CUDA events since the previous log, the training-forward count, values still on
the GPU) to :attr:`RecordStream.pending`; nothing is computed, sent or locked there. The
session's :class:`Publisher` thread completes the pending records (:mod:`jdist.rank.sources`)
and publishes them in batches every :attr:`RecordStream.flush_interval` seconds; the rest go out
with the cell's end, together with the cell's record count, so the kernel can check that none
was lost and fetch any that were (:meth:`RecordStream.records`). To bound a rank's memory in
long cells it keeps the first :attr:`keep_first` and the latest :attr:`keep_last` records.

Example:
    >>> from jdist.rank.channel import ListChannel
    >>> stream, ch = RecordStream(), ListChannel()
    >>> stream.begin_cell()
    >>> for step in range(3):
    ...     stream.add(({"rank": 0, "cell": stream.cell, "seq": stream.seq, "step": step}, 0.0, None, None, 0, None))
    >>> stream.flush(ch, 2)                      # the first two, complete, go out as one batch
    >>> [len(m["records"]) for m in ch.messages], stream.end_cell()["count"]
    ([2], 3)
"""

from __future__ import annotations

from collections import deque
from typing import Any

from jdist.protocol import PROTOCOL_VERSION, CellEndMessage, ProgressMessage, Record, RecordsMessage

#: What ``jdist.log`` queues: ``(record, perf_counter at the log, comm intervals since the previous
#: log or None, CUDA event pairs or None, training forwards so far, deferred values or None)``.
#: A plain tuple: building it is the cheapest thing the hot path can do.
Entry = tuple[Record, float, Any, Any, int, Any]
#: An entry's ``comm_time_s`` when its communication was not timed (automatic metrics time a DDP built by the
#: code on a sample of its steps: :class:`jdist.rank.auto_metrics.AutoSteps`): the record has no comm and compute
#: time, rather than a partial one.
UNSAMPLED = object()
REC, T, COMM, EVENTS, FORWARDS, DEFERRED = range(6)


class RecordStream:
    #: Seconds between two publishes of pending records (by the session's publisher thread).
    flush_interval = 0.25
    #: Records of a cell kept to re-send any the stream lost: the first ``keep_first`` (the
    #: stream can miss the start of a cell) and the latest ``keep_last``.
    keep_first = 10_000
    keep_last = 100_000

    def __init__(self) -> None:
        self.cell = 0
        self.seq = 0
        self.open = False
        self.total_steps: int | None = None
        self.first: list[Record] = []
        self.latest: deque[Record] = deque(maxlen=self.keep_last)
        self.pending: deque[Entry] = deque()
        self.checkpoints: dict[str, Any] = {}  # this cell's latest checkpoint message of each kind, in order

    def begin_cell(self) -> None:
        self.cell += 1
        self.seq = 0
        self.total_steps = None
        self.checkpoints = {}
        self.first, self.latest, self.pending = [], deque(maxlen=self.keep_last), deque()
        self.open = True

    def add(self, entry: Entry) -> None:
        """Queue ``entry`` (its record has this cell's next ``seq``). The hot path: appends only."""
        self.seq += 1
        self.pending.append(entry)

    def _keep(self, batch: list[Record]) -> None:
        room = self.keep_first - len(self.first)
        if room > 0:
            self.first.extend(batch[:room])
            batch = batch[room:]
        self.latest.extend(batch)

    def flush(self, channel: Any, count: int) -> None:
        """Publish the records of the first ``count`` pending entries (completed by the sources)."""
        if count:
            pending = self.pending
            batch = [pending.popleft()[0] for _ in range(count)]
            self._keep(batch)
            channel.publish(RecordsMessage(v=PROTOCOL_VERSION, kind="records", cell=self.cell, records=batch))

    def last_step(self) -> Any:
        """The step of this cell's newest record (None: none yet). Safe beside the publisher thread."""
        for part in (self.pending, self.latest, self.first):
            try:
                newest = part[-1]
            except IndexError:  # empty, or emptied by the publisher meanwhile: the record moved on
                continue
            return (newest[0] if part is self.pending else newest)["step"]
        return None

    def progress(self, total_steps: int | None) -> ProgressMessage:
        self.total_steps = total_steps
        return ProgressMessage(v=PROTOCOL_VERSION, kind="progress", cell=self.cell, total_steps=total_steps)

    def note_checkpoint(self, message: Any) -> None:
        """A checkpoint message was sent: the cell's end message repeats it (the latest of its kind)."""
        self.checkpoints.pop(message["kind"], None)
        self.checkpoints[message["kind"]] = message

    def end_cell(self) -> CellEndMessage:
        """The cell's end message with every record still pending (completed by the sources)."""
        self.open = False
        batch = [entry[0] for entry in self.pending]
        self.pending = deque()
        self._keep(batch)
        return CellEndMessage(v=PROTOCOL_VERSION, kind="cell_end", cell=self.cell, records=batch, count=self.seq,
                              total_steps=self.total_steps, checkpoints=list(self.checkpoints.values()))

    def records(self, cell: int, seqs: list[int]) -> list[Record]:
        """Records of the current cell with the given sequence numbers, as far as still kept
        (the records are kept once sent)."""
        if cell != self.cell:
            return []
        wanted = set(seqs)
        return [r for part in (self.first, self.latest) for r in part if r["seq"] in wanted]
