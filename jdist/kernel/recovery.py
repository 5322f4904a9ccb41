"""Bringing ranks back after they died: restart, replay the set-up cells, restore a checkpoint.

Each cluster keeps one :class:`RecoveryLog` (``cluster.recovery``), and its ``note_*`` methods are
the only way anything is written to it: :func:`jdist.kernel.supervise.run_cell` notes the cells
that ended without error and logged no training steps ("set-up cells": imports, data, model,
optimizer, ``jdist.prepare``, ``jdist.checkpoint_every``) and the ranks' checkpoint messages;
:meth:`ClusterSession.push <jdist.kernel.cluster.ClusterSession.push>` notes ``%dist push``.
After the rank processes died (all of them: MPI ends the job), :func:`restart` starts fresh ranks,
replays those in order, each set-up cell with the options it ran with, and, if
``jdist.checkpoint_every`` had saved a checkpoint, loads the newest one into the same variables.
Training cells are not replayed: re-run them, starting from ``jdist.restored_step()``. Nothing is
lost beyond the last checkpoint.

Example:
    >>> print(restart(cluster))        # doctest: +SKIP
    Restarted 2 rank(s) in 8.1 s; replayed 2 set-up cell(s); restored ckpt/step-00000040 (step 40).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union

from jdist.options import CellOptions
from jdist.protocol import DataMessage

if TYPE_CHECKING:
    from .cluster import ClusterSession


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


def restart(cluster: ClusterSession, progress: Callable[[str], None] | None = None, restore: bool = True) -> str:
    """Restart the ranks; with ``restore``, replay set-up cells and load the newest checkpoint.

    Returns one line saying what was restored and what was lost.
    """
    from .supervise import run_cell

    say = progress or (lambda msg: None)
    entries, ckpt = cluster.recovery.take()
    t0 = time.perf_counter()
    cluster.restart(say)
    restarted = f"Restarted {cluster.config.n} rank(s) in {time.perf_counter() - t0:.1f} s"
    if not restore:
        return restarted + "; variables on the ranks are lost (--fresh)."
    if not entries and not (ckpt and ckpt.latest):
        return restarted + "; there was nothing to restore (no set-up cells, no checkpoint)."
    replayed = 0
    cells = sum(isinstance(e, SetupCell) for e in entries)
    for entry in entries:
        if isinstance(entry, Push):
            cluster.push(entry.name, entry.value, entry.ranks)
            continue
        say(f"  replaying set-up cell {replayed + 1} of {cells}...")
        result = run_cell(cluster, entry.code, replay_options(entry.options), ranks=entry.ranks)
        if not result.ok:
            if result.death is not None:
                what = result.death.cause
            elif result.failed:
                what = next(iter(result.failed.values())).evalue
            else:
                what = "it did not finish"
            return (f"{restarted}; replaying set-up cell {replayed + 1} failed ({what}), so nothing was restored "
                    f"beyond it. The cell began:\n{entry.code[:300]}")
        replayed += 1
    text = f"{restarted}; replayed {replayed} set-up cell(s)"
    if ckpt is None:
        return text + "; jdist.checkpoint_every was not used, so training progress is lost."
    try:
        restored = cluster.call("restore_latest", ckpt.directory, ckpt.names, ckpt.every, ckpt.keep,
                                timeout=cluster.config.timeout + 60)[0]
    except Exception as exc:
        evalue = getattr(exc, "evalue", None) or str(exc)
        return f"{text}; the checkpoint could not be restored: {evalue}"
    if cluster.recovery.checkpoint is None:  # its cell was not among the replayed: keep the plan
        cluster.recovery.note_message({"kind": "checkpoint_every", "every": ckpt.every, "directory": ckpt.directory,
                                       "keep": ckpt.keep, "names": ckpt.names})
    cluster.recovery.note_message({"kind": "checkpoint_saved", "path": restored["path"], "step": restored["step"]})
    names = ", ".join(v for v in ckpt.names.values() if v)
    return (f"{text}; restored {restored['path']} (step {restored['step']}) into {names}. Lost: only the steps "
            f"after {restored['step']}. Re-run the training cell; jdist.restored_step() is {restored['step']}.")


def replay_options(options: CellOptions | None) -> CellOptions:
    """The options a set-up cell is replayed with: those it ran with, quietly (no output, no dashboard)."""
    from jdist.plugins import option_table

    base = options if options is not None else option_table().cell_options({})
    return base.replace(output="none", no_dashboard=True)
