"""What the troubleshooting measurements cost a training step: the data-wait timing (``data_time_s``: two clock
readings around every ``DataLoader`` iterator's ``__next__``) and c10d's Flight Recorder (the collectives'
sequence numbers, operations and sizes a mismatch report compares), each side by side with it off.

One process, one gloo rank pinned to one core, automatic metrics on (a rank session with its publisher thread,
records encoded as for the kernel), a DataLoader over an in-memory dataset (batch 32, no workers) feeding a DDP
MLP at about 1 ms and about 10 ms a step. Blocks of steps with the timing on and off are interleaved; the table
gives the median step of each, the paired difference (the median over the rounds of each round's on - off), and
the paired difference as a share of the step, beside the target (<= 1 % at ~10 ms steps).

The Flight Recorder is set when a process group is made (``TORCH_FR_BUFFER_SIZE``), so it is measured across
processes: the same DDP loop (and 2000 all-reduces of 10 floats) in a fresh one-rank process with
``TORCH_FR_BUFFER_SIZE=0`` and ``=64`` (jdist's), pinned to the same core, the two interleaved over ``--rounds``
rounds; the table gives the median of each and the median of the rounds' paired differences.

Usage::

    .venv/bin/python benchmarks/bench_troubleshooting.py [--blocks 30] [--per-block 200] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

TARGET_10MS = 0.01  # the data-wait timing's share of a ~10 ms step


def loop(width: int, blocks: int, per_block: int) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from jdist.rank import auto_metrics
    from jdist.rank.session import Publisher, local_session

    from bench_auto_metrics import Encoded  # (the rank channel that encodes without a kernel)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1)), batch_size=32, shuffle=True)
    plain = _BaseDataLoaderIter.__next__
    medians: dict[str, list[float]] = {"off": [], "on": []}
    with local_session(channel=Encoded()) as s:
        publisher = Publisher(s)
        auto_metrics.enable(s)
        timed = _BaseDataLoaderIter.__next__
        assert timed is not plain, "the data-wait timing is not installed"
        model = DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
            torch.nn.Linear(width, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        batches = iter(())
        for round_ in range(blocks):
            for label in (("off", "on") if round_ % 2 else ("on", "off")):
                _BaseDataLoaderIter.__next__ = timed if label == "on" else plain
                times = []
                for _ in range(per_block):
                    t = time.perf_counter()
                    try:
                        x, y = next(batches)
                    except StopIteration:
                        batches = iter(data)
                        x, y = next(batches)
                    loss = (model(x) - y).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    times.append(time.perf_counter() - t)
                times.sort()
                medians[label].append(times[len(times) // 2])
                s.end_cell()
                s.begin_cell()
        _BaseDataLoaderIter.__next__ = timed
        publisher.stop()
        auto_metrics.disable(s)
    assert _BaseDataLoaderIter.__next__ is plain
    paired = statistics.median(on - off for on, off in zip(medians["on"], medians["off"]))
    off = statistics.median(medians["off"])
    return {"off": off, "on": statistics.median(medians["on"]), "paired": paired, "share": paired / off}


#: One process's loop for the Flight Recorder's cost: argv width, steps; prints the median step and all-reduce (s).
FR_LOOP = r"""
import json, os, socket, statistics, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
width, steps = int(sys.argv[1]), int(sys.argv[2])
os.sched_setaffinity(0, {max(os.sched_getaffinity(0))}); torch.set_num_threads(1)
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)
times = []
for i in range(20 + steps):
    t = time.perf_counter()
    loss = (model(x) - y).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    times.append(time.perf_counter() - t)
small, reduces = torch.ones(10), []
for i in range(2000):
    t = time.perf_counter(); dist.all_reduce(small); reduces.append(time.perf_counter() - t)
print(json.dumps([statistics.median(times[20:]), statistics.median(reduces)]))
dist.destroy_process_group()
"""


def flight_recorder(width: int, steps: int, rounds: int) -> dict[str, Any]:
    got: dict[str, list[list[float]]] = {"0": [], "64": []}
    for round_ in range(rounds):
        for size in (("0", "64") if round_ % 2 else ("64", "0")):
            out = subprocess.run([sys.executable, "-c", FR_LOOP, str(width), str(steps)], capture_output=True,
                                 text=True, timeout=600, env={**os.environ, "TORCH_FR_BUFFER_SIZE": size}, check=True)
            got[size].append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {}
    for i, name in ((0, "step"), (1, "all_reduce")):
        off = [g[i] for g in got["0"]]
        on = [g[i] for g in got["64"]]
        paired = statistics.median(b - a for a, b in zip(off, on))
        result[name] = (statistics.median(off), statistics.median(on), paired, paired / statistics.median(off))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--per-block", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=10, help="process pairs per model for the Flight Recorder")
    ap.add_argument("--steps", type=int, default=300, help="steps per process for the Flight Recorder")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    from bench_auto_metrics import one_rank_group

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    one_rank_group()
    print(f"data-wait timing: one gloo rank on one core, DataLoader (batch 32) + DDP MLP, {args.blocks} rounds of "
          f"{args.per_block} steps on and off, interleaved\n")
    print(f"{'model':<24} {'off':>10} {'on':>10} {'paired':>10} {'share':>8}  target   ok")
    for width, label in ((128, "MLP width 128"), (1800, "MLP width 1800")):
        r = loop(width, args.blocks, args.per_block)
        target = f"<= {TARGET_10MS:.0%}" if width > 128 else ""
        ok = ("yes" if r["share"] <= TARGET_10MS else "NO") if target else ""
        print(f"{label:<24} {1e3 * r['off']:>7.3f} ms {1e3 * r['on']:>7.3f} ms {1e6 * r['paired']:>+7.1f} µs "
              f"{r['share']:>+7.2%}  {target:<7}  {ok}")
    dist.destroy_process_group()
    print(f"\nFlight Recorder (TORCH_FR_BUFFER_SIZE 0 against 64): one gloo rank on one core, a fresh process each, "
          f"{args.rounds} rounds of both, {args.steps} DDP steps and 2000 all-reduces of 10 floats each\n")
    print(f"{'model':<24} {'':<11} {'off':>10} {'on':>10} {'paired':>10} {'share':>8}  target   ok")
    for width, label in ((128, "MLP width 128"), (1800, "MLP width 1800")):
        fr = flight_recorder(width, args.steps, args.rounds)
        for name, (off, on, paired, share) in fr.items():
            target = f"<= {TARGET_10MS:.0%}" if width > 128 and name == "step" else ""
            ok = ("yes" if share <= TARGET_10MS else "NO") if target else ""
            print(f"{label if name == 'step' else '':<24} {name:<11} {1e6 * off:>7.1f} µs {1e6 * on:>7.1f} µs "
                  f"{1e6 * paired:>+7.2f} µs {share:>+7.2%}  {target:<7}  {ok}")


if __name__ == "__main__":
    main()
