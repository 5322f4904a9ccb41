"""Plain ``torchrun`` + DDP (gloo) baseline for ``bench_overhead.py``.

Run by the benchmark as::

    .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/ddp_plain.py --steps 220 --out times.json

The model, data and training loop (:func:`build`, :func:`train`) are also what the
benchmark's ``%%distributed`` cell runs (it loads this file with ``runpy``), so both
variants execute the same Python code; only the launcher and ``jdist.log`` differ.
Each rank times every step with ``time.perf_counter``; rank 0 gathers the per-rank
lists and writes them as JSON (``{"times": [[rank 0 ...], [rank 1 ...]], ...}``).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import torch
from torch import nn

IN_FEATURES, HIDDEN, CLASSES, BATCH = 64, 256, 10, 64
LR = 0.05


def build(rank: int, steps: int, seed: int = 0, device: str = "cpu", hidden: int = HIDDEN,
          batch: int = BATCH) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The MLP (64 -> hidden -> hidden -> 10, same initial weights on every rank) and ``steps`` batches.

    Each rank gets its own synthetic data (seed + 1 + rank), as with a sharded data set; model and
    data are on ``device`` (``benchmarks/bench_gpu.py`` passes ``"cuda"`` and larger sizes).
    """
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)
    )
    g = torch.Generator().manual_seed(seed + 1 + rank)
    x = torch.randn(steps, batch, IN_FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (steps, batch), generator=g)
    return model.to(device), x.to(device), y.to(device)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
          log: Callable[[int, float], Any] | None = None) -> tuple[list[float], float]:
    """SGD over the batches of ``x``/``y``; returns (per-step seconds, last loss).

    A step is timed from ``zero_grad`` to after ``loss.item()`` and ``log(step, loss)``
    (when given), so a logging call's cost is part of the step time.
    """
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    times: list[float] = []
    value = float("nan")
    for i in range(len(x)):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[i]), y[i])
        loss.backward()
        opt.step()
        value = loss.item()
        if log is not None:
            log(i, value)
        times.append(time.perf_counter() - t0)
    return times, value


def main() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=220, help="steps in total (warm-up included)")
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes the per-rank step times to")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, the local rank's GPU)")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help=f"hidden width (default {HIDDEN})")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"batch size (default {BATCH})")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    if cuda:
        import os
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, x, y = build(rank, args.steps, device="cuda" if cuda else "cpu", hidden=args.hidden, batch=args.batch)
    model = DDP(model)
    times, last_loss = train(model, x, y)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, {"times": times, "loss": last_loss, "threads": torch.get_num_threads()})
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"times": [g["times"] for g in gathered], "loss": [g["loss"] for g in gathered],
                       "threads": [g["threads"] for g in gathered]}, fh)
    # Tear down together, DDP first: a rank still tearing down gloo while its peer is gone
    # has been seen to abort ("terminate called without an active exception").
    del model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
