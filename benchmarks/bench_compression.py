"""When DDP's gradient compression pays off: the same training under ``jdist.prepare(model, compression=...)``
(none, fp16, bf16, PowerSGD rank 4) on 2 CPU ranks (gloo over loopback), at two model sizes.

Each variant is one ``jdist run -n 2`` of the same loop (an MLP of ``--layers`` square layers of ``--width``,
SGD, batch 32, fixed seeds; PowerSGD from step 5), the variants interleaved and their order rotated each
repeat. Per variant: rank 0's median step time and communication time (the records' ``step_time_s`` and
``comm_time_s``, warm-up steps left out; the communication time is on the steps DDP's reducer timed), the bytes
each step's all-reduces carried (``comm_bytes``) and their ratio to uncompressed DDP's, the final loss, and the
step time against uncompressed DDP's in the same repeat (median over repeats, with its range).

Usage::

    .venv/bin/python benchmarks/bench_compression.py [--repeats 3] [--steps 40] [--sizes 256,2048]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from jdist.metrics import list_runs, read_run

VARIANTS = ("none", "fp16", "bf16", "powersgd")
WARMUP = 8  # steps left out of the medians (and PowerSGD's plain steps: it starts at step 5)

LOOP = r'''
import sys, torch, torch.nn as nn, jdist
compression, width, layers, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())], nn.Linear(width, 1))
options = {} if compression == "none" else {"compression": compression}
if compression == "powersgd":
    options.update(powersgd_rank=4, powersgd_start_iter=5)
model = jdist.prepare(net, **options)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(jdist.rank.session().ctx.rank)
for step in range(steps):
    x = torch.randn(32, width, generator=g); y = x[:, :8].sum(1, keepdim=True) / 4
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
'''


def run(work: Path, compression: str, width: int, layers: int, steps: int) -> dict[str, float]:
    runs = work / f"runs-{compression}-{width}"
    env = {**os.environ, "JDIST_RUN_DIR": str(runs)}
    out = subprocess.run([sys.executable, "-m", "jdist", "run", "-n", "2", "--no-live", "loop.py", compression,
                          str(width), str(layers), str(steps)], cwd=work, env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{compression} at width {width} failed:\n{out.stdout}\n{out.stderr}")
    history = read_run(list_runs(runs)[0]).history
    rank0 = history[(history["rank"] == 0) & (history["step"] >= WARMUP)]
    for path in list_runs(runs):  # one run per variant and repeat
        for f in sorted(path.iterdir()):
            f.unlink()
        path.rmdir()
    timed = rank0["comm_time_s"].dropna()
    return {"step_ms": 1e3 * float(rank0["step_time_s"].median()),
            "comm_ms": 1e3 * float(timed.median()) if len(timed) else float("nan"),
            "bytes": float(rank0["comm_bytes"].median()), "loss": float(rank0["loss"].iloc[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--sizes", default="256,2048", help="widths, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "loop.py").write_text(LOOP)
        for width in (int(w) for w in args.sizes.split(",")):
            results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
            for repeat in range(args.repeats):
                order = VARIANTS[repeat % len(VARIANTS):] + VARIANTS[:repeat % len(VARIANTS)]
                for variant in order:
                    results[variant].append(run(work, variant, width, args.layers, args.steps))
            params = args.layers * (width * width + width) + width + 1
            print(f"\nwidth {width}, {args.layers} layers: {params:,} parameters ({4 * params / 2**20:.1f} MiB of "
                  f"float32 gradients), 2 CPU ranks, {args.repeats} repeats")
            print(f"{'variant':10} {'step ms':>9} {'comm ms':>9} {'bytes/step':>12} {'bytes vs none':>14} "
                  f"{'step vs none (range)':>22} {'final loss':>11}")
            base = results["none"]
            for variant in VARIANTS:
                rows = results[variant]
                ratios = [r["step_ms"] / b["step_ms"] for r, b in zip(rows, base)]
                step = statistics.median(r["step_ms"] for r in rows)
                comm = statistics.median(r["comm_ms"] for r in rows)
                sent = statistics.median(r["bytes"] for r in rows)
                print(f"{variant:10} {step:9.2f} {comm:9.2f} {sent:12,.0f} {sent / base[0]['bytes']:14.3f} "
                      f"{statistics.median(ratios):10.3f} ({min(ratios):.3f}-{max(ratios):.3f}) "
                      f"{statistics.median(r['loss'] for r in rows):11.5f}")


if __name__ == "__main__":
    main()
