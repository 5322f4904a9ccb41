"""Bringing ranks back after they died: restart, replay the set-up cells, restore a checkpoint.

A use case above the cluster and the cell supervisor: each cluster keeps one
:class:`~jdist.kernel.recoverylog.RecoveryLog` (``cluster.recovery``: the set-up cells, ``%dist push`` and
the checkpoint plan, noted as they happen). After the rank processes died (all of them: MPI ends the
job), :func:`restart` starts fresh ranks, replays those in order, each set-up cell with the options it ran with, and, if
``jdist.checkpoint_every`` had saved a checkpoint, loads the newest one into the same variables.
Training cells are not replayed: re-run them, starting from ``jdist.restored_step()``. Nothing is
lost beyond the last checkpoint. A set-up cell that fails in the replay (one that only read the training state,
say) is named as skipped and the replay goes on; a rank's death in it ends the restart.

Example:
    >>> print(restart(cluster))        # doctest: +SKIP
    Restarted 2 rank(s) in 8.1 s; replayed 2 set-up cell(s); restored ckpt/step-00000040 (step 40).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from jdist.options import CellOptions

from .recoverylog import Entry, Push, SetupCell

if TYPE_CHECKING:
    from .cluster import ClusterSession


def restart(cluster: ClusterSession, progress: Callable[[str], None] | None = None, restore: bool = True) -> str:
    """Restart the ranks; with ``restore``, replay set-up cells and load the newest checkpoint.

    Returns one line saying what was restored and what was lost.
    """
    say = progress or (lambda msg: None)
    entries, ckpt = cluster.recovery.take()
    t0 = time.perf_counter()
    cluster.restart(say)
    restarted = f"Restarted {cluster.config.n} rank(s) in {time.perf_counter() - t0:.1f} s"
    if not restore:
        return restarted + "; variables on the ranks are lost (--fresh)."
    if not entries and not (ckpt and ckpt.latest):
        return restarted + "; there was nothing to restore (no set-up cells, no checkpoint)."
    replayed, skipped, failure = replay(cluster, entries, say, keep_going=True)
    if failure is not None:
        return f"{restarted}; {failure}"
    text = f"{restarted}; replayed {replayed} set-up cell(s)" + "".join(f" ({line})" for line in skipped)
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
    notes = "".join(f" {line[0].upper()}{line[1:]}." for line in restored.get("notes") or ())
    return (f"{text}; restored {restored['path']} (step {restored['step']}) into {names}.{notes} Lost: only the "
            f"steps after {restored['step']}. Re-run the training cell; jdist.restored_step() is {restored['step']}.")


def replay(cluster: ClusterSession, entries: list[Entry], say: Callable[[str], None],
           keep_going: bool = False) -> tuple[int, list[str], str | None]:
    """Replay ``entries`` (set-up cells and pushes) on the cluster's ranks, in order: the cells replayed, those
    skipped, and what to say of a failure that ended the replay. A cell that fails ends it, or with ``keep_going``
    (a resize, which loads the state after the replay: a cell that reads the training state fails before it is
    loaded) is said as skipped; a death ends it always."""
    from .supervise import run_cell

    replayed, n = 0, 0
    skipped: list[str] = []
    cells = sum(isinstance(e, SetupCell) for e in entries)
    for entry in entries:
        if isinstance(entry, Push):
            cluster.push(entry.name, entry.value, entry.ranks)
            continue
        n += 1
        say(f"  replaying set-up cell {n} of {cells}...")
        result = run_cell(cluster, entry.code, replay_options(entry.options), ranks=entry.ranks)
        if not result.ok:
            if result.death is not None:
                what = result.death.cause
            elif result.failed:
                what = next(iter(result.failed.values())).evalue
            else:
                what = "it did not finish"
            first = entry.code.strip().splitlines()[0][:80] if entry.code.strip() else ""
            if keep_going and result.death is None:
                skipped.append(f"set-up cell {n} ({first!r}...) failed in the replay ({what}) and was skipped")
                continue
            return replayed, skipped, (f"replaying set-up cell {n} failed ({what}), so nothing was restored beyond "
                                       f"it. The cell began:\n{entry.code[:300]}")
        replayed += 1
    return replayed, skipped, None


def replay_options(options: CellOptions | None) -> CellOptions:
    """The options a set-up cell is replayed with: those it ran with, quietly (no output, no dashboard)."""
    from jdist.plugins import option_table

    base = options if options is not None else option_table().cell_options({})
    return base.replace(output="none", no_dashboard=True)
