"""``--framework tf`` against the same TensorFlow training under plain ``mpiexec``, side by side in one run.

Both train the same Keras MLP (``benchmarks/tf_plain.py``: 2 hidden layers of ``--width``, SGD, batch 64
of 4096 samples, ``--epochs`` epochs) with ``model.fit`` under ``MultiWorkerMirroredStrategy`` on 2 CPU
ranks, with the same TF_CONFIG (loopback, free ports), threads (cores / ranks) and communication
options. jdist's ranks also run ``jdist.keras.Callback()`` (a record per batch to the kernel): the
product's hot path.

1. **step time**: each batch's wall time on each rank after the first epoch (tracing and warm-up),
   median per rank, the slower rank's; target: jdist <= 1.03x plain.
2. **cold start**: until every rank has its strategy: jdist's ``ClusterSession.start`` of a
   ``--framework tf`` cluster (MPI launch, the controller, engines registering, TF imported, TF_CONFIG
   and the strategy) against plain ``mpiexec`` from its launch until every rank made its strategy.
``--repeats`` runs of each, interleaved; medians.

Usage::

    .venv/bin/python benchmarks/bench_tf.py [--repeats 3] [--width 256] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jdist.kernel.cluster import ClusterSession
from jdist.kernel.launch.mpi import mpiexec_path
from jdist.options import ClusterConfig
from jdist.plugins import backend_spec

TF = backend_spec("tf")

RANKS = 2
LOOP = Path(__file__).with_name("tf_plain.py")
CELL = """
import runpy
lib = runpy.run_path({loop!r})
model, ds = lib["build"](tf, strategy, {width})
bench = lib["train"](tf, model, ds, {epochs}, [jdist.keras.Callback()])
"""


def steps_per_epoch() -> int:
    import math

    from tf_plain import BATCH, SAMPLES  # noqa: E402

    return math.ceil(SAMPLES / BATCH)


def slower_median(per_rank: list[list[float]], warmup: int) -> float:
    return max(statistics.median(times[warmup:]) for times in per_rank)


def run_jdist(width: int, epochs: int) -> dict[str, Any]:
    cluster = ClusterSession(ClusterConfig(n=RANKS, backend="tf", timeout=120))
    t0 = time.time()
    cluster.start(lambda msg: None)
    cold = time.time() - t0
    try:
        cluster.execute(CELL.format(loop=str(LOOP), width=width, epochs=epochs)).get(timeout=900)
        return {"cold_s": cold, "times": cluster.pull("bench")}
    finally:
        cluster.stop()


def run_plain(width: int, epochs: int, workdir: Path) -> dict[str, Any]:
    out = workdir / "times.json"
    out.unlink(missing_ok=True)
    t0 = time.time()
    proc = subprocess.run([mpiexec_path(), "-n", str(RANKS), sys.executable, str(LOOP), "--out", str(out),
                           "--width", str(width), "--epochs", str(epochs)], capture_output=True, text=True, cwd=workdir,
                          env={**os.environ, "PYTHONPATH": ""})
    if not out.exists():
        sys.exit(f"plain mpiexec failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    res = json.loads(out.read_text())
    return {"cold_s": res["ready_at"] - t0, "times": res["times"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    missing = TF.unavailable()  # looked for, not imported: only the ranks need TensorFlow
    if missing:
        sys.exit(f"bench_tf: {missing}")
    sys.path.insert(0, str(LOOP.parent))
    warmup = steps_per_epoch()
    res: dict[str, list[dict[str, Any]]] = {"plain": [], "jdist": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name in ("plain", "jdist") if i % 2 == 0 else ("jdist", "plain"):
                print(f"[{i + 1}/{args.repeats}] {name}...", flush=True)
                res[name].append(run_plain(args.width, args.epochs, Path(tmp)) if name == "plain"
                                 else run_jdist(args.width, args.epochs))
    step = {k: statistics.median(slower_median(r["times"], warmup) for r in v) for k, v in res.items()}
    cold = {k: statistics.median(r["cold_s"] for r in v) for k, v in res.items()}
    print(f"\nTensorFlow MultiWorkerMirroredStrategy, 2 CPU ranks, model.fit of a {args.width}-wide MLP, "
          f"{args.epochs} epochs of {warmup} batches (the first left out); {args.repeats} runs each, medians")
    print(f"   {'':<40}{'plain mpiexec':>15}{'jdist':>12}{'ratio':>8}  target")
    print(f"   {'step time, slower rank (ms)':<40}{step['plain'] * 1e3:15.2f}{step['jdist'] * 1e3:12.2f}"
          f"{step['jdist'] / step['plain']:7.3f}x  <= 1.03x: {'met' if step['jdist'] <= 1.03 * step['plain'] else 'MISSED'}")
    print(f"   {'cold start, to every strategy made (s)':<40}{cold['plain']:15.2f}{cold['jdist']:12.2f}"
          f"{cold['jdist'] / cold['plain']:7.2f}x  -")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
