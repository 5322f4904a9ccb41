"""torch.distributed process-group set-up shared by the torch-based backends."""

from __future__ import annotations

from .base import Backend, CommTimer, RankContext


class TorchBackend(Backend):
    """A backend over the default torch.distributed process group (gloo on CPU, NCCL on GPU)."""

    def __init__(self) -> None:
        self.ctx: RankContext | None = None
        self.timer: CommTimer | None = None

    def setup(self, ctx: RankContext, timer: CommTimer) -> None:
        self.ctx = ctx
        self.timer = timer
        init_process_group(ctx)

    def require_ctx(self) -> RankContext:
        if self.ctx is None:
            raise RuntimeError(f"The {self.name} backend is not set up on this rank; run %dist restart.")
        return self.ctx

    def teardown(self) -> None:
        destroy_process_group()
        self.ctx = None


def init_process_group(ctx: RankContext) -> None:
    """Initialise the default process group over MPI-exchanged TCPStore coordinates.

    Rank 0 opens a TCPStore on a free port (port 0: the OS picks it, no race),
    broadcasts the port over MPI, and every rank joins with ``ctx.timeout``.
    gloo on CPU ranks, NCCL on CUDA ranks.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    store = None
    port = 0
    if ctx.rank == 0:
        store = dist.TCPStore(ctx.master_addr, 0, ctx.world_size, True, timeout=ctx.timeout, wait_for_workers=False)
        port = store.port
    port = ctx.comm.bcast(port, root=0)
    if store is None:
        store = dist.TCPStore(ctx.master_addr, port, ctx.world_size, False, timeout=ctx.timeout)
    kind = "nccl" if ctx.device_kind == "cuda" else "gloo"
    kwargs = {"device_id": ctx.device} if kind == "nccl" else {}
    dist.init_process_group(kind, store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=ctx.timeout, **kwargs)
    # keep the store alive as long as the group: rank 0 hosts it
    ctx._store = store  # type: ignore[attr-defined]


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
