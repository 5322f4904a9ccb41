"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and
optimizer state sharded across ranks. gloo on CPU ranks, NCCL on GPU ranks.

:meth:`FSDPBackend.prepare_model` shards every "block" of the model on its own (so
only one block is gathered at a time) and then the root. The default policy picks the
children of ``nn.Sequential`` and ``nn.ModuleList`` containers that hold parameters, and
PyTorch's transformer layers; pass ``shard=`` (a predicate or module classes) to choose.
Communication time covers FSDP's all-gathers and reduce-scatters: each is issued through
a timing wrapper (``set_custom_all_gather`` / ``set_custom_reduce_scatter``).

Example (on a rank, inside ``%%distributed --backend fsdp``):
    >>> model, opt = jdist.prepare(model, torch.optim.AdamW(model.parameters()))  # doctest: +SKIP
    >>> model = jdist.prepare(model, shard=[MyBlock], reshard_after_forward=False)  # doctest: +SKIP
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

from ..mesh.checkpoint import load_sharded, save_sharded
from ..mesh.dims import DIMS
from .base import TIMING, CommTimer, timed_call
from .torch_group import TorchBackend

#: Option names accepted by ``jdist.prepare(model, ...)`` under ``--backend fsdp``.
MODEL_OPTIONS = ("shard", "reshard_after_forward", "param_dtype", "reduce_dtype", "cpu_offload")


def default_shard_policy(module: Any) -> list[Any]:
    """The submodules to shard on their own, innermost last: blocks of Sequential/ModuleList
    containers and ``nn.Transformer*Layer`` modules (the root is always sharded too).

    >>> import torch.nn as nn
    >>> m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> [type(b).__name__ for b in default_shard_policy(m)]
    ['Linear', 'Linear']
    """
    import torch.nn as nn

    layers = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
    picked: list[Any] = []
    seen: set[int] = set()

    def has_params(m: Any) -> bool:
        return any(True for _ in m.parameters())

    def visit(m: Any) -> None:
        for child in m.children():
            if id(child) in seen:
                continue
            if isinstance(child, layers) or (isinstance(m, (nn.Sequential, nn.ModuleList)) and has_params(child)):
                seen.add(id(child))
                picked.append(child)
                if isinstance(child, layers):
                    continue  # a transformer layer is one unit
            visit(child)

    visit(module)
    return picked


def _select(module: Any, shard: Any) -> list[Any]:
    if shard is None:
        return default_shard_policy(module)
    if isinstance(shard, type) or (isinstance(shard, (list, tuple)) and all(isinstance(s, type) for s in shard)):
        classes = tuple(shard) if isinstance(shard, (list, tuple)) else (shard,)
        return [m for m in module.modules() if m is not module and isinstance(m, classes)]
    if callable(shard):
        return [m for m in module.modules() if m is not module and shard(m)]
    raise TypeError(
        "jdist.prepare(model, shard=...) takes module classes (e.g. shard=[Block]) or a predicate "
        "(e.g. shard=lambda m: isinstance(m, Block)); leave it out for the default policy."
    )


class FSDPBackend(TorchBackend):
    """``--backend fsdp``: shards the model with FSDP2 ``fully_shard`` and times its collectives."""

    name = "fsdp"
    checkpoint_layout = "dir"

    def __init__(self) -> None:
        super().__init__()
        #: prepared model -> {id of a parameter fully_shard replaced: its sharded parameter}
        self._remaps: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()

    def prepare_model(self, model: Any, **options: Any) -> Any:
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

        if "compression" in options:
            raise ValueError(f"compression={options['compression']!r} compresses DDP's and Horovod's gradient "
                             "all-reduces; FSDP reduces gradients in reduce_dtype: jdist.prepare(model, "
                             "reduce_dtype=torch.bfloat16), or --backend ddp with compression.")
        ctx = self.require_ctx()
        if isinstance(model, FSDPModule):
            return model
        unknown = set(options) - set(MODEL_OPTIONS)
        if unknown:
            raise TypeError(
                f"jdist.prepare: unknown option(s) for --backend fsdp: {', '.join(sorted(unknown))}. "
                f"Known: {', '.join(MODEL_OPTIONS)}."
            )
        kwargs: dict[str, Any] = {"mesh": self.mesh()}
        if "reshard_after_forward" in options:
            kwargs["reshard_after_forward"] = options["reshard_after_forward"]
        if options.get("param_dtype") is not None or options.get("reduce_dtype") is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=_dtype(options.get("param_dtype")), reduce_dtype=_dtype(options.get("reduce_dtype"))
            )
        if options.get("cpu_offload"):
            if ctx.device_kind != "cuda":
                raise ValueError(
                    "jdist.prepare(model, cpu_offload=True) offloads GPU ranks' shards to host memory; "
                    "these ranks already run on the CPU. Drop cpu_offload, or start the cluster with --gpus N."
                )
            kwargs["offload_policy"] = CPUOffloadPolicy()
        model = model.to(ctx.device)
        names = {id(p): n for n, p in model.named_parameters()}
        blocks = _select(model, options.get("shard"))
        for block in blocks:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        all_gather, reduce_scatter = _timed_comm_classes()
        for module in [*blocks, model]:
            module.set_custom_all_gather(all_gather(self.timer, ctx.device_kind))
            module.set_custom_reduce_scatter(reduce_scatter(self.timer, ctx.device_kind))
        # fully_shard replaced the parameters: remember old -> new for prepare_optimizer and param_ids
        sharded = dict(model.named_parameters())
        self._remaps[model] = {pid: sharded[n] for pid, n in names.items() if n in sharded}
        return model

    def param_ids(self, model: Any) -> set[int]:
        """The sharded parameters and the ones they replaced (an optimizer made before
        ``jdist.prepare`` holds those)."""
        return super().param_ids(model) | set(self._remaps.get(model, {}))

    def tensor_bytes(self, tensor: Any) -> int:
        """A DTensor's local shard."""
        return super().tensor_bytes(tensor.to_local() if hasattr(tensor, "to_local") else tensor)

    def mesh(self) -> Any:
        """A 1-D mesh of all ranks over jdist's process group, on this rank's device type.

        Always passed to ``fully_shard``: its default mesh is a CUDA mesh whenever CUDA exists,
        which breaks CPU ranks on a GPU machine ("Expected all tensors to be on the same device").
        """
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh.from_group(dist.distributed_c10d._get_default_group(), self.require_ctx().device_kind)

    def prepare_optimizer(self, optimizer: Any, model: Any = None, **options: Any) -> Any:
        """Point the optimizer at the sharded parameters (fully_shard replaces them)."""
        from torch.distributed.tensor import DTensor

        params = [p for g in optimizer.param_groups for p in g["params"]]
        if all(isinstance(p, DTensor) for p in params):
            return optimizer  # built on the sharded model already
        remap = self._remaps.get(model) if model is not None else None
        if remap is None or any(id(p) not in remap for p in params):
            raise ValueError(
                "Under --backend fsdp the optimizer must hold the sharded parameters: prepare it together "
                "with its model, model, opt = jdist.prepare(model, opt), or create it after "
                "model = jdist.prepare(model)."
            )
        if optimizer.state:
            raise ValueError(
                "This optimizer has already taken steps; its state belongs to the unsharded parameters. "
                "Create the optimizer fresh and prepare it with the model: model, opt = jdist.prepare(model, opt)."
            )
        for group in optimizer.param_groups:
            group["params"] = [remap[id(p)] for p in group["params"]]
        return optimizer

    def set_gradient_sync(self, model: Any, sync: bool) -> None:
        model.set_requires_gradient_sync(sync)

    def clip_grad_norm_(self, model: Any, max_norm: float, norm_type: float = 2.0) -> float:
        import torch

        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def grad_scaler(self) -> Any:
        # Every rank sees only its shard of the gradients: the inf/nan check must be
        # all-reduced, or ranks would disagree on skipping a step.
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        assert self.ctx is not None
        return ShardedGradScaler(self.ctx.device.type)

    def save_state(self, path: Path, model: Any, optimizer: Any, meta: dict[str, Any]) -> None:
        """Every rank writes its shards with ``torch.distributed.checkpoint`` into the folder ``path``;
        rank 0 adds ``jdist.pt`` with ``meta`` (:mod:`jdist.rank.mesh.checkpoint`)."""
        assert self.ctx is not None
        save_sharded(self.ctx.rank, path, model, optimizer, meta)

    def load_state(self, path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
        return load_sharded(path, model, optimizer)

    def reattach(self, model: Any, group: Any) -> bool | None:
        # the re-made groups replaced the old ones in FSDP's mesh info (jdist.rank.mesh.groups.restore); a model
        # that still holds an old group must be prepared again
        from ..mesh.groups import fsdp_groups_live

        return fsdp_groups_live(model)


def _dtype(value: Any) -> Any:
    import torch

    if value is None or isinstance(value, torch.dtype):
        return value
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}
    try:
        return names[str(value)]
    except KeyError:
        raise ValueError(f"Unknown dtype {value!r}; use 'bf16', 'fp16' or 'fp32' (or a torch.dtype).") from None


_COMM_CLASSES: tuple[type, type] | None = None


def _timed_comm_classes() -> tuple[type, type]:
    """FSDP's default all-gather / reduce-scatter with timing (made on first use: torch is
    imported on the ranks only)."""
    global _COMM_CLASSES
    if _COMM_CLASSES is not None:
        return _COMM_CLASSES
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class TimedAllGather(DefaultAllGather):
        def __init__(self, timer: CommTimer | None, kind: str) -> None:
            self.timer, self.kind = timer, kind

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
            call = super().__call__
            if self.timer is not None and not TIMING[0]:  # (the records' comm_bytes)
                self.timer.sent(input_tensor.numel() * input_tensor.element_size())
            return timed_call(self.timer, self.kind, lambda: call(output_tensor, input_tensor, group, async_op), async_op,
                              DIMS.of(group) if DIMS.order else None)

    class TimedReduceScatter(DefaultReduceScatter):
        def __init__(self, timer: CommTimer | None, kind: str) -> None:
            self.timer, self.kind = timer, kind

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False) -> Any:
            call = super().__call__
            if self.timer is not None and not TIMING[0]:
                self.timer.sent(input_tensor.numel() * input_tensor.element_size())
            return timed_call(self.timer, self.kind, lambda: call(output_tensor, input_tensor, group, op, async_op),
                              async_op, DIMS.of(group) if DIMS.order else None)

    _COMM_CLASSES = (TimedAllGather, TimedReduceScatter)
    return _COMM_CLASSES
