"""What a cluster's ranks would need to come back after they died: its :class:`RecoveryLog`
(``cluster.recovery``), written only through its ``note_*`` methods: :func:`jdist.kernel.supervise.run_cell`
notes the cells that ended without error and logged no training steps ("set-up cells": imports, data, model,
optimizer, ``jdist.prepare``, ``jdist.checkpoint_every``) and the ranks' checkpoint messages;
:meth:`ClusterSession.push <jdist.kernel.cluster.ClusterSession.push>` notes ``%dist push``. What brings the
ranks back from it is :func:`jdist.kernel.recovery.restart`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

from jdist.options import CellOptions
from jdist.protocol import DataMessage


@dataclass(frozen=True)
class SetupCell:
    """A cell that ended without error and logged nothing, with its ranks and options: replayed."""

    code: str
    ranks: list[int] | None
    options: CellOptions | None = None


@dataclass(frozen=True)
class Push:
    """A ``%dist push``: replayed as well."""

    name: str
    value: Any
    ranks: list[int] | None


@dataclass(frozen=True)
class CheckpointPlan:
    """The ranks' ``jdist.checkpoint_every`` settings and the newest checkpoint it saved."""

    every: int
    directory: str
    keep: int | None
    names: dict[str, str | None]
    latest: dict[str, Any] | None = None


Entry = Union[SetupCell, Push]


@dataclass
class RecoveryLog:
    """What :func:`restart` brings back for one cluster (see the module doc).

    >>> log = RecoveryLog()
    >>> log.note_cell("import torch", None)
    >>> log.note_message({"kind": "checkpoint_every", "every": 10, "directory": "ck", "keep": 2, "names": {}})
    >>> log.note_message({"kind": "checkpoint_saved", "path": "ck/step-10", "step": 10})
    >>> [type(e).__name__ for e in log.entries], log.checkpoint.latest
    (['SetupCell'], {'path': 'ck/step-10', 'step': 10})
    """

    entries: list[Entry] = field(default_factory=list)
    checkpoint: CheckpointPlan | None = None

    def note_cell(self, code: str, ranks: list[int] | None, options: CellOptions | None = None) -> None:
        """A set-up cell ran (in order)."""
        self.entries.append(SetupCell(code, ranks, options))

    def note_push(self, name: str, value: Any, ranks: list[int] | None) -> None:
        """``%dist push NAME`` ran."""
        self.entries.append(Push(name, value, ranks))

    def note_message(self, msg: DataMessage | dict[str, Any]) -> None:
        """A checkpoint message from rank 0: ``checkpoint_every`` settings, or a checkpoint saved."""
        if msg["kind"] == "checkpoint_every":
            self.checkpoint = CheckpointPlan(msg["every"], msg["directory"], msg["keep"], msg["names"])
        elif msg["kind"] == "checkpoint_saved" and self.checkpoint is not None:
            self.checkpoint = dataclasses.replace(self.checkpoint, latest={"path": msg["path"], "step": msg["step"]})

    def take(self) -> tuple[list[Entry], CheckpointPlan | None]:
        """Everything noted so far, leaving the log empty (a restart notes it again as it replays)."""
        entries, checkpoint = self.entries, self.checkpoint
        self.entries, self.checkpoint = [], None
        return entries, checkpoint
