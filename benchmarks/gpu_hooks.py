"""The cost of jdist's automatic-metric hooks on one CUDA rank, each part on its own (``bench_gpu.py``'s section 4).

Run by the benchmark as ``jdist run --gpus 1 --no-live benchmarks/gpu_hooks.py`` (and under torchrun, where only
the variants without jdist run). One process, ``benchmarks/ddp_plain.py``'s small model (MLP 64-256-256-10, batch
64, ``loss.item()`` every step: a launch-bound step), one ``DistributedDataParallel`` per variant built before the
timing, blocks of ``--per-block`` steps interleaved (the order rotated each block), the median over the blocks of
each block's median step:

* ``DDP, no hooks``: automatic metrics off (no hook of jdist's installed);
* ``DDP + torch's allreduce_hook``: the same with torch's own Python communication hook (what any Python comm
  hook costs);
* ``auto, DDP not timed, no loss``: the optimizer, backward and GradScaler hooks, records without a loss;
* ``auto, DDP not timed, loss copied per step``: each step's loss copied to the host on the training thread with
  an event after it (jdist's way until 2026-11-28);
* ``auto, DDP not timed``: the loss kept on the device and copied a batch at a time by the publisher thread;
* ``auto on``: all of them, the DDP timed by jdist's communication hook (what a script's own DDP gets).

Then the cost of one ``jdist.log(loss=<CUDA tensor>)`` both ways, and of the CUDA calls involved (µs a call,
the median of 5 x 2000). The last line is ``GPU_HOOKS_JSON {...}`` for the benchmark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from jdist.rank import auto_metrics, sources
from jdist.rank.session import current

#: label -> (automatic metrics on, the DDP built with them on (timed), torch's Python hook, the loss: "copy"
#: per step, True (jdist's), False (none))
VARIANTS: dict[str, tuple[bool, bool, bool, Any]] = {
    "DDP, no hooks": (False, False, False, True),
    "DDP + torch's allreduce_hook": (False, False, True, True),
    "auto, DDP not timed, no loss": (True, False, False, False),
    "auto, DDP not timed, loss copied per step": (True, False, False, "copy"),
    "auto, DDP not timed": (True, False, False, True),
    "auto on": (True, True, False, True),
}


def copied_per_step(roots: list[tuple[Any, float]], s: Any) -> list[tuple[str, Any, Any]]:
    """The loss as jdist took it until 2026-11-28: a non-blocking copy and an event on the training thread."""
    copies = [(t.detach().to("cpu", non_blocking=True), f) for t, f in roots]
    event = torch.cuda.Event()
    event.record()
    return [("loss", copies, event)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--per-block", type=int, default=200)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script on a CPU rank (gloo)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    s = current()  # None under torchrun
    variants = {k: v for k, v in VARIANTS.items() if (s is not None or not v[0]) and (cuda or v[3] != "copy")}
    ours = auto_metrics.loss_values

    def build(timed: bool, python_hook: bool) -> DistributedDataParallel:
        if s is not None:
            auto_metrics.disable(s)
            if timed:
                auto_metrics.enable(s)  # the DDP built now gets jdist's comm hook
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                  torch.nn.Linear(256, 10)).to(dev)
        model = DistributedDataParallel(net, device_ids=[0] if cuda else None)
        if python_hook:
            model.register_comm_hook(None, default_hooks.allreduce_hook)
        if s is not None:
            auto_metrics.disable(s)
        return model

    loops = {}
    for label, (_, timed, python_hook, _) in variants.items():
        model = build(timed, python_hook)
        loops[label] = (model, torch.optim.SGD(model.parameters(), lr=0.05))
    x, y = torch.randn(64, 64, 64, device=dev), torch.randint(0, 10, (64, 64), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def run(label: str, n: int) -> float:
        auto, _, _, loss = variants[label]
        model, opt = loops[label]
        if auto:
            steps = auto_metrics.enable(s)  # a new AutoSteps each block: the DDP built before is given to it
            if getattr(model, "_jdist_comm", None) is not None:
                model._jdist_comm.steps = steps  # (its hook's intervals end with the backward, as in a session)
            if not cuda and variants[label][1]:
                steps.time_by_reducer(model)  # (a CPU rank times its DDP by the reducer's clock)
            auto_metrics.loss_values = copied_per_step if loss == "copy" else ours if loss else (lambda r, s: None)
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            out = loss_fn(model(x[i % 64]), y[i % 64])
            out.backward()
            opt.step()
            out.item()
            times.append(time.perf_counter() - t0)
        if s is not None:
            s.end_cell()
            s.begin_cell()
            auto_metrics.disable(s)
        auto_metrics.loss_values = ours
        return statistics.median(times)

    for label in variants:  # warm-up (DDP rebuilds its buckets after the first step)
        run(label, 50)
    medians: dict[str, list[float]] = {label: [] for label in variants}
    labels = list(variants)
    for b in range(args.blocks):
        k = b % len(labels)
        for label in labels[k:] + labels[:k]:
            medians[label].append(run(label, args.per_block))
    res: dict[str, Any] = {"launcher": "jdist run" if s is not None else "torchrun",
                           "gpu": torch.cuda.get_device_name(0) if cuda else "none (a dry run on CPU)", "blocks": args.blocks, "per_block": args.per_block,
                           "step_us": {label: 1e6 * statistics.median(m) for label, m in medians.items()}}
    if s is not None and cuda:
        import jdist

        value = out_value = torch.ones((), device=dev)
        real = sources.on_default_stream

        def log_copied() -> None:
            sources.on_default_stream = lambda t: False  # the copy and event per call (until 2026-11-28)
            try:
                jdist.log(step=0, loss=value)
            finally:
                sources.on_default_stream = real

        def event() -> None:
            torch.cuda.Event(enable_timing=True).record()

        calls = {"jdist.log(loss=<CUDA tensor>)": lambda: jdist.log(step=0, loss=value),
                 "the same, copied per call (until 2026-11-28)": log_copied,
                 "CUDA event created and recorded": event,
                 "one-element .to('cpu', non_blocking=True)": lambda: out_value.to("cpu", non_blocking=True)}
        res["call_us"] = {}
        for name, fn in calls.items():
            runs = timeit.repeat(fn, number=2000, repeat=5)
            s.end_cell()
            s.begin_cell()
            res["call_us"][name] = statistics.median(runs) / 2000 * 1e6
    print("GPU_HOOKS_JSON " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
