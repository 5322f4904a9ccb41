"""Collectives that cannot complete, refused before they start.

jdist knows which ranks run a cell (``--targets``): a collective on a group with a rank that does not run the
cell would wait for it until ``--timeout``. With ``--auto-metrics`` on (the default) every ``torch.distributed``
collective jdist times, and every forward of a CPU ``DistributedDataParallel`` (whose backward all-reduces),
first checks its group against the cell's ranks (:func:`check_cell_ranks`: a tuple comparison when the cell
runs on every rank) and raises one line instead.

Example:
    >>> check_cell_ranks("all_reduce", "the default group", (0, 1, 2, 3), (0,))
    Traceback (most recent call last):
    RuntimeError: all_reduce on the default group (ranks 0-3) in a cell that runs on rank 0 only: ranks 1-3 do not run it and would never join, and the cell would wait for them until --timeout. Run it in a cell on all of its ranks (without --targets), or on a group of this cell's ranks made beforehand in a cell on every rank (dist.new_group([0])).
    >>> check_cell_ranks("all_reduce", "a group", (0, 1), (0, 1, 2))
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from jdist.common.mismatch import spans
from jdist.common.stacks import Collective


def check_cell_ranks(what: str, group_name: str, group_ranks: Sequence[int], cell_ranks: Sequence[int]) -> None:
    """Raise if ``group_ranks`` has ranks that do not run the cell (``cell_ranks``)."""
    missing = [r for r in group_ranks if r not in cell_ranks]
    if not missing:
        return
    runs = f"rank {cell_ranks[0]} only" if len(cell_ranks) == 1 else f"ranks {spans(cell_ranks)} only"
    raise RuntimeError(
        f"{what} on {group_name} (ranks {spans(group_ranks)}) in a cell that runs on {runs}: "
        f"{'rank' if len(missing) == 1 else 'ranks'} {spans(missing)} do{'es' if len(missing) == 1 else ''} not "
        "run it and would never join, and the cell would wait for them until --timeout. Run it in a cell on all "
        "of its ranks (without --targets), or on a group of this cell's ranks made beforehand in a cell on every "
        f"rank (dist.new_group([{', '.join(map(str, cell_ranks))}]))."
    )


def check_group(what: str, group: Any, cell_ranks: Sequence[int]) -> None:
    """:func:`check_cell_ranks` for a ``torch.distributed`` process group (None: the default group)."""
    import torch.distributed as dist

    ranks = _ranks_of(group)
    if ranks is not None:
        name = "the default group" if group is None or group is dist.group.WORLD else "its group"
        check_cell_ranks(what, name, ranks, cell_ranks)


_RANKS: dict[Any, tuple[int, ...]] = {}  # a group's name -> its global ranks (a group's ranks do not change)


def _ranks_of(group: Any) -> tuple[int, ...] | None:
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    group = group if group is not None else dist.group.WORLD
    key = getattr(group, "group_name", None) or id(group)  # (a group re-made after a release has a new name)
    ranks = _RANKS.get(key)
    if ranks is None:
        try:
            ranks = tuple(dist.get_process_group_ranks(group))
        except (RuntimeError, ValueError):  # not a group of this rank's
            return None
        _RANKS[key] = ranks
    return ranks


#: Entries of c10d's Flight Recorder (``TORCH_FR_BUFFER_SIZE``, set on every rank before its first process group
#: unless the environment sets it): the newest collectives of each group, which a hang report compares
#: (:func:`latest_collectives`). Recording one is in C++; reading them back costs about 0.7 ms at 64 entries (its
#: JSON, 30 KB), 5.4 ms at 256, on each guard sample: 64 holds the newest of every group of a step by far.
FR_ENTRIES = 64


def enable_flight_recorder() -> None:
    """Turn c10d's Flight Recorder on for the process groups made from now on (gloo and NCCL), unless the
    environment chose a size (0: off)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(FR_ENTRIES))


def latest_collectives() -> tuple[Collective, ...]:
    """This rank's newest collective on each of its process groups, from the Flight Recorder (empty when it is
    off or nothing ran). Safe from another thread while the main one waits in a collective (the recorder has
    its own lock)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return ()
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        trace = json.loads(_dump_fr_trace_json(True, False))
    except Exception:  # (no recorder in this torch, or it is off)
        return ()
    world = dist.distributed_c10d._world
    ranks = {getattr(pg, "group_name", ""): tuple(sorted(members)) for pg, members in world.pg_group_ranks.items()}
    # per group name, its newest entry (by record: a group re-made after a release keeps the old one's name, has
    # another pg_id, and counts from 1 again); the status is by pg_id
    status = trace.get("pg_status") or {}
    newest: dict[str, dict[str, Any]] = {}
    for entry in trace.get("entries") or ():
        if entry.get("is_p2p"):
            continue
        name = (entry.get("process_group") or [""])[0]
        if name not in newest or entry.get("record_id", 0) > newest[name].get("record_id", 0):
            newest[name] = entry
    out = []
    for name, entry in sorted(newest.items()):
        seq = int(entry["collective_seq_id"])
        done = seq <= int((status.get(str(entry.get("pg_id"))) or {}).get("last_completed_collective", -1))
        op = str(entry.get("profiling_name", "")).split(":")[-1]
        out.append(Collective(ranks.get(name, ()), seq, op, tuple(tuple(s) for s in entry.get("input_sizes") or ()),
                              tuple(entry.get("input_dtypes") or ()), done))
    return tuple(out)


__all__ = ["FR_ENTRIES", "check_cell_ranks", "check_group", "enable_flight_recorder", "latest_collectives"]
