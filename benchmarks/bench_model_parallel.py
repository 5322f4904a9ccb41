"""Model parallelism under ``jdist run`` against ``torchrun``, and what jdist's timing of it costs, in one run.

1. **Step time** of the same script (written to a temporary folder: it calls ``init_process_group("gloo")``
   and ``init_device_mesh`` itself, one torch thread per rank, batch 32) under ``torchrun --standalone`` and
   under ``jdist run`` with automatic metrics on (the default: every optimizer step a record, DTensor's
   functional collectives, FSDP's collectives and the pipeline's actions and sends timed), interleaved
   pairs, the order swapped each repeat; rank 0 times each step from the forward to after the optimizer step;
   the median of each run's median step, and jdist's ratio (target ≤ 1.03):

   * ``tp``: an MLP ``width -> 4 width -> width`` with ``ColwiseParallel`` / ``RowwiseParallel`` on a 1-D
     mesh of 2 ranks;
   * ``fsdp_tp``: the same MLP on a ``("dp", "tp")`` mesh of 4 ranks, ``fully_shard`` on ``dp``;
   * ``gpipe``: ``ScheduleGPipe``, a stage of two ``width x width`` layers per rank, 2 ranks, 4 micro-batches.

2. **Cost per timed operation**: jdist's own code around stand-ins that do nothing (a real collective on a
   one-rank gloo group takes 120-170 µs and varies by more than the hooks cost), in one process, hooks on
   against off in 40 interleaved pairs of blocks, the median of each pair's difference: a functional
   collective and its wait (:mod:`jdist.rank.mesh.timing`), and a pipeline action with its receive
   (:mod:`jdist.rank.mesh.pipeline`).

Usage::

    .venv/bin/python benchmarks/bench_model_parallel.py [--repeats 5] [--steps 200] [--json mp.json]

See docs/benchmarks.md for the figures of one run.
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

BIN = Path(sys.executable).parent
MARK = "@@STEP_MEDIAN_S@@"

SCRIPT = """import json, sys, time, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
mode, steps, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x = torch.randn(32, width)
if mode in ("tp", "fsdp_tp"):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    if mode == "tp":
        mesh = tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    else:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        tp = mesh["tp"]
    model = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))
    parallelize_module(model, tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if mode == "fsdp_tp":
        from torch.distributed.fsdp import fully_shard
        fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    def step():
        loss = model(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
else:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    block = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
    stage = PipelineStage(block, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=lambda out, y: out.pow(2).mean())
    opt = torch.optim.SGD(block.parameters(), lr=0.01)
    y = torch.zeros(32, width)
    def step():
        if rank == 0:
            schedule.step(x, target=y)
        else:
            schedule.step(target=y)
        opt.step(); opt.zero_grad()
for _ in range(10):
    step()
dist.barrier()
times = []
for _ in range(steps):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
if rank == 0:
    times.sort()
    print("@@STEP_MEDIAN_S@@", times[len(times) // 2], flush=True)
dist.barrier()
dist.destroy_process_group()
"""

#: mode -> (ranks, width): about 10 ms steps on the 2-core development machine
MODES = {"tp": (2, 384), "fsdp_tp": (4, 256), "gpipe": (2, 384)}


def command(kind: str, ranks: int, *args: str) -> list[str]:
    if kind == "torchrun":
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(ranks), "mp.py", *args]
    return [sys.executable, "-m", "jdist", "run", "-n", str(ranks), "--no-live", "mp.py", *args]


def step_median(kind: str, work: Path, mode: str, steps: int) -> float:
    ranks, width = MODES[mode]
    for attempt in (1, 2):
        out = subprocess.run(command(kind, ranks, mode, str(steps), str(width)), cwd=work, capture_output=True,
                             text=True, timeout=600)
        for line in out.stdout.splitlines():
            if MARK in line:
                return float(line.split(MARK, 1)[1])
        if attempt == 2 or "terminate called without an active exception" not in out.stderr:
            raise SystemExit(f"{kind} {mode} failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    raise AssertionError("unreachable")


COSTS = """import json, statistics, sys, time, torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.pipelining.schedules as schedules
import torch.distributed.pipelining.stage as stage_mod
from torch.distributed.device_mesh import init_device_mesh
from jdist.rank.mesh.dims import learn_meshes
from jdist.rank.mesh.timing import time_functional_collectives
from jdist.rank.mesh import pipeline as mp
from jdist.rank.session import local_session
blocks, per_block = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
learn_meshes()
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
# stand-ins that do nothing, under the names jdist wraps: what is timed is jdist's own code
class Pending:
    def __init__(self, elem):
        self.elem, self.completed = elem, False
out_tensor = torch.ones(16)
funcol.all_reduce = lambda t, op, group, tag="": Pending(out_tensor)
funcol.wait_tensor = lambda t: t
stage_mod._PipelineStageBase.forward_one_chunk = lambda self, i, *a, **k: None
schedules._batch_p2p = lambda ops, desc=None: [None]
schedules._wait_batch_p2p = lambda work: None
class Stage(stage_mod._PipelineStageBase):
    _create_grad_recv_info = _prepare_backward_infra = _prepare_forward_infra = None
    def __init__(self):
        self.stage_index = 0
stage = Stage()
t, group = torch.ones(16), (mesh, 0)
def collectives():
    start = time.perf_counter()
    for _ in range(per_block):
        funcol.wait_tensor(funcol.all_reduce(t, "sum", group).elem)
    return (time.perf_counter() - start) / per_block
ops = [type("Op", (), {"group": None})()]  # (a P2POp on the world group)
def actions():
    start = time.perf_counter()
    for i in range(per_block):  # an action and its receive, as a schedule runs them
        schedules._wait_batch_p2p(schedules._batch_p2p(ops))
        stage.forward_one_chunk(i)
    return (time.perf_counter() - start) / per_block
out = {"coll_off": [], "coll_on": [], "act_off": [], "act_on": []}
with local_session() as s:
    for b in range(blocks):
        for on in ((False, True) if b % 2 == 0 else (True, False)):
            undo = [time_functional_collectives(s.timer, "cpu"), mp.install(s, s.timer, "cpu")] if on else []
            if on:
                s.pipeline.depth = 1  # inside a schedule's step
            out["coll_on" if on else "coll_off"].append(collectives())
            out["act_on" if on else "act_off"].append(actions())
            for u in undo:
                u()
            s.timer.take_all()
medians = {k: statistics.median(v) for k, v in out.items()}
for kind in ("coll", "act"):  # each block's hooks-on time against the hooks-off block beside it
    medians[kind + "_delta"] = statistics.median(on - off for on, off in zip(out[kind + "_on"], out[kind + "_off"]))
print("@@COSTS@@", json.dumps(medians), flush=True)
dist.destroy_process_group()
"""


def costs(work: Path, blocks: int = 40, per_block: int = 500) -> dict[str, float]:
    (work / "costs.py").write_text(COSTS)
    out = subprocess.run([sys.executable, "costs.py", str(blocks), str(per_block)], cwd=work, capture_output=True,
                         text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("@@COSTS@@"):
            return json.loads(line.split(" ", 1)[1])
    raise SystemExit(f"the cost measurement failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows: dict[str, dict[str, list[float]]] = {mode: {"torchrun": [], "jdist": []} for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["JDIST_RUN_DIR"] = str(work / "runs")
        (work / "mp.py").write_text(SCRIPT)
        for i in range(args.repeats):
            for mode in MODES:
                for kind in (("torchrun", "jdist") if i % 2 == 0 else ("jdist", "torchrun")):
                    rows[mode][kind].append(step_median(kind, work, mode, args.steps))
            print(f"  repeat {i + 1}/{args.repeats} done", file=sys.stderr)
        cost = costs(work)
    print(f"\nmodel parallelism, jdist run (automatic metrics) vs torchrun, CPU ranks (gloo), median of "
          f"{args.repeats} interleaved pairs of {args.steps} steps\n")
    print(f"{'step time (ms)':<34} {'ranks':>5} {'torchrun':>9} {'jdist run':>10} {'ratio':>7}  target  ok")
    summary: dict[str, object] = {}
    for mode, (ranks, width) in MODES.items():
        t, j = statistics.median(rows[mode]["torchrun"]), statistics.median(rows[mode]["jdist"])
        ratio = j / t
        label = {"tp": f"TP, MLP {width}", "fsdp_tp": f"FSDP + TP (2x2), MLP {width}", "gpipe": f"GPipe, m=4, {width}"}[mode]
        print(f"{label:<34} {ranks:>5} {1e3 * t:>9.2f} {1e3 * j:>10.2f} {ratio:>7.3f}  ≤ 1.03  {'yes' if ratio <= 1.03 else 'NO'}")
        summary[mode] = {"torchrun_s": rows[mode]["torchrun"], "jdist_s": rows[mode]["jdist"], "ratio": ratio}
    coll, act = cost["coll_delta"] * 1e6, cost["act_delta"] * 1e6
    print("\njdist's own code per timed operation (around stand-ins that do nothing), one process, 40 interleaved "
          "pairs of blocks, the median of on minus off")
    print(f"  a functional collective and its wait: {coll:.2f} µs   (target ≤ 5 µs: a TP layer's collective on "
          f"CPU takes 100 µs or more)")
    print(f"  a pipeline action and its receive:    {act:.2f} µs   (target ≤ 5 µs)")
    summary["costs"] = {**cost, "per_collective_us": coll, "per_action_us": act}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
