"""PyTorch DistributedDataParallel: gloo on CPU ranks, NCCL on GPU ranks.

Communication time is measured by a DDP communication hook around the default
all-reduce (:func:`jdist.rank.auto_metrics.timed_comm_hook`): on CPU each gradient
bucket reports the wall-clock interval from the start of its all-reduce to the completion of
its future (with ``--auto-metrics on``: to the end of the backward pass, without a callback);
on GPU a pair of CUDA timing events brackets it (read lazily, so the hook never
synchronises). A hook the user registers afterwards runs inside it.
"""

from __future__ import annotations

from typing import Any

from ..auto_metrics import time_ddp
from .torch_group import TorchBackend


class DDPBackend(TorchBackend):
    """``--backend ddp``: wraps the model in ``DistributedDataParallel`` with a timing comm hook."""

    name = "ddp"

    def prepare_model(self, model: Any, **options: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ctx = self.require_ctx()
        if isinstance(model, DDP):
            return model
        model = model.to(ctx.device)
        device_ids = [ctx.device.index] if ctx.device_kind == "cuda" else None
        ddp = DDP(model, device_ids=device_ids, **options)
        if getattr(ddp, "_jdist_comm", None) is None:  # (--auto-metrics on times every DDP as it is built)
            assert self.timer is not None
            time_ddp(ddp, self.timer, ctx.device_kind)
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
