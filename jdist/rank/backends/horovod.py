"""Horovod on the same MPI-launched ranks: ``hvd.init(comm=MPI.COMM_WORLD)``.

The model is not wrapped (Horovod averages gradients in the optimizer): it is moved to
the rank's device and rank 0's parameters are broadcast. The optimizer becomes a
``hvd.DistributedOptimizer`` (its state broadcast from rank 0 too), with optional fp16
gradient compression (``jdist.prepare(..., compression="fp16")``) and accumulation
(``grad_accum=K`` becomes ``backward_passes_per_step=K``).

Communication time: each gradient all-reduce counts from the moment Horovod's hook
submits it until the training loop sees it finished (at ``synchronize()``, i.e. in
``optimizer.step()``): already finished all-reduces end when synchronize starts, the others
when it returns. Overlapping intervals count once, as for DDP.

Horovod is an optional extra (its last release builds only with extra flags); install
it with ``make horovod`` (``tools/build_horovod.sh``). The kernel checks that it is installed
before any rank starts (``jdist.backends.horovod.SPEC``).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from jdist.backends.horovod import INSTALL_HINT as HOROVOD_INSTALL_HINT

from .base import CommTimer, RankContext
from .torch_group import TorchBackend

#: Option names accepted by ``jdist.prepare(...)`` for the optimizer under ``--backend horovod``.
OPTIMIZER_OPTIONS = ("compression", "op", "gradient_predivide_factor")


class HorovodBackend(TorchBackend):
    """``--backend horovod``: Horovod's DistributedOptimizer over the MPI world of the engines."""

    name = "horovod"
    optimizer_options = OPTIMIZER_OPTIONS
    averages_in_optimizer = True

    def __init__(self) -> None:
        super().__init__()
        self.hvd: Any = None

    def setup(self, ctx: RankContext, timer: CommTimer) -> None:
        try:
            import horovod.torch as hvd
        except ImportError as exc:
            raise RuntimeError(f"{HOROVOD_INSTALL_HINT} (import failed: {exc})") from None
        hvd.init(comm=ctx.comm)
        if hvd.size() != ctx.world_size or hvd.rank() != ctx.rank:
            raise RuntimeError(
                f"Horovod sees rank {hvd.rank()} of {hvd.size()} but MPI says {ctx.rank} of {ctx.world_size}; "
                "Horovod must be built with MPI support (tools/build_horovod.sh sets HOROVOD_WITH_MPI=1)."
            )
        self.hvd = hvd
        # a torch.distributed group as well, so cell code written for ddp (dist.all_reduce of
        # metrics, DistributedSampler) runs unchanged
        super().setup(ctx, timer)

    def collectives_started(self) -> str | None:
        """The torch group's marker plus Horovod's newest outstanding handle (handles only grow)."""
        ops = sys.modules.get("horovod.torch.mpi_ops")
        try:
            newest = max(ops._handle_map, default=-1) if ops is not None else -1
        except RuntimeError:  # the map changed while read: a new operation, so progress
            return None
        return f"{super().collectives_started()},h{newest}"

    def auto_metric_hooks(self, steps: Any) -> list[Any]:
        """torch's hooks (a ``DistributedOptimizer`` is a ``torch.optim.Optimizer``: its steps are seen), and
        the communication of a ``hvd.DistributedOptimizer`` the script builds itself, timed as a prepared
        one's (:func:`_time_allreduces`: its gradient all-reduces, from submission until ``synchronize()``
        saw them finished). Not timed: the script's own ``hvd.allreduce``/``hvd.broadcast`` calls."""
        import horovod.torch as hvd

        from ..auto_metrics import patch

        timer = self.timer

        def make_factory(real: Any) -> Any:
            def DistributedOptimizer(*args: Any, **kwargs: Any) -> Any:
                opt = real(*args, **kwargs)
                _time_allreduces(opt, timer)
                return opt

            return DistributedOptimizer

        return [*super().auto_metric_hooks(steps), patch(hvd, "DistributedOptimizer", make_factory)]

    def prepare_model(self, model: Any, **options: Any) -> Any:
        ctx = self.require_ctx()
        if options:
            raise TypeError(
                f"jdist.prepare: --backend horovod does not wrap models, so model options "
                f"{', '.join(sorted(options))} do not apply; optimizer options: {', '.join(OPTIMIZER_OPTIONS)}."
            )
        model = model.to(ctx.device)
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model

    def prepare_optimizer(self, optimizer: Any, model: Any = None, **options: Any) -> Any:
        hvd = self.hvd
        if hvd is None:
            raise RuntimeError("The horovod backend is not set up on this rank; run %dist restart.")
        if getattr(optimizer, "_jdist_horovod", False):
            return optimizer
        grad_accum = int(options.pop("grad_accum", 1))
        compression = options.pop("compression", None)
        unknown = set(options) - set(OPTIMIZER_OPTIONS)
        if unknown:
            raise TypeError(
                f"jdist.prepare: unknown option(s) for --backend horovod: {', '.join(sorted(unknown))}. "
                f"Known: compression='fp16', grad_accum=K, {', '.join(OPTIMIZER_OPTIONS[1:])}."
            )
        if compression in (None, "none"):
            comp = hvd.Compression.none
        elif compression == "fp16":
            comp = hvd.Compression.fp16
        else:
            raise ValueError(f"compression={compression!r}: use compression='fp16' or leave it out.")
        named = list(model.named_parameters()) if model is not None else None
        dist_opt = hvd.DistributedOptimizer(
            optimizer, named_parameters=named, compression=comp, backward_passes_per_step=grad_accum, **options
        )
        _time_allreduces(dist_opt, self.timer)
        hvd.broadcast_optimizer_state(dist_opt, root_rank=0)
        dist_opt._jdist_horovod = True
        return dist_opt

    def synchronize(self, optimizer: Any) -> None:
        if not getattr(optimizer, "_jdist_synced", False):
            optimizer.synchronize()
            optimizer._jdist_synced = True

    def step_context(self, optimizer: Any) -> Any:
        import contextlib

        if getattr(optimizer, "_jdist_synced", False):
            optimizer._jdist_synced = False
            return optimizer.skip_synchronize()
        return contextlib.nullcontext()

    def teardown(self) -> None:
        if self.hvd is not None and self.hvd.is_initialized():
            self.hvd.shutdown()
        super().teardown()


def _time_allreduces(optimizer: Any, timer: CommTimer | None) -> None:
    """Record every gradient all-reduce of a DistributedOptimizer into ``timer`` (see module doc)."""
    if timer is None or getattr(optimizer, "_jdist_timed", False):
        return
    optimizer._jdist_timed = True
    from horovod.torch.mpi_ops import poll

    pending: list[tuple[Any, float]] = []
    submit = optimizer._allreduce_grad_async
    sync = optimizer.synchronize

    def allreduce_grad_async(p: Any) -> Any:
        out = submit(p)
        pending.append((out[0], time.perf_counter()))
        return out

    def synchronize() -> None:
        entered = time.perf_counter()
        finished = {id(h) for h, _ in pending if h is not None and not callable(h) and poll(h)}
        sync()
        done = time.perf_counter()
        for handle, start in pending:
            timer.record(start, entered if id(handle) in finished else done)
        pending.clear()

    optimizer._allreduce_grad_async = allreduce_grad_async
    optimizer.synchronize = synchronize
