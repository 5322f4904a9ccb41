"""PyTorch DistributedDataParallel: gloo on CPU ranks, NCCL on GPU ranks.

Communication time is measured by a DDP communication hook around the default
all-reduce (:func:`jdist.rank.auto_metrics.timed_comm_hook`): on CPU each gradient
bucket reports the wall-clock interval from the start of its all-reduce to the completion of
its future (with ``--auto-metrics on``: to the end of the backward pass, without a callback);
on GPU a pair of CUDA timing events brackets it (read lazily, so the hook never
synchronises). A hook the user registers afterwards runs inside it.

Gradient compression (``jdist.prepare(model, compression=...)``) is torch's own communication hooks, run
inside that timing: ``"fp16"`` and ``"bf16"`` cast each bucket for its all-reduce (half the bytes), and
``"powersgd"`` is PowerSGD (``powersgd_rank``: the approximation's rank, 1 by default; ``powersgd_start_iter``:
plain all-reduces until that step, 10 by default; error feedback and warm start on). All three run on gloo
(CPU ranks; tested) as torch's hooks do on NCCL (not run here without a GPU).
"""

from __future__ import annotations

from typing import Any

from ..auto_metrics import time_ddp
from .torch_group import TorchBackend


class DDPBackend(TorchBackend):
    """``--backend ddp``: wraps the model in ``DistributedDataParallel`` with a timing comm hook."""

    name = "ddp"

    def prepare_model(self, model: Any, compression: str | None = None, **options: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel as DDP

        hook = compression_hook(compression, options)  # (bad values: one line, before anything is built)
        ctx = self.require_ctx()
        if isinstance(model, DDP):  # the code's own, as it is (compressed if asked)
            ddp = model
        else:
            device_ids = [ctx.device.index] if ctx.device_kind == "cuda" else None
            ddp = DDP(model.to(ctx.device), device_ids=device_ids, **options)
            if getattr(ddp, "_jdist_comm", None) is None:  # (--auto-metrics on times every DDP as it is built)
                assert self.timer is not None
                time_ddp(ddp, self.timer, ctx.device_kind)
        if hook is not None:
            ddp.register_comm_hook(*hook)  # inside jdist's timing hook where it has one, else timed by the reducer
        return ddp

    def set_gradient_sync(self, model: Any, sync: bool) -> None:
        # What DDP.no_sync() does; DDP reads the flag in forward, so it must be set before it.
        model.require_backward_grad_sync = sync

    def unwrap(self, model: Any) -> Any:
        return getattr(model, "module", model)

    def reattach(self, model: Any, group: Any) -> bool | None:
        if hasattr(model, "_update_process_group"):  # a DistributedDataParallel
            model._update_process_group(group)
            return True
        return None


#: ``jdist.prepare(model, compression=...)`` under ``--backend ddp``.
COMPRESSIONS = ("fp16", "bf16", "powersgd")
POWERSGD_OPTIONS = ("powersgd_rank", "powersgd_start_iter")


def compression_hook(compression: str | None, options: dict[str, Any]) -> tuple[Any, Any] | None:
    """The ``(state, hook)`` for DDP's ``register_comm_hook`` that ``compression`` names (None: none), taking the
    PowerSGD options out of ``options``.

    >>> compression_hook(None, {})
    >>> compression_hook("fp16", {})[1].__name__
    'fp16_compress_hook'
    >>> state, hook = compression_hook("powersgd", {"powersgd_rank": 2})
    >>> hook.__name__, state.matrix_approximation_rank, state.start_powerSGD_iter
    ('powerSGD_hook', 2, 10)
    >>> compression_hook("int8", {})
    Traceback (most recent call last):
    ValueError: compression='int8': --backend ddp compresses gradients with 'fp16', 'bf16' or 'powersgd' (or leave it out).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    given = {k: options.pop(k) for k in POWERSGD_OPTIONS if k in options}
    if compression in (None, "none"):
        if given:
            raise ValueError(f"{', '.join(given)}: PowerSGD's options; add compression='powersgd'.")
        return None
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression={compression!r}: --backend ddp compresses gradients with 'fp16', 'bf16' or "
                         "'powersgd' (or leave it out).")
    if compression != "powersgd":
        if given:
            raise ValueError(f"{', '.join(given)}: PowerSGD's options, not {compression}'s; use compression='powersgd'.")
        return None, default_hooks.fp16_compress_hook if compression == "fp16" else default_hooks.bf16_compress_hook
    rank, start = int(given.get("powersgd_rank", 1)), int(given.get("powersgd_start_iter", 10))
    if rank < 1 or start < 2:
        raise ValueError(f"powersgd_rank={rank}, powersgd_start_iter={start}: the rank is >= 1 and the first "
                         "compressed step >= 2 (PowerSGD's error feedback needs plain all-reduces first).")
    # process_group None: the default group at each call (the one jdist re-creates after a release)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=start,
                                   use_error_feedback=True, warm_start=True, random_seed=0)
    return state, powersgd.powerSGD_hook
