"""What a resize costs: ``%dist resize`` against what a user does without it, on CPU ranks, ~100 MB of state.

Drives two real Jupyter kernels (the test suite's driver) with ``%load_ext jdist``, one per way, in turns. The state: a DDP (or, with
``--backend fsdp``, FSDP2) MLP of about 8.4 M float32 parameters with AdamW after one step, so parameters plus
AdamW's two moments are about 100 MB. Each repeat, in turns:

* **resize**: ``%dist resize -n 4`` from 2 ranks, then back with ``-n 2``; its own parts as it reports them
  (snapshot, stop, start, replay, load);
* **by hand**: what gives the same result without it: ``jdist.save_checkpoint`` of model and optimizer (the
  same backend layout: one file under DDP, ``torch.distributed.checkpoint`` shards under FSDP2),
  ``%%distributed -n 4 --restart`` (new ranks), the set-up cell again, ``jdist.load_checkpoint``; each part
  timed from the kernel (the cell's round trip), the set-up cell as the replay.

The table prints the medians (and ranges) per part and in all, and the ratio resize / by hand (target: not
slower, <= 1.0). By hand carries less: no loader position, no plain variables, no learning-rate rescaling.

Usage::

    .venv/bin/python benchmarks/bench_resize.py [--repeats 3] [--backend ddp|fsdp]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import KernelSession  # noqa: E402  (the test suite's real-kernel driver)

SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1024))
model = jdist.prepare(net)
opt = jdist.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3))
"""
STEP = """
x = torch.randn(8, 1024)
loss = model(x).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
state_mb = sum(p.numel() for p in net.parameters()) * 4 * 3 / 1e6
"""
PARTS = ("snapshot", "stop", "start", "replay", "load")


def timed(k: KernelSession, code: str, timeout: float = 300) -> float:
    t0 = time.perf_counter()
    k.run(code, timeout=timeout)
    return time.perf_counter() - t0


def resize(k: KernelSession, n: int) -> dict[str, float]:
    t0 = time.perf_counter()
    out = k.run(f"%dist resize -n {n}", timeout=600)
    total = time.perf_counter() - t0
    m = re.search(r"Resized \d+ -> \d+ ranks in [\d.]+ s \((.*?)\)\.", out.stdout)
    if not m:
        raise SystemExit(f"no resize report:\n{out.stdout}")
    parts = {name: float(sec) for name, sec in re.findall(r"(\w+) ([\d.]+) s", m.group(1))}
    return {**parts, "total": total}


def by_hand(k: KernelSession, n: int, backend: str, folder: str) -> dict[str, float]:
    save = timed(k, f"%%distributed\njdist.save_checkpoint({folder!r}, model=model, optimizer=opt)")
    start = timed(k, f"%%distributed -n {n} --backend {backend} --restart\nimport torch")
    replay = timed(k, "%%distributed\n" + SETUP)
    load = timed(k, f"%%distributed\njdist.load_checkpoint({folder!r}, model=model, optimizer=opt)")
    return {"snapshot": save, "start": start, "replay": replay, "load": load,
            "total": save + start + replay + load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", default="ddp", choices=("ddp", "fsdp"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jdist-bench-resize-"))
    env = {**os.environ, "JDIST_RUN_DIR": str(work / "runs")}
    # one kernel resizes, the other does it by hand (its save and load cells would be replayed by a resize)
    kernels = {"resize": KernelSession(env), "by hand": KernelSession(env)}
    for k in kernels.values():
        k.run("%load_ext jdist")
        k.run(f"%%distributed -n 2 --backend {args.backend}\n" + SETUP, timeout=300)
        k.run("%%distributed\n" + STEP)
    k = kernels["resize"]
    k.run("%dist pull state_mb --rank 0")
    state_mb = k.value("state_mb")
    rows: dict[str, list[dict[str, float]]] = {"resize": [], "by hand": []}
    try:
        for i in range(args.repeats):
            for n in (4, 2):
                rows["resize"].append(resize(kernels["resize"], n))
                rows["by hand"].append(by_hand(kernels["by hand"], n, args.backend, str(work / f"hand-{i}-{n}")))
                for k in kernels.values():
                    k.run("%%distributed\n" + STEP)
    finally:
        for k in kernels.values():
            k.run("%dist stop", allow_error=True)
            k.shutdown()
    print(f"\nresize 2 <-> 4 CPU ranks, --backend {args.backend}, {state_mb:.0f} MB of state (parameters + AdamW), "
          f"{len(rows['resize'])} resizes each way (median, range in s):")
    print(f"{'part':<10} {'resize':>20} {'by hand':>20}")
    for part in (*PARTS, "total"):
        cells = []
        for kind in ("resize", "by hand"):
            values = [r[part] for r in rows[kind] if part in r]
            cells.append(f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})" if values else "-")
        print(f"{part:<10} {cells[0]:>20} {cells[1]:>20}")
    ratios = [a["total"] / b["total"] for a, b in zip(rows["resize"], rows["by hand"])]
    print(f"\nresize / by hand, paired: median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-"
          f"{max(ratios):.2f}); target <= 1.0 (not slower). By hand, 'start' is stop + start "
          "(%%distributed --restart) and 'snapshot' the save.")


if __name__ == "__main__":
    main()
