"""Plain ``torchrun`` + ``deepspeed.initialize`` (DeepSpeed's documented way) baseline for
``bench_backends.py``.

Run by the benchmark as::

    .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/deepspeed_plain.py \\
        --config config.json --width 1024 --steps 60 --out times.json

The model, data and training loop (:func:`build`, :func:`train`) are also what the benchmark's
``%%distributed --backend deepspeed`` cell runs (it loads this file with ``runpy``), and the
DeepSpeed config is the one jdist built in that cell (``jdist.deepspeed_config()``): only the
launcher, the wrapping (``jdist.prepare``/``jdist.backward`` against ``engine.backward``/
``engine.step``) and ``jdist.log`` differ. Rank 0 writes every rank's step times as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import torch
from torch import nn

BATCH, CLASSES, BATCHES = 32, 10, 8


def build(rank: int, width: int, seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A 4-layer MLP of ``width`` hidden units (same initial weights on every rank) and this rank's
    8 batches of 32 (seed + rank, as with a sharded data set). One torch thread per rank."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    w = width
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, CLASSES))
    g = torch.Generator().manual_seed(seed + 1 + rank)
    return model, torch.randn(BATCHES, BATCH, w, generator=g), torch.randint(0, CLASSES, (BATCHES, BATCH), generator=g)


def train(model: Any, x: torch.Tensor, y: torch.Tensor, steps: int, backward: Callable[[Any], Any],
          step: Callable[[], Any], log: Callable[[Any], Any] | None = None) -> list[float]:
    """``steps`` steps over the batches; per-step seconds, timed from the forward to after
    ``loss.item()`` and ``log(loss)`` (so a logging call's cost is part of the step)."""
    times: list[float] = []
    for i in range(steps):
        t0 = time.perf_counter()
        out = model(x[i % len(x)])
        loss = nn.functional.cross_entropy(out.float(), y[i % len(y)])
        backward(loss)
        step()
        loss.item()
        if log is not None:
            log(loss)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    import deepspeed
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="JSON file with the DeepSpeed config")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes the per-rank step times to")
    args = parser.parse_args()
    with open(args.config) as fh:
        config = json.load(fh)

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, x, y = build(rank, args.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    if config.get("bf16", {}).get("enabled"):
        x = x.bfloat16()
    times = train(engine, x, y, args.steps, engine.backward, engine.step)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, times)
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"times": gathered}, fh)
    engine.destroy()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
