"""The public rank API: what cell code calls on every rank (``jdist.prepare``, ``jdist.log``...).

``%%distributed`` cells run on ipyparallel engines launched under MPI; at start-up every
rank builds its :class:`~jdist.rank.session.RankSession` (:func:`jdist.rank.rpc.setup`) and
``rank``, ``world_size``, ``local_rank``, ``device`` and ``jdist`` are put into the cell
namespace. These functions work on that session.

Example (inside a ``%%distributed`` cell):
    >>> model = jdist.prepare(torch.nn.Linear(8, 1))          # doctest: +SKIP
    >>> jdist.progress(total_steps=100, batch_size=32)         # doctest: +SKIP
    >>> jdist.log(step=0, loss=0.7)                            # doctest: +SKIP

Outside a cluster they raise the error that says where to call them:
    >>> log(loss=1.0)
    Traceback (most recent call last):
    ...
    RuntimeError: jdist is not set up in this process. jdist.prepare/jdist.log run on the ranks: call them inside a %%distributed cell (after %load_ext jdist) or a script started with jdist run (jdist.log also under torchrun, srun or mpiexec).
"""

from __future__ import annotations

import time
from typing import Any

from jdist.metrics.records import reserved

from .session import describe_rank, session
from .sources import defer_device_value

#: Names jdist.log refuses (record keys, automatic metrics), read once: it is the hot path.
RESERVED = reserved()


def prepare(*objs: Any, batch_size: int | None = None, grad_accum: int | None = None, **options: Any) -> Any:
    """Prepare models, optimizers, LR schedulers and data loaders for the cluster's backend;
    return them in the order given (one object: returned alone).

    The same call works under every backend: ``ddp`` wraps the model in
    ``DistributedDataParallel``; ``fsdp`` shards it with ``fully_shard`` and points the
    optimizer at the shards; ``horovod`` broadcasts rank 0's parameters and makes the
    optimizer a ``DistributedOptimizer``. Optimizers come back as
    :class:`jdist.rank.training.PreparedOptimizer`, schedulers step only when the optimizer did,
    and a ``DataLoader`` comes back as a :class:`jdist.rank.data.ResumableLoader` whose batch
    size is used for samples/s. ``grad_accum=K``: one optimizer step per K micro-batches
    (gradient sync only on the K-th). Other ``options`` go to the backend's model wrapper
    (DDP: e.g. ``find_unused_parameters``, and gradient compression: ``compression="fp16"``,
    ``"bf16"`` or ``"powersgd"`` with ``powersgd_rank``, ``powersgd_start_iter``; FSDP: ``shard``,
    ``reshard_after_forward``, ``param_dtype``, ``reduce_dtype``, ``cpu_offload``) or, for Horovod, its
    optimizer (``compression="fp16"``).

    >>> model = jdist.prepare(nn.Linear(8, 1))                          # doctest: +SKIP
    >>> model, opt, loader = jdist.prepare(model, opt, loader, grad_accum=4)  # doctest: +SKIP
    """
    from . import training
    from .data import ResumableLoader

    s = session()
    if s.backend is None:
        raise RuntimeError("jdist.prepare needs a jdist cluster (%%distributed or jdist run); under another launcher "
                           "wrap the model yourself (e.g. DistributedDataParallel): jdist.log works there.")
    if not objs:
        raise TypeError("jdist.prepare needs at least one object, e.g. model = jdist.prepare(model)")
    if batch_size is not None:
        s.batch_size = int(batch_size)
    out = training.prepare(s, objs, grad_accum=grad_accum, **options)
    for obj in out:
        if isinstance(obj, ResumableLoader) and obj.batch_size is not None and s.batch_size is None:
            s.batch_size = int(obj.batch_size)
    return out[0] if len(out) == 1 else tuple(out)


def progress(total_steps: int | None = None, batch_size: int | None = None) -> None:
    """Tell the dashboard how many steps this cell will log (progress bar, ETA) and the batch size.

    >>> jdist.progress(total_steps=100, batch_size=64)   # doctest: +SKIP
    """
    s = session()
    if batch_size is not None:
        s.batch_size = int(batch_size)
    s.publish(s.stream.progress(int(total_steps) if total_steps is not None else s.stream.total_steps))


def log(step: int | None = None, *, batch_size: int | None = None, **scalars: Any) -> None:
    """Record named scalars for this step, plus the automatic metrics (see jdist.metrics.AUTO_METRICS).

    ``step`` defaults to the number of ``log`` calls so far in this cell. Values may be
    Python numbers or one-element tensors/arrays; a CUDA tensor is copied to the host without
    waiting for the GPU (no ``.item()`` sync) and its value sent once the copy has arrived.
    Cheap: it only queues the record; a background thread sends them in batches (every 0.25 s).

    >>> jdist.log(step=step, loss=loss.item(), acc=acc)   # doctest: +SKIP
    >>> jdist.log(step=step, loss=loss)   # a CUDA tensor: no sync  # doctest: +SKIP
    """
    s = session()
    stream = s.stream
    seq = stream.seq
    rec: dict[str, Any] = {
        "rank": s.ctx.rank,
        "cell": stream.cell,
        "seq": seq,
        "step": seq if step is None else (step if type(step) is int else _number("step", step)),
        "time": time.time(),
    }
    deferred = None
    for name, value in scalars.items():
        if name in RESERVED or name.startswith("comm_time_"):  # (comm_time_<dim>_s: a mesh dimension's)
            raise ValueError(f"jdist.log: {name!r} is a reserved metric name; log it under another name.")
        kind = type(value)
        if kind is float or kind is int:
            rec[name] = value
        elif getattr(getattr(value, "device", None), "type", None) == "cuda":
            if value.numel() != 1:
                _number(name, value)  # the error that says how to reduce it
            rec[name] = None  # filled in once the copy has arrived
            deferred = deferred or []
            deferred.append((name, *defer_device_value(value)))
        else:
            rec[name] = _number(name, value)
    if batch_size is not None:
        s.batch_size = int(batch_size)
    s.log(rec, deferred)


def info() -> dict[str, Any]:
    """This rank's rank, world size, local rank, host, pid, device and backend.

    >>> jdist.info()["rank"]   # doctest: +SKIP
    0
    """
    return dict(describe_rank(session()))


def precision() -> str:
    """The precision prepared models run their forward pass in (``--precision``).

    >>> jdist.precision()   # doctest: +SKIP
    'bf16'
    """
    return session().train.precision


def mesh() -> Any:
    """The ``--mesh`` device mesh of this rank (``mesh`` in the cells; a script run by ``jdist run --mesh``
    asks for it here), or None without ``--mesh``.

    >>> jdist.mesh()["tp"].size()   # doctest: +SKIP
    2
    """
    return session().mesh


def _number(name: str, value: Any) -> float | int:
    """``value`` as a Python number; TypeError with the fix otherwise.

    >>> _number("loss", 2.5)
    2.5
    """
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            raise TypeError(
                f"jdist.log: {name}= must be a scalar; got a {type(value).__name__} with more than one element. "
                f"Reduce it first, e.g. {name}={name}.mean().item()."
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"jdist.log: {name}= must be a number, got {type(value).__name__}: {value!r}")
    return value
