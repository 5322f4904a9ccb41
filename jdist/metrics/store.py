"""Columnar record storage: what a :class:`~jdist.metrics.Run` keeps in memory and writes to disk.

Records travel as dicts (:data:`jdist.protocol.Record`); the kernel turns each batch into a
:class:`RecordBatch` (one numpy array per field) once, and keeps a run's values in a
:class:`RecordStore`: one float64 array with a row per step, a column per rank and a field per
metric (NaN where none). A record costs the kernel 8 bytes per value instead of a dict per record,
aggregation across ranks is a numpy reduction over a row, and a rank's recent steps a column slice.

What the store keeps is the latest value of each (step, rank, metric): a rank that logs the same
step twice (``jdist.log(step=e, val_loss=...)`` after ``jdist.log(step=e, loss=...)``) has one
row there with both. Records without a step (other producers than ``jdist.log``, which numbers
them) are kept as they came, beside the grids.

A batch also travels to the run log as one binary frame (:meth:`RecordBatch.encode`,
:func:`decode_frames`): a JSON header naming the columns, then their bytes.

Example:
    >>> batch = RecordBatch.from_records([{"rank": 0, "seq": 0, "step": 0, "loss": 1.5},
    ...                                   {"rank": 1, "seq": 0, "step": 0, "loss": 2.5}])
    >>> store = RecordStore(2)
    >>> store.add(batch)
    >>> store.steps("loss").tolist(), store.field("loss").tolist()
    ([0.0], [[1.5, 2.5]])
    >>> frames, used = decode_frames(batch.encode())
    >>> [r["loss"] for r in frames[0]]
    [1.5, 2.5]
"""

from __future__ import annotations

import json
import os
import struct
from operator import itemgetter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from jdist.protocol import RECORD_KEYS, Record

#: Fields kept as integers in a batch (every record has them; see :data:`jdist.protocol.RECORD_KEYS`).
INT_KEYS = ("rank", "cell", "seq")
_NUMERIC = frozenset((float, int, type(None)))
_INTS = frozenset((int, type(None)))
#: The kernel's records file in a run folder (:mod:`jdist.metrics.runlog`).
RECORDS_FILE = "metrics.jdc"
#: The hosts' load in a run folder, a JSON line per sample (``hosts.r<rank>.jsonl`` from other launchers' ranks).
HOSTS_FILE = "hosts.jsonl"
#: The pipeline actions in a run folder, a JSON line per message (``pipeline.r<rank>.jsonl`` from other launchers' ranks).
PIPELINE_FILE = "pipeline.jsonl"
#: A frame of the binary run log starts with this, then the header's length (4 bytes, little endian).
FRAME_MAGIC = b"JDC1"
_HEAD = struct.Struct("<4sI")


class RecordBatch(Sequence[Record]):
    """Records as columns: ``columns[name]`` is an int64 array for :data:`INT_KEYS`, else float64
    with NaN for a value that is missing or ``None``. ``ints``: the float columns whose values
    were all Python ints (given back as ints). ``extras``: row -> the fields that were not
    numbers (strings, bools), rare. As a sequence it gives the records as dicts: the ones it was
    made from, else rebuilt (a value that was ``None`` or missing is left out).

    >>> b = RecordBatch.from_records([{"rank": 0, "seq": 0, "step": 3, "mem_bytes": 7, "note": "x"}])
    >>> b.columns["step"].dtype, sorted(b.ints), b.extras
    (dtype('float64'), ['mem_bytes', 'step'], {0: {'note': 'x'}})
    >>> decode_frames(b.encode())[0][0][0]
    {'rank': 0, 'seq': 0, 'step': 3, 'mem_bytes': 7, 'note': 'x'}
    """

    __slots__ = ("n", "columns", "ints", "extras", "_rows")

    def __init__(self, n: int, columns: dict[str, np.ndarray], ints: Iterable[str] = (),
                 extras: dict[int, dict[str, Any]] | None = None, rows: list[Record] | None = None):
        self.n = n
        self.columns = columns
        self.ints = frozenset(ints)
        self.extras = extras or {}
        self._rows = rows

    @classmethod
    def from_records(cls, records: Sequence[Record]) -> RecordBatch:
        """One pass over the records' fields (the kernel's hottest loop), then one numpy
        conversion per field."""
        n = len(records)
        if not n:
            return cls(0, {}, rows=[])
        raw: dict[str, list[Any]] = {}
        names = list(records[0])
        same = len(names) > 1 and sum(map(len, records)) == n * len(names)
        if same:  # the usual case, every record with the same fields (one log call's): column by column
            try:
                raw = dict(zip(names, map(list, zip(*map(itemgetter(*names), records)))))
            except KeyError:  # as many fields, not the same ones
                same = False
        if not same:
            for i, rec in enumerate(records):
                for name, value in rec.items():
                    col = raw.get(name)
                    if col is None:
                        col = raw[name] = [None] * n
                    col[i] = value
        columns: dict[str, np.ndarray] = {}
        ints: list[str] = []
        extras: dict[int, dict[str, Any]] = {}
        for name, values in raw.items():
            if name in INT_KEYS:
                columns[name] = np.array(values, dtype=np.int64)
                continue
            kinds = set(map(type, values))
            if not kinds <= _NUMERIC:
                keep = []
                for i, v in enumerate(values):
                    kind = type(v)
                    if kind is float or kind is int or v is None:
                        keep.append(v)
                    else:
                        extras.setdefault(i, {})[name] = v
                        keep.append(None)
                values = keep
                kinds = set(map(type, values))
            if kinds == {type(None)}:
                if name not in RECORD_KEYS:
                    continue  # a field that is None everywhere (an automatic metric this run has not)
            elif kinds <= _INTS:
                ints.append(name)
            columns[name] = np.array(values, dtype=np.float64)
        return cls(n, columns, ints, extras, rows=list(records))

    def __len__(self) -> int:
        return self.n

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as columns, without the dicts it was made from
        return RecordBatch, (self.n, self.columns, sorted(self.ints), self.extras)

    @classmethod
    def concat(cls, batches: Sequence[RecordBatch]) -> RecordBatch:
        """One batch of the records of ``batches``, in order (a field some lack is NaN there).

        >>> a = RecordBatch.from_records([{"rank": 0, "seq": 0, "loss": 1.0}])
        >>> b = RecordBatch.from_records([{"rank": 1, "seq": 0, "acc": 0.5}])
        >>> RecordBatch.concat([a, b]).rows()
        [{'rank': 0, 'seq': 0, 'loss': 1.0}, {'rank': 1, 'seq': 0, 'acc': 0.5}]
        """
        batches = [b for b in batches if b.n]
        if len(batches) == 1:
            return batches[0]
        if not batches:
            return cls(0, {}, rows=[])
        names = list(dict.fromkeys(name for b in batches for name in b.columns))
        columns = {}
        for name in names:
            parts = []
            for b in batches:
                col = b.columns.get(name)
                if col is None:
                    col = np.full(b.n, np.nan if name not in INT_KEYS else 0)
                parts.append(col)
            columns[name] = np.concatenate(parts)
            if name in INT_KEYS:
                columns[name] = columns[name].astype(np.int64)
        ints = [name for name in names if all(name in b.ints or name not in b.columns for b in batches)
                and any(name in b.ints for b in batches)]
        extras: dict[int, dict[str, Any]] = {}
        offset = 0
        for b in batches:
            extras.update({offset + i: e for i, e in b.extras.items()})
            offset += b.n
        rows = [r for b in batches for r in b._rows] if all(b._rows is not None for b in batches) else None
        return cls(offset, columns, ints, extras, rows)

    def __getitem__(self, i: Any) -> Any:
        return self.rows()[i]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.rows())

    def __repr__(self) -> str:
        return f"RecordBatch({self.n} records: {', '.join(self.columns)})"

    def row(self, i: int) -> Record:
        """Record ``i`` as a dict (without building the others)."""
        if self._rows is not None:
            return self._rows[i]
        row: Record = {}
        for name, col in self.columns.items():
            v = col[i].item()
            if v == v:
                row[name] = int(v) if name in self.ints or name in INT_KEYS else v
        row.update(self.extras.get(i, {}))
        return row

    def rows(self) -> list[Record]:
        """The records as dicts (built once, on first use, for a batch read from disk)."""
        if self._rows is None:
            cols = [(name, col.tolist(), name in self.ints or name in INT_KEYS) for name, col in self.columns.items()]
            rows: list[Record] = [{} for _ in range(self.n)]
            for name, values, as_int in cols:
                for row, v in zip(rows, values):
                    if v == v:  # not NaN
                        row[name] = int(v) if as_int else v
            for i, extra in self.extras.items():
                rows[i].update(extra)
            self._rows = rows
        return self._rows

    def take(self, index: np.ndarray) -> RecordBatch:
        """The records at ``index`` (a boolean mask or positions), as a new batch."""
        index = np.flatnonzero(index) if index.dtype == bool else index
        positions = index.tolist()
        extras = {j: self.extras[i] for j, i in enumerate(positions) if i in self.extras}
        rows = [self._rows[i] for i in positions] if self._rows is not None else None
        return RecordBatch(len(positions), {k: v[index] for k, v in self.columns.items()}, self.ints, extras, rows)

    def encode(self) -> bytes:
        """One frame of the binary run log: magic, header length, a JSON header, the columns' bytes."""
        cols = [(name, col.dtype.str, col.nbytes) for name, col in self.columns.items()]
        head = json.dumps({"n": self.n, "columns": cols, "ints": sorted(self.ints),
                           "extras": {str(i): e for i, e in self.extras.items()}}, default=str).encode()
        return b"".join([_HEAD.pack(FRAME_MAGIC, len(head)), head, *(np.ascontiguousarray(c).tobytes()
                                                                        for c in self.columns.values())])


def decode_frames(data: bytes | memoryview) -> tuple[list[RecordBatch], int]:
    """The complete frames at the start of ``data`` and how many bytes they take (a frame still
    being written is left for the next read)."""
    view = memoryview(data)
    out: list[RecordBatch] = []
    pos = 0
    while pos + _HEAD.size <= len(view):
        magic, head_len = _HEAD.unpack_from(view, pos)
        if magic != FRAME_MAGIC:
            raise ValueError(f"not a jdist record frame at byte {pos}")
        start = pos + _HEAD.size
        if start + head_len > len(view):
            break
        head = json.loads(bytes(view[start:start + head_len]))
        body = start + head_len
        end = body + sum(nbytes for _, _, nbytes in head["columns"])
        if end > len(view):
            break
        columns = {}
        at = body
        for name, dtype, nbytes in head["columns"]:
            columns[name] = np.frombuffer(view[at:at + nbytes], dtype=dtype).copy()
            at += nbytes
        out.append(RecordBatch(head["n"], columns, head["ints"], {int(i): e for i, e in head["extras"].items()}))
        pos = end
    return out, pos


def folder_files(path: str | os.PathLike) -> list[str]:
    """The files of a run folder, sorted: ``meta.json``; ``metrics.jdc`` (the kernel's run log) or, for
    the ranks of another launcher (:mod:`jdist.rank.filelog`), ``metrics.r<rank>.jsonl`` per rank and
    ``failed.r<rank>.json`` per rank that failed."""
    try:
        return sorted(p.name for p in Path(path).iterdir())
    except FileNotFoundError:
        return []


def read_file(path: Path, offset: int = 0) -> tuple[list[RecordBatch], int]:
    """The new complete batches of a file of a run folder from byte ``offset`` on (none for a file
    without records), and the offset after them."""
    if path.name == RECORDS_FILE:
        return read_frames(path, offset)
    if path.name.startswith("metrics") and path.name.endswith(".jsonl"):
        records, offset = read_records(path, offset)
        return ([RecordBatch.from_records(records)] if records else []), offset
    return [], offset


def load_batches(path: str | os.PathLike) -> list[RecordBatch]:
    """Every batch of records in a run folder, as written (what a released run reads back)."""
    return [batch for name in folder_files(path) for batch in read_file(Path(path) / name)[0]]


def load_hosts(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every host sample in a run folder (``hosts*.jsonl``), file by file."""
    return [sample for name in folder_files(path) if name.startswith("hosts") and name.endswith(".jsonl")
            for sample in read_records(Path(path) / name)[0]]


def load_pipeline(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every pipeline message in a run folder (``pipeline.jsonl``: :class:`jdist.protocol.PipelineMessage`)."""
    return [msg for name in folder_files(path) if name.startswith("pipeline") and name.endswith(".jsonl")
            for msg in read_records(Path(path) / name)[0]]


def read_frames(path: str | os.PathLike, offset: int = 0) -> tuple[list[RecordBatch], int]:
    """The complete frames of a ``metrics.jdc`` from byte ``offset`` on, and the offset after the
    last complete one (a frame still being written is left for the next read)."""
    data = _read_from(path, offset)
    batches, used = decode_frames(data)
    return batches, offset + used


def read_records(path: str | os.PathLike, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete JSON lines of a ``metrics*.jsonl`` from byte ``offset`` on, and the offset
    after the last complete line (a line still being written has no newline yet)."""
    data = _read_from(path, offset)
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end


def _read_from(path: str | os.PathLike, offset: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read()
    except FileNotFoundError:
        return b""


class RecordStore:
    """A run's values in one float64 array ``data[row, column, field]`` (see the module docstring):
    a row per step (``keys``, sorted), a column per rank, a field per metric (``fields``), with the
    record's ``seq`` and ``time`` as the first two fields. NaN: no value.

    ``count[column, field]``: the steps with a value; ``top[column, field]``: the highest of them.
    Rows are appended as steps grow; a step lower than the highest seen inserts a row (a copy of
    the array: rare, a rank restarting from an earlier step). A field costs 8 bytes per (step,
    rank) from its first value on, whichever ranks log it. ``nbytes`` is what it holds.
    """

    def __init__(self, world_size: int):
        self.n = 0  # rows used
        self.version = 0  # counts the row insertions (rows before it moved)
        self._keys = np.empty(0)  # the step of each row, sorted
        self.ranks: list[int] = list(range(world_size))
        self._col_of = np.arange(max(world_size, 1), dtype=np.int64)  # rank -> column (-1: none yet)
        if not world_size:
            self._col_of[:] = -1
        self.fields: dict[str, int] = {"seq": 0, "time": 1}  # then the metrics, in first-seen order
        self.data = np.empty((0, world_size, 2))
        self.count = np.zeros((world_size, 2), dtype=np.int64)
        self.top = np.full((world_size, 2), -np.inf)
        self.ints: dict[str, bool] = {}  # metric -> every value was a Python int
        self.step_ints = True
        self.unstepped: list[Record] = []
        self.extras: dict[tuple[float, int], dict[str, Any]] = {}

    # -- adding ---------------------------------------------------------------------------------

    def add(self, batch: RecordBatch) -> None:
        """Put a batch's values in the array (the caller dropped duplicates already)."""
        if not batch.n:
            return
        cols = batch.columns
        step = cols.get("step")
        if step is None:
            step = np.full(batch.n, np.nan)
        stepped = ~np.isnan(step)
        if not stepped.all():
            for i in np.flatnonzero(~stepped).tolist():
                self.unstepped.append(batch.row(i))
            if not stepped.any():
                return
            batch = batch.take(stepped)
            cols, step = batch.columns, batch.columns["step"]
        if "step" not in batch.ints:
            self.step_ints = False
        names = [name for name in cols if name not in RECORD_KEYS or name in ("seq", "time")]
        for name in names:
            if name not in self.fields:
                self._add_field(name)
            if name not in ("seq", "time"):
                self.ints[name] = self.ints.get(name, True) and name in batch.ints
        rows = self._rows_for(step)
        where = self._columns_of(cols["rank"])
        field = np.array([self.fields[name] for name in names], dtype=np.int64)
        block = np.empty((batch.n, len(names)))
        for j, name in enumerate(names):
            block[:, j] = cols[name]
        cell = rows * len(self.ranks) + where
        if len(np.unique(cell)) < batch.n:  # a rank logged one step twice in the batch: merge them
            rows, where, block = _merge_cells(cell, rows, where, block)
        at = (rows[:, None], where[:, None], field[None, :])
        old = self.data[at]
        given = ~np.isnan(block)
        self.data[at] = np.where(given, block, old)
        width = self.count.shape[1]
        flat = (where[:, None] * width + field[None, :])
        filled = given & np.isnan(old)
        if filled.any():
            self.count += np.bincount(flat[filled], minlength=self.count.size).reshape(self.count.shape)
        np.maximum.at(self.top.reshape(-1), flat[given], np.broadcast_to(self._keys[rows][:, None], flat.shape)[given])
        for i, extra in batch.extras.items():
            self.extras.setdefault((float(step[i]), int(cols["rank"][i])), {}).update(extra)

    def _add_field(self, name: str) -> None:
        self.fields[name] = len(self.fields)
        self.data = np.concatenate([self.data, np.full((*self.data.shape[:2], 1), np.nan)], axis=2)
        self.count = np.concatenate([self.count, np.zeros((len(self.ranks), 1), dtype=np.int64)], axis=1)
        self.top = np.concatenate([self.top, np.full((len(self.ranks), 1), -np.inf)], axis=1)

    def _columns_of(self, ranks: np.ndarray) -> np.ndarray:
        """The column of each rank, adding columns for ranks not seen (beyond the world size)."""
        top = int(ranks.max())
        if top >= len(self._col_of) or (self._col_of[ranks] < 0).any():
            for r in sorted(set(ranks.tolist())):
                if r < 0:
                    raise ValueError(f"a record's rank is {r}")
                if r >= len(self._col_of):
                    self._col_of = np.concatenate([self._col_of, np.full(r + 1 - len(self._col_of), -1)])
                if self._col_of[r] < 0:
                    self._col_of[r] = len(self.ranks)
                    self.ranks.append(r)
                    shape = self.data.shape
                    self.data = np.concatenate([self.data, np.full((shape[0], 1, shape[2]), np.nan)], axis=1)
                    self.count = np.concatenate([self.count, np.zeros((1, self.count.shape[1]), dtype=np.int64)])
                    self.top = np.concatenate([self.top, np.full((1, self.top.shape[1]), -np.inf)])
        return self._col_of[ranks]

    def _rows_for(self, steps: np.ndarray) -> np.ndarray:
        """The row of each step, adding rows for new steps."""
        keys = self._keys[: self.n]
        last = keys[-1] if self.n else -np.inf
        if steps.min() > last:  # every step is after the others: the usual case
            new = np.unique(steps)
        else:
            uniq = np.unique(steps)
            pos = np.searchsorted(keys, uniq)
            found = pos < self.n
            found[found] = keys[pos[found]] == uniq[found]
            new = uniq[~found]
        if new.size:
            if new[0] > last:
                self._grow(self.n + new.size)
                self._keys[self.n: self.n + new.size] = new
                self.n += new.size
            else:
                self._insert(new)
        return np.searchsorted(self._keys[: self.n], steps)

    def _grow(self, rows: int) -> None:
        if rows <= len(self._keys):
            return
        cap = max(64, rows, int(len(self._keys) * 1.5))
        self._keys = _resized(self._keys, cap)
        self.data = _resized(self.data, cap)

    def _insert(self, new: np.ndarray) -> None:
        """Rows for steps among the existing ones (a copy of the array)."""
        at = np.searchsorted(self._keys[: self.n], new)
        n = self.n + new.size
        cap = max(64, n, int(len(self._keys) * 1.5))
        self._keys = _resized(np.insert(self._keys[: self.n], at, new), cap)
        self.data = _resized(np.insert(self.data[: self.n], at, np.nan, axis=0), cap)
        self.n = n
        self.version += 1

    def trim(self) -> None:
        """Give back the rows allocated ahead (when the run has ended)."""
        if len(self._keys) > self.n:
            self._keys = self._keys[: self.n].copy()
            self.data = self.data[: self.n].copy()

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self.data.nbytes + self.count.nbytes + self.top.nbytes

    # -- reading --------------------------------------------------------------------------------

    @property
    def keys(self) -> np.ndarray:
        """The step of each row, sorted (a view: do not modify)."""
        return self._keys[: self.n]

    def field(self, name: str) -> np.ndarray | None:
        """``[row, column]`` of one field (a view: do not modify), or ``None`` if never logged."""
        f = self.fields.get(name)
        return None if f is None else self.data[: self.n, :, f]

    def steps(self, metric: str) -> np.ndarray:
        """The steps at which some rank has a value of ``metric``."""
        values = self.field(metric)
        if values is None or not values.shape[1]:
            return np.empty(0)
        return self.keys[~np.isnan(values).all(axis=1)]


def _merge_cells(cell: np.ndarray, rows: np.ndarray, where: np.ndarray, block: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One entry per (row, column): a later record's value over an earlier one's, the earlier
    one's where the later has none."""
    order = np.argsort(cell, kind="stable")
    cell, rows, where, block = cell[order], rows[order], where[order], block[order]
    starts = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]])
    merged = block[starts].copy()
    for g, start in enumerate(starts.tolist()):
        end = starts[g + 1] if g + 1 < len(starts) else len(cell)
        for i in range(start + 1, end):
            merged[g] = np.where(np.isnan(block[i]), merged[g], block[i])
    return rows[starts], where[starts], merged


def _resized(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` with ``rows`` rows: cut, or grown with NaN."""
    if a.shape[0] >= rows:
        return a[:rows]
    out = np.full((rows, *a.shape[1:]), np.nan, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


__all__ = ["FRAME_MAGIC", "HOSTS_FILE", "INT_KEYS", "PIPELINE_FILE", "RECORDS_FILE", "RecordBatch", "RecordStore", "decode_frames", "folder_files",
           "load_batches", "load_hosts", "load_pipeline", "read_file", "read_frames", "read_records"]
