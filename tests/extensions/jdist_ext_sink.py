"""A record destination of one's own with its cell option: ``--csv FILE`` writes the cell's
records to a CSV file while it runs."""

from __future__ import annotations

import csv
from typing import Any

from jdist.options import Option, Scope
from jdist.plugins import SinkSpec

CSV = SinkSpec("csv", "jdist_ext_sink:make", options=(
    Option("csv", ("--csv",), "Also write this cell's records to FILE (CSV).", Scope.CELL, type=str, metavar="FILE"),))
COLUMNS = ("rank", "step", "loss")


class CSVSink:
    def __init__(self, path: str) -> None:
        self.path = path
        self.file: Any = None

    def start(self, run: Any) -> None:
        self.file = open(self.path, "w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(COLUMNS)

    def add(self, records: list[dict[str, Any]]) -> None:
        self.writer.writerows([rec.get(c) for c in COLUMNS] for rec in records)

    def tick(self) -> None:
        self.file.flush()

    def finish(self, run: Any) -> None:
        self.file.close()


def make(run: Any, opts: Any) -> CSVSink:
    return CSVSink(opts.csv)
