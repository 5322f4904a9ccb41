"""Rank output in the notebook: the lowest selected rank live, every rank labelled, or nothing."""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence


class RankOutput:
    """``mode``: ``rank0`` (the lowest selected rank, live), ``all`` (every rank, line by line,
    labelled ``[rank r]``) or ``none``."""

    def __init__(self, mode: str, ranks: Sequence[int], show: Callable[[dict[str, Any]], None] | None = None):
        self.mode = mode
        self.first = min(ranks)
        self.partial: dict[tuple[int, str], str] = {}
        self.show = show  # how a display is shown (default: IPython's, in the notebook)

    def stream(self, rank: int, name: str, text: str) -> None:
        out = sys.stderr if name == "stderr" else sys.stdout
        if self.mode == "none":
            return
        if self.mode == "rank0":
            if rank == self.first:
                out.write(text)
                out.flush()
            return
        buf = self.partial.get((rank, name), "") + text
        *lines, rest = buf.split("\n")
        self.partial[(rank, name)] = rest
        if lines:
            out.write("".join(f"[rank {rank}] {line}\n" for line in lines))
            out.flush()

    def display(self, rank: int, content: dict[str, Any]) -> None:
        if self.mode == "none" or (self.mode == "rank0" and rank != self.first):
            return
        from IPython.display import publish_display_data

        if self.mode == "all":
            sys.stdout.write(f"[rank {rank}] display:\n")
        if self.show is not None:
            self.show(content)
        else:
            publish_display_data(content.get("data", {}), content.get("metadata", {}))

    def close(self) -> None:
        for (rank, name), rest in sorted(self.partial.items()):
            if rest:
                (sys.stderr if name == "stderr" else sys.stdout).write(f"[rank {rank}] {rest}\n")
        self.partial.clear()
