"""The three backends side by side on the same model, ranks and data (2 CPU ranks, gloo/MPI).

For each backend (ddp, fsdp, horovod) a 2-rank jdist cluster trains the same MLP
(``--width`` hidden units, 4 layers, AdamW, batch 32, synthetic data, fixed seed) with the
same rank code (``jdist.prepare`` / ``jdist.backward`` / ``opt.step``) and reports, per rank,
median step time, median communication time (the ``comm_time_s`` jdist measures), the
``state_bytes`` the rank holds (parameters + gradients + optimizer state) and its peak RSS.
Clusters run one after the other; the order is rotated each repeat.

Usage::

    .venv/bin/python benchmarks/bench_backends.py [--width 1024] [--steps 60] [--warmup 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from jdist.kernel.cluster import ClusterSession
from jdist.options import ClusterConfig
from jdist.plugins import HOROVOD

CODE = r"""
import time, torch, torch.nn as nn
torch.manual_seed(0)
W = {width}
model = nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W), nn.ReLU(), nn.Linear(W, 10))
model, opt = jdist.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
g = torch.Generator().manual_seed(rank)
xs, ys = torch.randn(8, 32, W, generator=g), torch.randint(0, 10, (8, 32), generator=g)
step_t, comm_t = [], []
jdist.rank.session().timer.take()
for i in range({steps}):
    t0 = time.perf_counter()
    loss = nn.functional.cross_entropy(model(xs[i % 8]), ys[i % 8])
    jdist.backward(loss); opt.step(); opt.zero_grad()
    step_t.append(time.perf_counter() - t0); comm_t.append(jdist.rank.session().timer.take())
import resource
bench = dict(step=step_t[{warmup}:], comm=comm_t[{warmup}:], state=jdist.rank.sources.state_bytes(jdist.rank.session()),
             rss_peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def run_backend(backend: str, width: int, steps: int, warmup: int) -> list[dict]:
    cluster = ClusterSession(ClusterConfig(n=2, backend=backend, timeout=120))
    cluster.start(lambda msg: None)
    try:
        ar = cluster.execute(CODE.format(width=width, steps=steps, warmup=warmup))
        ar.get(timeout=600)
        return cluster.pull("bench")
    finally:
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="jdist-bench-ipython-"))
    backends = ["ddp", "fsdp"] + (["horovod"] if HOROVOD.unavailable() is None else [])
    if "horovod" not in backends:
        print("horovod: not installed (make horovod); left out", file=sys.stderr)
    n_params = 3 * (args.width * args.width + args.width) + args.width * 10 + 10
    print(f"model: 4-layer MLP, width {args.width}, {n_params / 1e6:.1f} M parameters; 2 CPU ranks; "
          f"{args.steps} steps ({args.warmup} warm-up) x {args.repeats} repeats")
    results: dict[str, list[list[dict]]] = {b: [] for b in backends}
    t0 = time.perf_counter()
    for rep in range(args.repeats):
        order = backends[rep % len(backends):] + backends[:rep % len(backends)]
        for b in order:
            results[b].append(run_backend(b, args.width, args.steps, args.warmup))
    ms = 1e3
    rows = []
    for b in backends:
        step = [s for rep in results[b] for r in rep for s in r["step"]]
        comm = [c for rep in results[b] for r in rep for c in r["comm"]]
        state = max(r["state"] for rep in results[b] for r in rep)
        rss = max(r["rss_peak"] for rep in results[b] for r in rep)
        rows.append((b, statistics.median(step) * ms, statistics.median(comm) * ms, state / 2**20, rss / 2**20))
    ddp_state = rows[0][3]
    print(f"\n{'backend':<9} {'step ms':>8} {'comm ms':>8} {'comm %':>7} {'state MiB/rank':>15} {'vs ddp':>7} "
          f"{'peak RSS MiB':>13}")
    for b, step, comm, state, rss in rows:
        print(f"{b:<9} {step:8.1f} {comm:8.1f} {100 * comm / step:6.0f}% {state:15.1f} {state / ddp_state:7.2f} "
              f"{rss:13.0f}")
    print(f"\n(medians over ranks, steps and repeats; {time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
