"""Bringing ranks back after they died: restart, replay the set-up cells, restore a checkpoint.

The kernel keeps, per cluster, the cells that ended without error and logged no training
steps ("set-up cells": imports, data, model, optimizer, ``jdist.prepare``,
``jdist.checkpoint_every``) and the values pushed with ``%dist push``
(:attr:`jdist.kernel.cluster.ClusterSession.history`). After the rank processes died (all of
them: MPI ends the job), :func:`restart` starts fresh ranks, replays those in order and, if
``jdist.checkpoint_every`` had saved a checkpoint, loads the newest one into the same
variables. Training cells are not replayed: re-run them, starting from
``jdist.restored_step()``. Nothing is lost beyond the last checkpoint.

Example:
    >>> print(restart(cluster))        # doctest: +SKIP
    Restarted 2 rank(s) in 8.1 s; replayed 2 set-up cell(s); restored ckpt/step-00000040 (step 40).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from .cluster import ClusterSession, Push, SetupCell
from .supervise import run_cell


def restart(cluster: ClusterSession, progress: Callable[[str], None] | None = None, restore: bool = True) -> str:
    """Restart the ranks; with ``restore``, replay set-up cells and load the newest checkpoint.

    Returns one line saying what was restored and what was lost.
    """
    say = progress or (lambda msg: None)
    history = list(cluster.history)
    ckpt = dataclasses.replace(cluster.checkpoint) if cluster.checkpoint is not None else None
    t0 = time.perf_counter()
    cluster.restart(say)
    restarted = f"Restarted {cluster.config.n} rank(s) in {time.perf_counter() - t0:.1f} s"
    if not restore:
        return restarted + "; variables on the ranks are lost (--fresh)."
    if not history and not (ckpt and ckpt.latest):
        return restarted + "; there was nothing to restore (no set-up cells, no checkpoint)."
    replayed = 0
    cells = sum(isinstance(e, SetupCell) for e in history)
    for entry in history:
        if isinstance(entry, Push):
            cluster.push(entry.name, entry.value, entry.ranks)
            cluster.history.append(entry)
            continue
        say(f"  replaying set-up cell {replayed + 1} of {cells}...")
        result = run_cell(cluster, entry.code, ranks=entry.ranks, output="none", dashboard=False)
        if not result.ok:
            if result.death is not None:
                what = result.death.cause
            elif result.failed:
                what = next(iter(result.failed.values())).evalue
            else:
                what = "it did not finish"
            return (f"{restarted}; replaying set-up cell {replayed + 1} failed ({what}), so nothing was restored "
                    f"beyond it. The cell began:\n{entry.code[:300]}")
        cluster.history.append(entry)
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
    cluster.checkpoint = dataclasses.replace(ckpt, latest=restored)
    names = ", ".join(v for v in ckpt.names.values() if v)
    return (f"{text}; restored {restored['path']} (step {restored['step']}) into {names}. Lost: only the steps "
            f"after {restored['step']}. Re-run the training cell; jdist.restored_step() is {restored['step']}.")
