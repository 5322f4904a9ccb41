"""A backend of one's own whose engine owns accumulation: ``jdist.prepare`` returns the engine for
the model and the engine's optimizer for the optimizer (as DeepSpeed's ``initialize`` does).

The engine divides the loss by the accumulation count, sums or averages the gradients across
ranks itself (``--average sum|mean``, this backend's own option) and steps every K-th micro-step.
Nothing here imports torch at import time: the kernel reads :data:`ENGINE` without it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from jdist.options import ClusterConfig, Option, Scope
from jdist.plugins import BackendSpec
from jdist.rank.backends import TorchBackend
from jdist.rank.backends.base import Preparation

AVERAGE = Option("average", ("--average",), "How the engine reduces gradients across ranks: mean (default) or sum.",
                 Scope.RESTART, choices=("mean", "sum"), default="mean")


def check(config: ClusterConfig) -> None:
    if config.gpus:
        raise ValueError("--backend engine runs on CPU ranks only: use -n N instead of --gpus.")


ENGINE = BackendSpec("engine", "jdist_ext_backend:EngineBackend", help="an engine that owns accumulation",
                     backward_waits=False, options=(AVERAGE,), check=check)


@cache
def _classes() -> tuple[type, type]:
    import torch
    import torch.distributed as dist

    class Engine(torch.nn.Module):
        """The model inside an engine that owns backward, accumulation and the optimizer step."""

        def __init__(self, module: Any, optimizer: Any, grad_accum: int, average: str) -> None:
            super().__init__()
            self.module, self.optimizer, self.grad_accum, self.average = module, optimizer, grad_accum, average
            self.micro_steps = self.steps = 0

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.module(*args, **kwargs)

        def backward(self, loss: Any) -> None:
            (loss / self.grad_accum).backward()

        def step(self) -> None:
            self.micro_steps += 1
            if self.micro_steps % self.grad_accum:
                return  # gradients keep adding up
            for p in self.module.parameters():
                dist.all_reduce(p.grad)
                if self.average == "mean":
                    p.grad /= dist.get_world_size()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.steps += 1

    class EngineOptimizer(torch.optim.Optimizer):
        """The engine's view of the optimizer: its step is the engine's; zero_grad is the engine's too."""

        def __init__(self, engine: Any) -> None:  # no super().__init__: the torch optimizer's groups and state
            self.engine = engine
            self.param_groups = engine.optimizer.param_groups
            self.state = engine.optimizer.state
            self.defaults = engine.optimizer.defaults

        def step(self, closure: Any = None) -> None:
            self.engine.step()

        def zero_grad(self, set_to_none: bool = True) -> None:
            pass  # the engine zeroes at the end of each accumulation

    return Engine, EngineOptimizer


class EngineBackend(TorchBackend):
    name = "engine"
    owns_accumulation = True

    def prepare(self, p: Preparation) -> tuple[list[Any], list[Any]]:
        engine_cls, optimizer_cls = _classes()
        ctx = self.require_ctx()
        engines, optimizers = [], []
        for model in p.models:
            optimizer = next((opt for opt, m in p.optimizers if m is model), None)
            engines.append(engine_cls(model.to(ctx.device), optimizer, p.grad_accum, ctx.options["average"]))
        for opt, model in p.optimizers:
            engine = next(e for e in engines if e.module is model)
            optimizers.append(optimizer_cls(engine))
        self.engines = engines
        return engines, optimizers

    def prepare_model(self, model: Any, **options: Any) -> Any:
        raise TypeError("--backend engine prepares a model together with its optimizer: jdist.prepare(model, opt).")

    def backward(self, loss: Any, **kwargs: Any) -> None:
        self.engines[-1].backward(loss)
