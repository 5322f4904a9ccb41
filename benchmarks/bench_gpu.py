"""What does jdist cost per training step on one CUDA GPU, against a plain process and torchrun?

Measured side by side in one run, on one GPU (``--gpus 1``, NCCL), for two model sizes (the loop of
``benchmarks/ddp_plain.py`` on CUDA: MLP 64 -> hidden -> hidden -> 10, SGD, synthetic data on the GPU,
``loss.item()`` every step, so each step ends synchronised):

1. Per-step time of the same loop (a) in one plain Python process, no process group, (b) under
   ``torchrun --nproc_per_node 1`` with DDP over NCCL, (c) as a ``%%distributed --gpus 1`` cell in a real
   Jupyter kernel with ``jdist.log`` every step, (d) the same without ``jdist.log``. Variants are interleaved
   ``--repeats`` times, the order rotated each repeat; warm-up steps are dropped.
2. One ``jdist.log(step=, loss=<CUDA tensor>)`` call on the rank (the tensor is not synchronised: the
   value is read by the publisher thread).
3. Cold start of the first ``%%distributed --gpus 1`` cell in a fresh kernel.
4. The automatic metrics' hooks, each part on its own, in one rank (``benchmarks/gpu_hooks.py`` under
   ``jdist run --gpus 1``, and its variants without jdist under torchrun): the small model's step with no hook,
   with torch's own Python comm hook, with jdist's hooks without and with the loss and the DDP timing;
   and one ``jdist.log(loss=<CUDA tensor>)``.

Usage (needs a CUDA GPU)::

    python benchmarks/bench_gpu.py [--steps 300] [--warmup 30] [--repeats 3] [--json results.json]
    python benchmarks/bench_gpu.py --hooks-only [--hook-blocks 10]
    python benchmarks/bench_gpu.py --hooks-only --device cpu     (a dry run of section 4 on a CPU rank)

Figures of one run are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import PLAIN_SCRIPT, SETUP_CELL, Kernel, machine, spread, step_summary, torchrun_cmd  # noqa: E402

#: name -> (hidden width, batch): a launch-bound step and a compute-bound one (~3 ms on an H100).
SIZES = {"small": (256, 64), "large": (4096, 2048)}
VARIANTS = ["plain", "torchrun", "jdist_log", "jdist_nolog"]
LABELS = {
    "plain": "one process, no process group",
    "torchrun": "torchrun + DDP (NCCL)",
    "jdist_log": "%%distributed --gpus 1 + jdist.log",
    "jdist_nolog": "%%distributed --gpus 1, no jdist.log",
}
TARGETS = {"step_ratio": 1.03, "log_call_us": 10.0, "cold_start_s": 6.0, "hooks_added_us": 30.0}
HOOKS_SCRIPT = Path(__file__).resolve().parent / "gpu_hooks.py"

PLAIN_CODE = """
import json, sys, torch
sys.path.insert(0, {dir!r})
import ddp_plain
torch.cuda.set_device(0)
m, x, y = ddp_plain.build(0, {total}, device="cuda", hidden={hidden}, batch={batch})
times, loss = ddp_plain.train(m, x, y)
print(json.dumps({{"times": [times], "loss": [loss]}}))
"""

RANK_CODE = """
import importlib.util as _ilu, torch
_spec = _ilu.spec_from_file_location("jdist_bench_loop", {path!r})
_bench = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
_model, _x, _y = _bench.build(rank, {total}, device="cuda", hidden={hidden}, batch={batch})
_model = jdist.prepare(_model)
_times, _loss = _bench.train(_model, _x, _y, log={log})
bench_out = {{"times": _times, "loss": _loss, "device": str(next(_model.parameters()).device)}}
del _model, _x, _y
"""

TRAIN_CELL = """
_t0 = time.perf_counter()
get_ipython().run_cell_magic("distributed", "", {code!r})
_wall = time.perf_counter() - _t0
get_ipython().run_line_magic("dist", "pull bench_out")
_emit(times=[o["times"] for o in bench_out], loss=[o["loss"] for o in bench_out],
      device=bench_out[0]["device"], wall_s=_wall)
"""

LOG_COST_CELL = """
get_ipython().run_cell_magic("distributed", "", '''
import time, torch
_t = torch.ones((), device="cuda")
_runs = []
for _r in range(5):
    _t0 = time.perf_counter()
    for _i in range(2000):
        jdist.log(step=_i, loss=_t)
    _runs.append((time.perf_counter() - _t0) / 2000 * 1e6)
bench_out = _runs
''')
get_ipython().run_line_magic("dist", "pull bench_out")
_emit(log_call_us=bench_out[0])
"""

COLD_CELL = """
_t0 = time.perf_counter()
get_ipython().run_cell_magic("distributed", "--gpus 1", "pass")
_emit(cold_start_s=time.perf_counter() - _t0)
"""


def run_plain(total: int, hidden: int, batch: int) -> dict[str, Any]:
    code = PLAIN_CODE.format(dir=str(PLAIN_SCRIPT.parent), total=total, hidden=hidden, batch=batch)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the plain run failed (exit {proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_torchrun(total: int, hidden: int, batch: int, workdir: Path) -> dict[str, Any]:
    out = workdir / "torchrun.json"
    out.unlink(missing_ok=True)
    cmd = torchrun_cmd() + ["--standalone", "--nproc_per_node", "1", str(PLAIN_SCRIPT), "--steps", str(total),
                            "--out", str(out), "--device", "cuda", "--hidden", str(hidden), "--batch", str(batch)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
    if not out.exists():
        sys.exit(f"torchrun failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def run_jdist(kernel: Kernel, total: int, hidden: int, batch: int, log: bool) -> dict[str, Any]:
    code = RANK_CODE.format(path=str(PLAIN_SCRIPT), total=total, hidden=hidden, batch=batch,
                            log="lambda i, v: jdist.log(step=i, loss=v)" if log else "None")
    rec, _ = kernel.run_one(TRAIN_CELL.format(code=code))
    if rec["device"] != "cuda:0":
        sys.exit(f"the jdist rank trained on {rec['device']}, not cuda:0")
    return rec


def run_hooks(blocks: int, device: str, workdir: Path) -> dict[str, dict[str, Any]]:
    """Section 4: ``gpu_hooks.py`` under ``jdist run --gpus 1`` and under torchrun; their GPU_HOOKS_JSON."""
    args = [str(HOOKS_SCRIPT), "--blocks", str(blocks), "--device", device]
    gpus = ["--gpus", "1"] if device == "cuda" else ["-n", "1"]
    out = {}
    for name, cmd in (("jdist run", [sys.executable, "-m", "jdist", "run", *gpus, "--no-live", *args]),
                      ("torchrun", torchrun_cmd() + ["--standalone", "--nproc_per_node", "1", *args])):
        print(f"section 4: gpu_hooks.py under {name}...", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, timeout=600, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("GPU_HOOKS_JSON ")]
        if proc.returncode != 0 or not lines:
            sys.exit(f"gpu_hooks.py under {name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                     f"{proc.stderr[-3000:]}")
        out[name] = json.loads(lines[-1].split(" ", 1)[1])
    return out


def report_hooks(hooks: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    """Print section 4; its target rows."""
    ours, plain = hooks["jdist run"], hooks["torchrun"]
    st = ours["step_us"]
    base = st["DDP, no hooks"]
    print(f"4. The hooks' own cost in one rank (gpu_hooks.py, {ours['gpu']}): small model, {ours['blocks']} blocks of "
          f"{ours['per_block']} steps interleaved, median step (µs)")
    print(f"   {'variant':<46}{'jdist run':>11}{'added':>9}{'torchrun':>11}")
    for label, us in st.items():
        other = plain["step_us"].get(label)
        print(f"   {label:<46}{us:11.1f}{us - base:+9.1f}{'' if other is None else f'{other:11.1f}'}")
    for name, us in ours.get("call_us", {}).items():
        print(f"   one call: {name:<44}{us:8.2f} µs")
    rows = []
    for label in ("auto, DDP not timed", "auto on"):
        added = st[label] - base
        rows.append((f"step added by the hooks (section 4): {label}", f"{added:+.1f} us",
                     f"<= {TARGETS['hooks_added_us']:.0f} us", added <= TARGETS["hooks_added_us"]))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up steps dropped (default 30)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant and size (default 3)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernelspec (default python3)")
    parser.add_argument("--json", metavar="PATH", help="also write all figures to this JSON file")
    parser.add_argument("--hooks-only", action="store_true", help="section 4 alone")
    parser.add_argument("--hook-blocks", type=int, default=10, help="section 4's blocks per variant (default 10)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a dry run of section 4 (--hooks-only) on a CPU rank; its figures are no GPU's")
    args = parser.parse_args(argv)
    import torch

    if args.hooks_only:
        if args.device == "cuda" and not torch.cuda.is_available():
            sys.exit("bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu: a dry run")
        hooks = run_hooks(args.hook_blocks, args.device, Path(tempfile.mkdtemp(prefix="jdist-bench-gpu-")))
        rows = report_hooks(hooks)
        print("\nTargets beside this run's figures:")
        for name, measured, target, met in rows:
            print(f"   {name:<58}{measured:>10}{target:>10}  {'yes' if met else 'NO'}")
        if args.json:
            Path(args.json).write_text(json.dumps({"hooks": hooks}, indent=1))
        return {"hooks": hooks}
    if args.device != "cuda":
        sys.exit("--device cpu is a dry run of section 4: add --hooks-only")
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                 "the CPU figures are benchmarks/bench_overhead.py's")
    t_start = time.perf_counter()
    total = args.steps + args.warmup
    workdir = Path(tempfile.mkdtemp(prefix="jdist-bench-gpu-"))
    os.environ["JDIST_RUN_DIR"] = str(workdir / "runs")
    res: dict[str, Any] = {"config": vars(args), "machine": {**machine(), "gpu": torch.cuda.get_device_name(0)}}
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {s: {v: [] for v in VARIANTS} for s in SIZES}
    kernel = Kernel(workdir, args.kernel)
    kernel_log = open(workdir / "kernel-stderr.log", "w")
    try:
        print("starting a Jupyter kernel and a --gpus 1 cluster...", flush=True)
        kernel.start(stderr=kernel_log)
        kernel.run_one(SETUP_CELL)
        res["cold_start_s"] = kernel.run_one(COLD_CELL)[0]["cold_start_s"]
        for size, (hidden, batch) in SIZES.items():  # warm-up round, not counted
            run_jdist(kernel, total, hidden, batch, True)
        for rep in range(args.repeats):
            k = rep % len(VARIANTS)
            for v in VARIANTS[k:] + VARIANTS[:k]:
                for size, (hidden, batch) in SIZES.items():
                    print(f"repeat {rep + 1}/{args.repeats}: {v} {size}...", flush=True)
                    if v == "plain":
                        r = run_plain(total, hidden, batch)
                    elif v == "torchrun":
                        r = run_torchrun(total, hidden, batch, workdir)
                    else:
                        r = run_jdist(kernel, total, hidden, batch, v == "jdist_log")
                    raw[size][v].append(r)
        res["log_call_us"] = spread(kernel.run_one(LOG_COST_CELL)[0]["log_call_us"])
        kernel.run("get_ipython().run_line_magic('dist', 'stop')")
        res["hooks"] = run_hooks(args.hook_blocks, "cuda", workdir)
    except BaseException:
        try:
            kernel.run("get_ipython().run_line_magic('dist', 'stop')")
        except BaseException:
            pass
        print("kernel stderr (last lines):\n" + "\n".join((workdir / "kernel-stderr.log").read_text().splitlines()[-30:]),
              file=sys.stderr)
        raise
    finally:
        kernel.stop()
        kernel_log.close()

    res["steps"] = {}
    for size, by_variant in raw.items():
        medians = {v: [step_summary(r["times"], args.warmup)["median_s"] for r in runs] for v, runs in by_variant.items()}
        res["steps"][size] = {v: {"median_s": spread(medians[v]), "per_repeat_s": medians[v],
                                  "final_loss": by_variant[v][-1]["loss"][0]} for v in VARIANTS}
        for v in ("jdist_log", "jdist_nolog"):
            pairs = [j / t for j, t in zip(medians[v], medians["torchrun"])]
            res["steps"][size][v]["paired_vs_torchrun"] = spread(pairs)
    res["total_s"] = time.perf_counter() - t_start
    report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


def report(res: dict[str, Any]) -> None:
    m, cfg = res["machine"], res["config"]
    print(f"\njdist on one GPU: {m['gpu']}, torch {m['torch']}, {m['cpu_count']} cores; "
          f"{cfg['steps']} steps after {cfg['warmup']} warm-up, {cfg['repeats']} repeats interleaved")
    print("1. Per-step time, ms (per repeat the median step; min / median / max over repeats; "
          "paired: per repeat jdist / torchrun)")
    for size, (hidden, batch) in SIZES.items():
        print(f"   {size}: MLP 64-{hidden}-{hidden}-10, batch {batch}")
        print(f"   {'variant':<42}{'min':>8}{'median':>8}{'max':>8}{'x torchrun':>12}{'paired':>18}")
        st = res["steps"][size]
        base = st["torchrun"]["median_s"]["median"]
        for v in VARIANTS:
            s = st[v]["median_s"]
            p = st[v].get("paired_vs_torchrun")
            paired = f"{p['min']:.2f}/{p['median']:.2f}/{p['max']:.2f}" if p else "-"
            print(f"   {LABELS[v]:<42}{s['min'] * 1e3:8.3f}{s['median'] * 1e3:8.3f}{s['max'] * 1e3:8.3f}"
                  f"{s['median'] / base:>11.3f}x{paired:>18}")
        print("   final loss, same code path check: " + ", ".join(f"{v} {st[v]['final_loss']:.5f}" for v in VARIANTS))
    lc = res["log_call_us"]
    print(f"2. jdist.log(step=, loss=<CUDA tensor>) on the rank: median {lc['median']:.1f} us "
          f"(min {lc['min']:.1f}, max {lc['max']:.1f}; 5 x 2000 calls)")
    print(f"3. first %%distributed --gpus 1 cell in a fresh kernel: {res['cold_start_s']:.2f} s")
    rows = report_hooks(res["hooks"])
    print("\nTargets beside this run's figures:")
    for size in SIZES:
        r = res["steps"][size]["jdist_log"]["paired_vs_torchrun"]["median"]
        rows.append((f"step ratio jdist.log / torchrun, {size} (median of pairs)", f"{r:.3f}x",
                     f"<= {TARGETS['step_ratio']:.2f}x", r <= TARGETS["step_ratio"]))
    rows.append(("one jdist.log call with a CUDA tensor", f"{lc['median']:.1f} us", f"<= {TARGETS['log_call_us']:.0f} us",
                 lc["median"] <= TARGETS["log_call_us"]))
    rows.append(("first --gpus 1 cell", f"{res['cold_start_s']:.2f} s", f"<= {TARGETS['cold_start_s']:.0f} s",
                 res["cold_start_s"] <= TARGETS["cold_start_s"]))
    for name, measured, target, met in rows:
        print(f"   {name:<58}{measured:>10}{target:>10}  {'yes' if met else 'NO'}")
    print(f"total benchmark time: {res['total_s']:.1f} s")


if __name__ == "__main__":
    main()
