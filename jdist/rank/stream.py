"""A cell's records on one rank: numbered, batched to the kernel, kept for repair.

Every record gets the next sequence number of the cell (``seq``). Records are published in
batches at most every :attr:`RecordStream.flush_interval` seconds; the rest go out with the
cell's end, together with the cell's record count, so the kernel can check that none was lost
and fetch any that were (:meth:`RecordStream.records`). To bound a rank's memory in long cells
it keeps the first :attr:`keep_first` and the latest :attr:`keep_last` records of a cell.

Adding a record is all a step pays for (an append and a clock comparison); the session
publishes a batch when :meth:`RecordStream.add` says one is due, after the metric sources
filled in what is read once per batch (:mod:`jdist.rank.sources`).

Example:
    >>> from jdist.rank.channel import ListChannel
    >>> stream, ch = RecordStream(), ListChannel()
    >>> stream.begin_cell(now=0.0)
    >>> for seq in range(3):
    ...     if stream.add({"rank": 0, "cell": stream.cell, "seq": stream.seq, "step": seq}, now=0.05 * seq):
    ...         stream.flush(0.05 * seq, ch)
    >>> [len(m["records"]) for m in ch.messages], stream.end_cell()["count"]   # one batch when 0.1 s passed
    ([3], 3)
"""

from __future__ import annotations

from collections import deque
from typing import Any

from jdist.protocol import PROTOCOL_VERSION, CellEndMessage, ProgressMessage, Record, RecordsMessage


class RecordStream:
    #: Seconds between two publishes of pending records.
    flush_interval = 0.1
    #: Records of a cell kept to re-send any the stream lost: the first ``keep_first`` (the
    #: stream can miss the start of a cell) and the latest ``keep_last``.
    keep_first = 10_000
    keep_last = 100_000

    def __init__(self) -> None:
        self.cell = 0
        self.seq = 0
        self.total_steps: int | None = None
        self.first: list[Record] = []
        self.latest: deque[Record] = deque(maxlen=self.keep_last)
        self.pending: list[Record] = []
        self.last_flush = 0.0

    def begin_cell(self, now: float) -> None:
        self.cell += 1
        self.seq = 0
        self.total_steps = None
        self.first, self.latest, self.pending = [], deque(maxlen=self.keep_last), []
        self.last_flush = now

    def add(self, rec: Record, now: float) -> bool:
        """Queue ``rec`` (it already has this cell's next ``seq``); True when a batch is due."""
        self.seq += 1
        (self.first if len(self.first) < self.keep_first else self.latest).append(rec)
        self.pending.append(rec)
        return now - self.last_flush >= self.flush_interval

    def flush(self, now: float, channel: Any, ready: int | None = None) -> None:
        """Publish the first ``ready`` pending records (default: all); the rest wait for the next batch."""
        self.last_flush = now
        count = len(self.pending) if ready is None else ready
        if count:
            batch, self.pending = self.pending[:count], self.pending[count:]
            channel.publish(RecordsMessage(v=PROTOCOL_VERSION, kind="records", cell=self.cell, records=batch))

    def progress(self, total_steps: int | None) -> ProgressMessage:
        self.total_steps = total_steps
        return ProgressMessage(v=PROTOCOL_VERSION, kind="progress", cell=self.cell, total_steps=total_steps)

    def end_cell(self) -> CellEndMessage:
        batch, self.pending = self.pending, []
        return CellEndMessage(v=PROTOCOL_VERSION, kind="cell_end", cell=self.cell, records=batch, count=self.seq,
                              total_steps=self.total_steps)

    def records(self, cell: int, seqs: list[int]) -> list[Record]:
        """Records of the current cell with the given sequence numbers, as far as still kept."""
        if cell != self.cell:
            return []
        wanted = set(seqs)
        return [r for part in (self.first, self.latest) for r in part if r["seq"] in wanted]
