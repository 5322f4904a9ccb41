"""PyTorch DistributedDataParallel: gloo on CPU ranks, NCCL on GPU ranks.

Communication time is measured by a DDP communication hook around the default
all-reduce: on CPU each gradient bucket reports the wall-clock interval from the
start of its all-reduce to the completion of its future; on GPU a pair of CUDA
timing events brackets it (read lazily, so the hook never synchronises).
"""

from __future__ import annotations

import time
from typing import Any, Callable

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
        ddp.register_comm_hook(state=None, hook=self._timed_allreduce_hook())
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

    def _timed_allreduce_hook(self) -> Callable[[Any, Any], Any]:
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        timer = self.timer
        assert timer is not None and self.ctx is not None
        if self.ctx.device_kind == "cuda":

            def cuda_hook(state, bucket):  # no annotations: DDP checks them at run time
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                fut = allreduce_hook(None, bucket)

                def done(f: Any) -> Any:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()  # on the stream the result is ready on
                    timer.record_cuda(start, end)
                    return f.value()

                return fut.then(done)

            return cuda_hook

        def cpu_hook(state, bucket):  # no annotations: DDP checks them at run time
            start = time.perf_counter()
            fut = allreduce_hook(None, bucket)

            def done(f: Any) -> Any:
                timer.record(start, time.perf_counter())
                return f.value()

            return fut.then(done)

        return cpu_hook
