"""Bringing ranks back after they died: restart, replay the set-up cells, restore a checkpoint.

The kernel keeps, per cluster, the cells that ended without error and logged no training
steps ("set-up cells": imports, data, model, optimizer, ``jdist.prepare``,
``jdist.checkpoint_every``) and the values pushed with ``%dist push``. After the rank
processes died (all of them: MPI ends the job), :func:`restart` starts fresh ranks,
replays those in order and, if ``jdist.checkpoint_every`` had saved a checkpoint, loads
the newest one into the same variables. Training cells are not replayed: re-run them,
starting from ``jdist.restored_step()``. Nothing is lost beyond the last checkpoint.

Example:
    >>> from jdist import recovery
    >>> print(recovery.restart(cluster))        # doctest: +SKIP
    Restarted 2 rank(s) in 8.1 s; replayed 2 set-up cell(s); restored ckpt/step-00000040 (step 40).
"""

from __future__ import annotations

import time
from typing import Callable

from .cluster import DistributedCluster
from .runner import run_cell


def restart(cluster: DistributedCluster, progress: Callable[[str], None] | None = None,
            restore: bool = True) -> str:
    """Restart the ranks; with ``restore``, replay set-up cells and load the newest checkpoint.

    Returns one line saying what was restored and what was lost.
    """
    say = progress or (lambda msg: None)
    history, ckpt = list(cluster.history), dict(cluster.checkpoint)
    t0 = time.perf_counter()
    cluster.restart(say)
    restarted = f"Restarted {cluster.config.n} rank(s) in {time.perf_counter() - t0:.1f} s"
    if not restore:
        return restarted + "; variables on the ranks are lost (--fresh)."
    if not history and not ckpt.get("latest"):
        return restarted + "; there was nothing to restore (no set-up cells, no checkpoint)."
    replayed = 0
    for entry in history:
        if entry[0] == "push":
            _, name, value, ranks = entry
            cluster.push(name, value, ranks)
            cluster.history.append(entry)
            continue
        _, code, ranks = entry
        say(f"  replaying set-up cell {replayed + 1} of {sum(e[0] == 'cell' for e in history)}...")
        result = run_cell(cluster, code, ranks=ranks, output="none", dashboard=False)
        if result.failed or result.death or result.interrupted or result.hang is not None:
            what = result.death["cause"] if result.death else (
                next(iter(result.failed.values())).evalue if result.failed else "it did not finish")
            return (f"{restarted}; replaying set-up cell {replayed + 1} failed ({what}), so nothing was restored "
                    f"beyond it. The cell began:\n{code[:300]}")
        cluster.history.append(entry)
        replayed += 1
    text = f"{restarted}; replayed {replayed} set-up cell(s)"
    if not ckpt.get("directory"):
        return text + "; jdist.checkpoint_every was not used, so training progress is lost."
    from . import checkpoint

    try:
        restored = cluster.apply(checkpoint.restore_latest, ckpt["directory"], ckpt["names"], ckpt["every"],
                                 ckpt["keep"], timeout=cluster.config.timeout + 60)[0]
    except Exception as exc:
        evalue = getattr(exc, "evalue", None) or str(exc)
        return f"{text}; the checkpoint could not be restored: {evalue}"
    cluster.checkpoint = {**ckpt, "latest": restored}
    names = ", ".join(v for v in ckpt["names"].values() if v)
    return (f"{text}; restored {restored['path']} (step {restored['step']}) into {names}. Lost: only the steps "
            f"after {restored['step']}. Re-run the training cell; jdist.restored_step() is {restored['step']}.")
