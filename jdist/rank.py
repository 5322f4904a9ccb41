"""The rank-side runtime: what cell code calls on every rank.

``%%distributed`` cells run on ipyparallel engines launched under MPI. At start-up the
cluster calls :func:`setup` on every engine, which reads rank and world size from MPI,
pins the device, sets up the backend (torch process group...) and puts ``rank``,
``world_size``, ``local_rank``, ``device`` and ``jdist`` into the cell namespace.

In cells, :func:`prepare` wraps models for the backend and :func:`log` records named
scalars plus automatic metrics (step time, communication time, memory, samples/s).
Records are batched and published on the engine's signed IOPub channel at most every
``FLUSH_INTERVAL`` seconds, with per-cell sequence numbers; the rest go out when the
cell ends, together with the cell's record count, so the kernel can check that none
was lost and fetch any that were (:func:`records`).

Example (inside a ``%%distributed`` cell):
    >>> model = jdist.prepare(torch.nn.Linear(8, 1))          # doctest: +SKIP
    >>> jdist.progress(total_steps=100, batch_size=32)         # doctest: +SKIP
    >>> jdist.log(step=0, loss=0.7)                            # doctest: +SKIP
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from . import checkpoint
from .backends import Backend, CommTimer, RankContext, get_backend
from .metrics import RESERVED

#: Seconds between two publishes of pending records from a rank.
FLUSH_INTERVAL = 0.1
#: Records of a cell kept on the rank to re-send any the stream lost: the first
#: ``KEEP_FIRST`` (the stream can miss the start of a cell) and the latest ``KEEP_LAST``,
#: so a long cell does not grow the rank's memory without bound.
KEEP_FIRST = 10_000
KEEP_LAST = 100_000
#: Key under which records travel in ipyparallel data messages.
DATA_KEY = "jdist"

_PAGE = os.sysconf("SC_PAGE_SIZE")
_statm: int | None = None


@dataclass
class _State:
    ctx: RankContext | None = None
    backend: Backend | None = None
    backend_name: str = ""
    timer: CommTimer = field(default_factory=CommTimer)
    data_pub: Any = None
    cell: int = 0
    seq: int = 0
    first: list[dict[str, Any]] = field(default_factory=list)
    latest: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=KEEP_LAST))
    pending: list[dict[str, Any]] = field(default_factory=list)
    last_flush: float = 0.0
    t_last: float = 0.0
    batch_size: int | None = None
    total_steps: int | None = None
    forwards_seen: int = 0  # training forwards counted by jdist.training at the previous log


_state = _State()


def setup(config: dict[str, Any]) -> dict[str, Any]:
    """Initialise this engine as one rank (called by the cluster on every engine at once).

    ``config``: ``backend`` (name), ``gpus`` (bool), ``timeout`` (seconds, process
    group), ``threads`` (torch intra-op threads or None for cores / local ranks).
    Returns this rank's description (see :func:`info`).
    """
    from mpi4py import MPI

    import torch

    comm = MPI.COMM_WORLD
    rank, world_size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_world_size = local.Get_rank(), local.Get_size()
    hostname = socket.gethostname()
    hosts = comm.allgather(hostname)
    master_addr = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(hosts[0])

    if config.get("gpus"):
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            raise RuntimeError(
                f"rank {rank} on {hostname} is local rank {local_rank} but only {visible} CUDA device(s) "
                f"are visible there; ask for fewer --gpus, or use -n {world_size} for CPU ranks."
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        threads = config.get("threads") or max(1, (os.cpu_count() or 1) // local_world_size)
        torch.set_num_threads(threads)

    ctx = RankContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        hostname=hostname,
        device=device,
        master_addr=master_addr,
        timeout_s=float(config.get("timeout", 60)),
        comm=comm,
        work_dir=config.get("work_dir"),
        port=config.get("port"),
    )
    from . import guard

    guard.install(rank, config.get("work_dir"), ddp=config["backend"] == "ddp")
    backend = get_backend(config["backend"])()
    backend.setup(ctx, _state.timer)
    _state.ctx, _state.backend, _state.backend_name = ctx, backend, config["backend"]
    from . import training  # imports torch: ranks only

    training.configure(backend, config.get("precision") or "fp32")

    from IPython import get_ipython

    import jdist

    shell = get_ipython()
    if shell is not None:
        _state.data_pub = getattr(shell, "data_pub", None)
        shell.user_ns.update(
            rank=rank, world_size=world_size, local_rank=local_rank, device=device, jdist=jdist
        )
        _register_hooks(shell)
    if config.get("owner"):
        _watch_owner(config["owner"], rank == 0)
    return info()


def _watch_owner(owner: dict[str, Any], stop_controller: bool, interval: float = 1.0) -> None:
    """End this rank if the kernel that started the cluster is gone (killed, crashed).

    A kernel that exits normally stops its cluster; one that is SIGKILLed cannot. Then
    rank 0 also ends the controller, identified by PID and start time (never by name),
    and every rank exits, which ends the MPI job: nothing is left behind.
    """
    import threading

    import psutil

    if owner["host"] != socket.gethostname():
        return  # the kernel runs on another machine: its PID means nothing here

    def alive(pid: int, created: float | None = None) -> bool:
        try:
            proc = psutil.Process(pid)
            return proc.status() != psutil.STATUS_ZOMBIE and (created is None or abs(proc.create_time() - created) < 0.01)
        except psutil.NoSuchProcess:
            return False

    def watch() -> None:
        while alive(owner["pid"]):
            time.sleep(interval)
        pid, created = owner["controller"]
        if stop_controller and alive(pid, created):
            psutil.Process(pid).terminate()
        os._exit(0)

    threading.Thread(target=watch, name="jdist-owner-watch", daemon=True).start()


def _register_hooks(shell: Any) -> None:
    for event, fn in (("pre_run_cell", _pre_cell), ("post_run_cell", _post_cell)):
        if fn not in shell.events.callbacks[event]:
            shell.events.register(event, fn)


def info() -> dict[str, Any]:
    """This rank's rank, world size, local rank, host, pid, device and backend.

    >>> jdist.rank.info()["rank"]   # doctest: +SKIP
    0
    """
    ctx = _require_ctx()
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "host": ctx.hostname,
        "pid": os.getpid(),
        "device": str(ctx.device),
        "backend": _state.backend_name,
        "main_thread": threading.main_thread().ident,
    }


def _require_ctx() -> RankContext:
    if _state.ctx is None:
        raise RuntimeError(
            "jdist is not set up in this process. jdist.prepare/jdist.log run on the ranks: "
            "call them inside a %%distributed cell (after %load_ext jdist)."
        )
    return _state.ctx


def prepare(*objs: Any, batch_size: int | None = None, grad_accum: int | None = None, **options: Any) -> Any:
    """Prepare models, optimizers, LR schedulers and data loaders for the cluster's backend;
    return them in the order given (one object: returned alone).

    The same call works under every backend: ``ddp`` wraps the model in
    ``DistributedDataParallel``; ``fsdp`` shards it with ``fully_shard`` and points the
    optimizer at the shards; ``horovod`` broadcasts rank 0's parameters and makes the
    optimizer a ``DistributedOptimizer``. Optimizers come back as
    :class:`jdist.training.PreparedOptimizer`, schedulers step only when the optimizer did,
    and a ``DataLoader`` comes back as a :class:`jdist.data.ResumableLoader` whose batch
    size is used for samples/s. ``grad_accum=K``: one optimizer step per K micro-batches
    (gradient sync only on the K-th). Other ``options`` go to the backend's model wrapper
    (DDP: e.g. ``find_unused_parameters``; FSDP: ``shard``, ``reshard_after_forward``,
    ``param_dtype``, ``reduce_dtype``, ``cpu_offload``) or, for Horovod, its optimizer
    (``compression="fp16"``).

    >>> model = jdist.prepare(nn.Linear(8, 1))                          # doctest: +SKIP
    >>> model, opt, loader = jdist.prepare(model, opt, loader, grad_accum=4)  # doctest: +SKIP
    """
    from . import training

    _require_ctx()
    backend = _state.backend
    assert backend is not None and _state.ctx is not None
    if not objs:
        raise TypeError("jdist.prepare needs at least one object, e.g. model = jdist.prepare(model)")
    if batch_size is not None:
        _state.batch_size = int(batch_size)
    from .data import ResumableLoader

    out = training.prepare(backend, _state.ctx.device, objs, grad_accum=grad_accum, **options)
    for obj in out:
        if isinstance(obj, ResumableLoader) and obj.batch_size is not None and _state.batch_size is None:
            _state.batch_size = int(obj.batch_size)
    return out[0] if len(out) == 1 else tuple(out)


def progress(total_steps: int | None = None, batch_size: int | None = None) -> None:
    """Tell the dashboard how many steps this cell will log (progress bar, ETA) and the batch size.

    >>> jdist.progress(total_steps=100, batch_size=64)   # doctest: +SKIP
    """
    if total_steps is not None:
        _state.total_steps = int(total_steps)
    if batch_size is not None:
        _state.batch_size = int(batch_size)
    _publish({"cell": _state.cell, "total_steps": _state.total_steps, "batch_size": _state.batch_size})


def log(step: int | None = None, *, batch_size: int | None = None, **scalars: Any) -> None:
    """Record named scalars for this step, plus the automatic metrics (see jdist.metrics.AUTO_METRICS).

    ``step`` defaults to the number of ``log`` calls so far in this cell. Values may be
    Python numbers or one-element tensors/arrays. Cheap: records are batched and sent at
    most every ``FLUSH_INTERVAL`` seconds.

    >>> jdist.log(step=step, loss=loss.item(), acc=acc)   # doctest: +SKIP
    """
    now = time.perf_counter()
    st = _state
    ctx = _require_ctx()
    rec: dict[str, Any] = {
        "rank": ctx.rank,
        "cell": st.cell,
        "seq": st.seq,
        "step": st.seq if step is None else _number("step", step),
        "time": time.time(),
    }
    for name, value in scalars.items():
        if name in RESERVED:
            raise ValueError(f"jdist.log: {name!r} is a reserved metric name; log it under another name.")
        rec[name] = _number(name, value)
    step_time = now - st.t_last
    st.t_last = now
    comm_time = min(st.timer.take(), step_time)
    if batch_size is not None:
        st.batch_size = int(batch_size)
    train = _training()._train
    # batches since the previous log: one per training forward of a prepared model (several
    # with gradient accumulation or when logging every N steps), else one
    batches = max(1, train.forwards - st.forwards_seen)
    st.forwards_seen = train.forwards
    mem, peak = _memory(ctx)
    rec.update(
        step_time_s=step_time,
        comm_time_s=comm_time,
        compute_time_s=step_time - comm_time,
        mem_bytes=mem,
        mem_peak_bytes=peak,
        samples_per_s=(st.batch_size * batches / step_time) if st.batch_size and step_time > 0 else None,
        state_bytes=_training().state_bytes(),
    )
    st.seq += 1
    (st.first if len(st.first) < KEEP_FIRST else st.latest).append(rec)
    st.pending.append(rec)
    if now - st.last_flush >= FLUSH_INTERVAL:
        _flush()
    if checkpoint._auto is not None:
        checkpoint.on_log(rec["step"])


def _training() -> Any:
    from . import training  # after setup it is in sys.modules: cheap

    return training


def _number(name: str, value: Any) -> float | int:
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


def _memory(ctx: RankContext) -> tuple[int, int]:
    if ctx.device.type == "cuda":
        import torch

        return torch.cuda.memory_allocated(ctx.device), torch.cuda.max_memory_allocated(ctx.device)
    global _statm
    if _statm is None:
        _statm = os.open("/proc/self/statm", os.O_RDONLY)  # kept open: log() runs every step
    rss = int(os.pread(_statm, 128, 0).split()[1]) * _PAGE
    return rss, max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _publish(payload: dict[str, Any]) -> None:
    if _state.data_pub is not None:
        _state.data_pub.publish_data({DATA_KEY: payload})


def _flush() -> None:
    st = _state
    st.last_flush = time.perf_counter()
    if st.pending:
        batch, st.pending = st.pending, []
        _publish({"cell": st.cell, "records": batch})


def _pre_cell(info: Any = None) -> None:
    st = _state
    st.cell += 1
    st.seq = 0
    st.first = []
    st.latest = deque(maxlen=KEEP_LAST)
    st.pending = []
    st.total_steps = None
    if st.ctx is not None:
        st.forwards_seen = _training()._train.forwards
    st.timer.take()
    st.t_last = st.last_flush = time.perf_counter()
    if st.ctx is not None and st.ctx.device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(st.ctx.device)
    _publish({"cell": st.cell, "start": True})


def _post_cell(result: Any = None) -> None:
    st = _state
    batch, st.pending = st.pending, []
    _publish({"cell": st.cell, "records": batch, "done": st.seq, "total_steps": st.total_steps,
              "batch_size": st.batch_size})


def cell_count() -> tuple[int, int]:
    """(current cell id, records logged in it) on this rank."""
    return _state.cell, _state.seq


def records(cell: int, seqs: list[int]) -> list[dict[str, Any]]:
    """Records of the current cell with the given sequence numbers, as far as still kept
    (see ``KEEP_FIRST``/``KEEP_LAST``); the kernel's repair of the stream."""
    if cell != _state.cell:
        return []
    wanted = set(seqs)
    return [r for part in (_state.first, _state.latest) for r in part if r["seq"] in wanted]


def repair_group() -> dict[str, Any]:
    """Re-create the process group after a release broke it (all ranks at once, over MPI).

    Variables stay. DDP models are re-attached to the new group; models of other backends
    that hold the old group (FSDP's device mesh) are reported by name: prepare them again.
    Returns ``{"released_from", "reattached", "stale"}`` for the kernel's message.
    """
    from . import guard, training
    from .backends import _torch

    ctx = _require_ctx()
    released = guard.state()["released_from"]
    group = _torch.recreate_process_group(ctx)
    reattached, stale = [], []
    names = _names_in_namespace()
    for model in list(training._train.models):
        label = names.get(id(model), type(model).__name__)
        if hasattr(model, "_update_process_group"):  # DistributedDataParallel
            model._update_process_group(group)
            reattached.append(label)
        elif _state.backend_name == "fsdp":
            stale.append(label)
    return {"released_from": released, "reattached": sorted(reattached), "stale": sorted(stale)}


def _names_in_namespace() -> dict[int, str]:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return {}
    return {id(v): k for k, v in shell.user_ns.items() if not k.startswith("_")}


def teardown() -> None:
    """Release the backend on this rank (called by the cluster before it stops)."""
    checkpoint.checkpoint_every(None)
    if _state.backend is not None:
        _state.backend.teardown()
    _state.backend = None
