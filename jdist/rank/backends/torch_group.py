"""The base of backends over torch.distributed's default process group (:class:`TorchBackend`),
and how that group is made, re-made after a release, and ended.

jdist's own backends (ddp, fsdp, horovod) derive from :class:`TorchBackend`; so can one of yours
(``from jdist.rank.backends import TorchBackend``): ``setup`` then gives your ranks jdist's group
(gloo on CPU ranks, NCCL on GPU ranks, nothing listening beyond loopback on one host), and a
group broken by a release is re-created for you (:meth:`TorchBackend.recreate_group`).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from .base import Backend, CommTimer, RankContext


class TorchBackend(Backend):
    """A backend over the default torch.distributed process group (gloo on CPU, NCCL on GPU)."""

    def __init__(self) -> None:
        self.ctx: RankContext | None = None
        self.timer: CommTimer | None = None

    @classmethod
    def pin_device(cls, world: Any, gpus: bool) -> Any:
        """``cuda:<local rank>`` with ``--gpus`` (an error naming the fix if this host has too few), else the CPU."""
        import torch

        if not gpus:
            return torch.device("cpu")
        visible = torch.cuda.device_count()
        if world.local_rank >= visible:
            raise RuntimeError(
                f"rank {world.rank} on {world.hostname} is local rank {world.local_rank} but only {visible} CUDA "
                f"device(s) are visible there; ask for fewer --gpus, or use -n {world.size} for CPU ranks."
            )
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)

    def save_state(self, path: Any, model: Any, optimizer: Any, meta: dict[str, Any]) -> None:
        """A model whose parameters are DTensors (the cell's own tensor parallel, FSDP + TP) or a pipeline
        stage's module: a folder of shards (:mod:`jdist.rank.mesh.checkpoint`); else the backend's default
        (rank 0, one file)."""
        from ..mesh.checkpoint import is_sharded, save_sharded

        if is_sharded(model):
            assert self.ctx is not None
            save_sharded(self.ctx.rank, path, model, optimizer, meta)
        else:
            super().save_state(path, model, optimizer, meta)

    def load_state(self, path: Any, model: Any, optimizer: Any) -> dict[str, Any]:
        from ..mesh.checkpoint import is_sharded, load_sharded

        if is_sharded(model):
            return load_sharded(path, model, optimizer)
        return super().load_state(path, model, optimizer)

    def setup(self, ctx: RankContext, timer: CommTimer) -> None:
        self.ctx = ctx
        self.timer = timer
        init_process_group(ctx)

    def environment(self, ctx: RankContext, cluster_id: str) -> None:
        """torchrun's environment (``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``...) and torch.distributed's calls made
        for scripts written for torchrun (:mod:`jdist.rank.torchrun`)."""
        from ..torchrun import install

        install(ctx, cluster_id)

    def auto_metric_hooks(self, steps: Any) -> list[Any]:
        """torch's hooks (:func:`jdist.rank.auto_metrics.torch_hooks`): optimizer steps, backward roots,
        ``GradScaler``, the script's ``DistributedDataParallel`` and ``torch.distributed`` collectives."""
        from ..auto_metrics import torch_hooks

        ctx = self.require_ctx()
        return torch_hooks(steps, self.timer, ctx.device_kind)

    def require_ctx(self) -> RankContext:
        if self.ctx is None:
            raise RuntimeError(f"The {self.name} backend is not set up on this rank; run %dist restart.")
        return self.ctx

    def recreate_group(self) -> Any:
        """A new default group on every rank after a release broke the old one (collective over MPI)."""
        return recreate_process_group(self.require_ctx())

    def teardown(self) -> None:
        destroy_process_group()
        self.ctx = None


def init_process_group(ctx: RankContext) -> None:
    """Initialise the default process group; nothing listens beyond loopback on one host.

    One host: a ``FileStore`` in the cluster's private folder (a new file per
    generation, so a re-created group never sees the old one's keys) and gloo pairs on
    the loopback interface. ``ctx.port`` (``--port``): a ``TCPStore`` on that port of
    rank 0's host. Several hosts: a ``TCPStore`` on a free port of rank 0's host,
    broadcast over MPI. gloo on CPU ranks, NCCL on CUDA ranks. The sockets the group
    opens are noted by the rank's guard (:meth:`jdist.rank.guard.Guard.break_group`).
    """
    import torch.distributed as dist

    from ..collectives import enable_flight_recorder
    from ..guard import socket_fds
    from ..torchrun import real_init_process_group

    if dist.is_initialized():
        return
    if ctx.single_host:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    enable_flight_recorder()  # (hang reports compare the ranks' newest collectives: jdist.rank.collectives)
    before = socket_fds()
    store: Any
    if ctx.port is None and ctx.single_host and ctx.work_dir:
        path = os.path.join(ctx.work_dir, f"store-{ctx.store_tag}{ctx.generation}")
        store = dist.FileStore(path, ctx.world_size)
    else:
        store = _tcp_store(ctx)
    kind = "nccl" if ctx.device_kind == "cuda" else "gloo"
    kwargs = {"device_id": ctx.device} if kind == "nccl" else {}
    real_init_process_group(kind, store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=ctx.timeout, **kwargs)
    ctx._store = store  # type: ignore[attr-defined]  # keep it alive as long as the group
    if ctx.guard is not None:
        ctx.guard.note_group_sockets(before)


def _tcp_store(ctx: RankContext) -> Any:
    import torch.distributed as dist

    store = None
    port = ctx.port or 0
    error = None
    if ctx.rank == 0:
        try:
            # torch's TCPStore listens on every interface whatever address it is given: a socket
            # bound to the chosen address, handed over, keeps it there
            listener = socket.create_server((ctx.master_addr, port), backlog=max(128, ctx.world_size))
            port = listener.getsockname()[1]
            store = dist.TCPStore(ctx.master_addr, port, ctx.world_size, True, timeout=ctx.timeout,
                                  wait_for_workers=False, master_listen_fd=listener.detach())
        except (RuntimeError, OSError) as exc:
            error = f"rank 0 could not listen on {ctx.master_addr}:{port} ({ctx.hostname}) for the process group ({exc})"
    port, error = ctx.comm.bcast((port, error), root=0)
    if error:
        raise RuntimeError(f"{error}. Choose another --port, or leave --port out.")
    if store is None:
        store = dist.TCPStore(ctx.master_addr, port, ctx.world_size, False, timeout=ctx.timeout)
    return store


def recreate_process_group(ctx: RankContext) -> Any:
    """Destroy the (broken) default group and make a new one on every rank; returns it. The groups beyond it
    (a device mesh's, ``new_group``'s) are made again under their names, and the objects that held the old
    ones hold the new ones (:mod:`jdist.rank.mesh.groups`; what it did: ``ctx.remade``).

    Collective over MPI, not over the old group, so it works when that group is broken.
    """
    import torch.distributed as dist

    from ..mesh import groups
    from ..torchrun import real_destroy_process_group

    kept = groups.snapshot()  # a mesh's groups and new_group's, made again under their names below
    if dist.is_initialized():
        try:
            real_destroy_process_group()
        except Exception:  # a broken group may complain while shutting down; it is gone either way
            pass
        forget_library_groups()
    old = ctx.generation
    ctx.generation += 1
    ctx.comm.Barrier()  # every rank has let go of the old group before the new one forms
    if ctx.rank == 0 and ctx.work_dir:
        try:
            os.unlink(os.path.join(ctx.work_dir, f"store-{ctx.store_tag}{old}"))
        except FileNotFoundError:
            pass
    init_process_group(ctx)
    from ..guard import socket_fds

    before = socket_fds()
    ctx.remade = groups.restore(kept)
    if ctx.guard is not None:
        ctx.guard.note_group_sockets(before, more=True)
    return dist.distributed_c10d._get_default_group()


def forget_library_groups() -> None:
    """Libraries that keep process groups for later drop them (each backend spec's ``forget_groups``, where
    that library is imported, whichever backend runs), once the default group is destroyed: every group made
    after it is gone with it, and a release broke their connections. A failure is one line: the library's
    next use may then fail."""
    import sys

    from jdist.plugins import backend_specs, load_object

    for spec in backend_specs().values():
        if spec.forget_groups and spec.imported():
            try:
                load_object(spec.forget_groups)()
            except Exception as exc:
                print(f"jdist: {spec.name}'s own process groups could not be dropped after the group was made "
                      f"again ({type(exc).__name__}: {exc}); if its next use hangs, run %dist restart.",
                      file=sys.stderr, flush=True)


def destroy_process_group() -> None:
    import torch.distributed as dist

    from ..torchrun import real_destroy_process_group

    if dist.is_initialized():
        real_destroy_process_group()
        forget_library_groups()

