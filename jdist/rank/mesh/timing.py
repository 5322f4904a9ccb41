"""Communication time of tensor and sequence parallelism: DTensor's functional collectives, timed per mesh
dimension.

DTensor (``parallelize_module`` with ``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``; every
redistribution) communicates through ``torch.distributed._functional_collectives``: a call issues the
collective and returns at once, and the result is waited for when it is first used (``wait_tensor``). None
of it passes through ``torch.distributed.all_reduce`` and the like, which :mod:`jdist.rank.auto_metrics`
times. :func:`time_functional_collectives` wraps the module's collectives (``all_reduce``,
``all_gather_single``, ``reduce_scatter_single``, ``all_to_all_single``, ``broadcast`` and the coalesced and
older names): an issue notes its start and mesh dimension under the output's storage, and the wait that
ends it records the interval, from the issue to the end of the wait (the time the rank could not go on
without the result). On GPU ranks both ends are CUDA events on the current stream, read later: nothing
synchronises.

Not seen: collectives inside compiled graphs (``torch.compile`` traces them into the graph), and the few that
torch's own backward formulas of the functional ops issue in C++-registered autograd (their waits are timed
from the wait's start, without a dimension).

Example (one process, a 1-D mesh of one rank):
    >>> import torch, torch.distributed as dist
    >>> import torch.distributed._functional_collectives as funcol
    >>> from jdist.rank.backends.base import CommTimer
    >>> from jdist.rank.mesh.dims import DIMS, learn_meshes
    >>> from jdist.rank.mesh.timing import time_functional_collectives
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> timer, unlearn = CommTimer(), learn_meshes()
    >>> undo = time_functional_collectives(timer, "cpu")
    >>> from torch.distributed.device_mesh import init_device_mesh
    >>> mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    >>> out = funcol.all_reduce(torch.ones(2), "sum", (mesh, 0)); float(out.sum())
    2.0
    >>> [interval[2] for interval in timer.take_intervals()]
    ['tp']
    >>> undo(); unlearn(); DIMS.clear(); dist.destroy_process_group()
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable

from ..imports import after_import
from .dims import DIMS

#: The functional collectives timed (those the installed torch has).
FUNCTIONAL = ("all_reduce", "all_gather_single", "all_gather_tensor", "all_gather_tensor_autograd",
              "all_gather_single_autograd", "reduce_scatter_single", "reduce_scatter_tensor",
              "reduce_scatter_tensor_autograd", "reduce_scatter_single_autograd", "all_to_all_single",
              "all_to_all_single_autograd", "broadcast", "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
              "reduce_scatter_tensor_coalesced", "permute_tensor")
#: Issued collectives whose wait was not seen yet, at most (past it the oldest are forgotten: a result never
#: waited for, which torch allows, must not grow the table).
PENDING_MAX = 1024


def group_position(fn: Any) -> int | None:
    """Where a collective takes its ``group`` positionally (None: it has none, or keyword only).

    >>> import torch.distributed as dist
    >>> group_position(dist.all_reduce), group_position(dist.broadcast)
    (2, 2)
    """
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("group") if "group" in names else None


#: The module whose import installs the timing (DTensor imports it; jdist does not: 24 ms at a rank's set-up).
MODULE = "torch.distributed._functional_collectives"


def install(timer: Any, kind: str) -> Callable[[], None]:
    """:func:`time_functional_collectives` now if the module is imported, else right after it is; returns the
    remover."""
    undo: list[Callable[[], None]] = []
    waiting = after_import(MODULE, lambda module: undo.append(time_functional_collectives(timer, kind)))

    def remove() -> None:
        waiting()
        for u in undo:
            u()
        undo.clear()

    return remove


def time_functional_collectives(timer: Any, kind: str) -> Callable[[], None]:
    """Time every functional collective into ``timer`` (see the module doc); returns the remover."""
    import torch
    import torch.distributed._functional_collectives as funcol

    cuda = kind == "cuda"
    pending: dict[int, tuple[Any, str | None]] = {}  # output storage -> (start, dimension)
    inside: list[Any] = []  # the issue running now: [start, dimension, waited inside it]
    Event = torch.cuda.Event if cuda else None

    def now() -> Any:
        if cuda:
            ev = Event(enable_timing=True)  # type: ignore[misc]
            ev.record()
            return ev
        return time.perf_counter()

    def record(start: Any, end: Any, dim: str | None) -> None:
        if cuda:
            timer.record_cuda(start, end, dim)
        else:
            timer.record(start, end, dim)

    def make_issue(real: Any) -> Any:
        at = group_position(real)

        def issue(*args: Any, **kwargs: Any) -> Any:
            if inside:  # (all_gather_tensor calls all_gather_single: timed once)
                return real(*args, **kwargs)
            dim = DIMS.of_any(args[at] if at is not None and len(args) > at else kwargs.get("group")) \
                if DIMS.order else None
            mine = [now(), dim, False]
            inside.append(mine)
            try:
                out = real(*args, **kwargs)
            finally:
                inside.pop()
            if mine[2]:  # waited for inside (tracing, or a gather on a dimension it cannot view)
                return out
            elem = getattr(out, "elem", None)
            if elem is None or getattr(out, "completed", True):
                record(mine[0], now(), dim)  # (a plain tensor: the result is there)
                return out
            if len(pending) >= PENDING_MAX:
                pending.clear()
            pending[elem.untyped_storage().data_ptr()] = (mine[0], dim)
            return out

        issue.__wrapped__ = real  # type: ignore[attr-defined]
        issue.__name__ = getattr(real, "__name__", "collective")
        return issue

    real_wait = funcol.wait_tensor

    def wait_tensor(tensor: Any) -> Any:
        if inside:
            out = real_wait(tensor)
            mine = inside[-1]
            if not mine[2]:
                mine[2] = True
                record(mine[0], now(), mine[1])
            return out
        issued = pending.pop(tensor.untyped_storage().data_ptr(), None) if pending else None
        if issued is None:  # (issued elsewhere: the wait itself is what the rank spent)
            start = now()
            out = real_wait(tensor)
            record(start, now(), None)
            return out
        out = real_wait(tensor)
        record(issued[0], now(), issued[1])
        return out

    wait_tensor.__wrapped__ = real_wait  # type: ignore[attr-defined]
    originals: dict[str, Any] = {"wait_tensor": real_wait}
    funcol.wait_tensor = wait_tensor
    for name in FUNCTIONAL:
        real = funcol.__dict__.get(name)
        if real is None or getattr(real, "__wrapped__", None) is not None:
            continue
        originals[name] = real
        setattr(funcol, name, make_issue(real))

    def undo() -> None:
        for name, real in originals.items():
            setattr(funcol, name, real)
        pending.clear()

    return undo


__all__ = ["FUNCTIONAL", "group_position", "install", "time_functional_collectives"]
