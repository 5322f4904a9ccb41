"""Bringing ranks back after they died: restart, replay the set-up cells, restore a checkpoint.

A use case above the cluster and the cell supervisor: each cluster keeps one
:class:`~jdist.kernel.recoverylog.RecoveryLog` (``cluster.recovery``: the set-up cells, ``%dist push`` and
the checkpoint plan, noted as they happen). After the rank processes died (all of them: MPI ends the
job), :func:`restart` starts fresh ranks, replays those in order, each set-up cell with the options it ran with, and, if
``jdist.checkpoint_every`` had saved a checkpoint, loads the newest one into the same variables.
Training cells are not replayed: re-run them, starting from ``jdist.restored_step()``. Nothing is
lost beyond the last checkpoint.

Example:
    >>> print(restart(cluster))        # doctest: +SKIP
    Restarted 2 rank(s) in 8.1 s; replayed 2 set-up cell(s); restored ckpt/step-00000040 (step 40).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from jdist.options import CellOptions

from .recoverylog import Push, SetupCell

if TYPE_CHECKING:
    from .cluster import ClusterSession


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
