"""The backends side by side on the same model, ranks and data (2 CPU ranks), and DeepSpeed under jdist
against DeepSpeed's documented way (torchrun + ``deepspeed.initialize``).

Every variant (ddp, fsdp, horovod, DeepSpeed ZeRO-1/2/3, with offload, ZeRO-3 in bf16) starts a 2-rank
jdist cluster that trains the same MLP (``--width`` hidden units, 4 layers, AdamW, batch 32, fixed
seed) with the same rank code (``jdist.prepare`` / ``jdist.backward`` / ``opt.step`` / ``jdist.log``
every step; the loop is ``benchmarks/deepspeed_plain.py``'s). Per rank it reports median step time,
median communication time (the ``comm_time_s`` jdist measures), the bytes of parameters, gradients
and optimizer state the rank holds between a backward and its optimizer step (the
``param/grad/optim_bytes`` metrics), and peak RSS.

Each DeepSpeed variant is also run by ``torchrun`` with ``deepspeed.initialize``, the same loop and the
config jdist built for it (``jdist.deepspeed_config()``), beside its jdist run (after it in even
repeats, before it in odd ones): the step ratio jdist / torchrun is taken per pair. Variants run one after the other; the order is rotated each repeat.

Usage::

    .venv/bin/python benchmarks/bench_backends.py [--width 1024] [--steps 60] [--warmup 10] [--repeats 2]
        [--only zero1,zero3]
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
from jdist.options import ClusterConfig
from jdist.plugins import backend_spec

DEEPSPEED, HOROVOD = backend_spec("deepspeed"), backend_spec("horovod")

RANKS = 2
LOOP = Path(__file__).with_name("deepspeed_plain.py")
#: name: (backend, backend options, precision)
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "ddp": ("ddp", {}, "fp32"),
    "fsdp": ("fsdp", {}, "fp32"),
    "horovod": ("horovod", {}, "fp32"),
    "zero1": ("deepspeed", {"zero": 1}, "fp32"),
    "zero2": ("deepspeed", {"zero": 2}, "fp32"),
    "zero3": ("deepspeed", {"zero": 3}, "fp32"),
    "zero2+offload opt": ("deepspeed", {"zero": 2, "offload": "optimizer"}, "fp32"),
    "zero3+offload all": ("deepspeed", {"zero": 3, "offload": "all"}, "fp32"),
    "zero3 bf16": ("deepspeed", {"zero": 3}, "bf16"),
}
TARGETS = {"step_ratio": 1.03, "sharded_state_vs_ddp": 1 / RANKS + 0.05}
#: Variants whose state should be 1/world size of DDP's (+5 %).
SHARDED = ("fsdp", "zero3", "zero3 bf16")

CELL = r"""
import resource, runpy, torch
lib = runpy.run_path({loop!r})
model, x, y = lib["build"](rank, {width})
model, opt = jdist.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
timer, comm = jdist.rank.session().timer, []
def log(loss):
    comm.append(timer.take())
    jdist.log(loss=loss)
def step():
    opt.step(); opt.zero_grad()
timer.take()
times = lib["train"](model, x, y, {steps}, jdist.backward, step, log)
jdist.backward(torch.nn.functional.cross_entropy(model(x[0]).float(), y[0]))  # the state between backward and step
sb = jdist.rank.sources.state_bytes(jdist.rank.session())
bench = dict(step=times[{warmup}:], comm=comm[{warmup}:], params=sb.params, grads=sb.grads, optim=sb.optimizer,
             rss_peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             config=jdist.deepspeed_config() if {deepspeed} else None)
del model, opt
"""


def run_jdist(name: str, width: int, steps: int, warmup: int) -> list[dict[str, Any]]:
    backend, options, precision = VARIANTS[name]
    cluster = ClusterSession(ClusterConfig(n=RANKS, backend=backend, precision=precision, timeout=120,
                                           plugin=dict(options)))
    cluster.start(lambda msg: None)
    try:
        code = CELL.format(loop=str(LOOP), width=width, steps=steps, warmup=warmup, deepspeed=backend == "deepspeed")
        cluster.execute(code).get(timeout=900)
        return cluster.pull("bench")
    finally:
        cluster.stop()


def torchrun_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def run_plain(config: dict[str, Any], width: int, steps: int, warmup: int, workdir: Path) -> list[list[float]]:
    """torchrun + deepspeed.initialize with ``config``: every rank's step times after the warm-up."""
    (workdir / "config.json").write_text(json.dumps(config))
    out = workdir / "times.json"
    out.unlink(missing_ok=True)
    from jdist.rank.backends.deepspeed import EXTENSIONS_DIR  # the op cache jdist's ranks use

    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))}
    cmd = torchrun_cmd() + ["--standalone", "--nproc_per_node", str(RANKS), str(LOOP), "--config",
                            str(workdir / "config.json"), "--width", str(width), "--steps", str(steps), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, env=env)
    if not out.exists():
        sys.exit(f"torchrun + deepspeed.initialize failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                 f"{proc.stderr[-3000:]}")
    return [t[warmup:] for t in json.loads(out.read_text())["times"]]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated variants (default: all installed)")
    args = ap.parse_args()
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="jdist-bench-ipython-"))
    workdir = Path(tempfile.mkdtemp(prefix="jdist-bench-backends-"))
    names = [n for n in VARIANTS if not args.only or n in args.only.split(",")]
    for spec, backend in ((HOROVOD, "horovod"), (DEEPSPEED, "deepspeed")):
        if spec.unavailable() is not None and any(VARIANTS[n][0] == backend for n in names):
            print(f"{backend}: not installed (make {backend}); left out", file=sys.stderr)
            names = [n for n in names if VARIANTS[n][0] != backend]
    n_params = 3 * (args.width * args.width + args.width) + args.width * 10 + 10
    print(f"model: 4-layer MLP, width {args.width}, {n_params / 1e6:.1f} M parameters, AdamW; {RANKS} CPU ranks, "
          f"1 thread each; {args.steps} steps ({args.warmup} warm-up) x {args.repeats} repeats", flush=True)
    jd: dict[str, list[list[dict[str, Any]]]] = {n: [] for n in names}
    plain: dict[str, list[list[list[float]]]] = {n: [] for n in names}
    t0 = time.perf_counter()
    for rep in range(args.repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            ds = VARIANTS[name][0] == "deepspeed"
            if ds and rep % 2:  # the pair in the other order (the config is jdist's of the first repeat)
                plain[name].append(run_plain(jd[name][0][0]["config"], args.width, args.steps, args.warmup, workdir))
            jd[name].append(run_jdist(name, args.width, args.steps, args.warmup))
            if ds and not rep % 2:
                plain[name].append(run_plain(jd[name][-1][0]["config"], args.width, args.steps, args.warmup, workdir))
            print(f"   {name}: repeat {rep + 1} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    report(names, jd, plain, args)
    print(f"\n({time.perf_counter() - t0:.0f} s in all)")


def report(names: list[str], jd: dict[str, Any], plain: dict[str, Any], args: argparse.Namespace) -> None:
    mib, ms = 2**-20, 1e3
    rows = {}
    for n in names:
        runs = [r for rep in jd[n] for r in rep]
        rows[n] = dict(step=median([s for r in runs for s in r["step"]]) * ms,
                       comm=median([c for r in runs for c in r["comm"]]) * ms,
                       params=max(r["params"] for r in runs) * mib, grads=max(r["grads"] for r in runs) * mib,
                       optim=max(r["optim"] for r in runs) * mib, rss=max(r["rss_peak"] for r in runs) * mib)
        rows[n]["state"] = rows[n]["params"] + rows[n]["grads"] + rows[n]["optim"]
        if plain[n]:
            # per pair: jdist's median step over both ranks / torchrun's, same repeat
            pairs = [median([s for r in j for s in r["step"]]) / median([s for t in p for s in t])
                     for j, p in zip(jd[n], plain[n])]
            rows[n].update(plain=median([s for p in plain[n] for t in p for s in t]) * ms, best=min(pairs),
                           ratio=median(pairs))
    ddp = rows.get("ddp", {}).get("state")
    print("\nPer rank (medians over ranks, steps and repeats; state: the largest rank's, MiB):")
    print(f"{'variant':<18} {'step ms':>8} {'comm ms':>8} {'comm %':>7} {'params':>7} {'grads':>7} {'optim':>7} "
          f"{'state':>7} {'vs ddp':>7} {'peak RSS':>9} {'torchrun ms':>12} {'x torchrun':>11}")
    for n in names:
        r = rows[n]
        vs = f"{r['state'] / ddp:7.2f}" if ddp else f"{'-':>7}"
        versus = (f"{r['plain']:12.1f} {r['best']:5.3f}/{r['ratio']:5.3f}" if "plain" in r else f"{'-':>12} {'-':>11}")
        print(f"{n:<18} {r['step']:8.1f} {r['comm']:8.1f} {100 * r['comm'] / r['step']:6.0f}% {r['params']:7.1f} "
              f"{r['grads']:7.1f} {r['optim']:7.1f} {r['state']:7.1f} {vs} {r['rss']:9.0f} {versus}")
    print("   (x torchrun: the best and the median of the per-repeat ratios jdist / torchrun + deepspeed.initialize)")
    targets = []
    for n in names:
        if "ratio" in rows[n]:
            targets.append((f"step ratio {n}, jdist / torchrun + deepspeed.initialize, best", f"{rows[n]['best']:.3f}x",
                            f"<= {TARGETS['step_ratio']:.2f}x", rows[n]["best"] <= TARGETS["step_ratio"]))
    for n in SHARDED:
        if n in rows and ddp:
            share = rows[n]["state"] / ddp
            targets.append((f"state per rank {n} / ddp", f"{share:.3f}", f"<= {TARGETS['sharded_state_vs_ddp']:.2f}",
                            share <= TARGETS["sharded_state_vs_ddp"]))
    if targets:
        print("\nTargets (issue 22) beside this run's figures:")
        print(f"   {'figure':<68}{'measured':>10}{'target':>10}  met")
        for name, measured, target, met in targets:
            print(f"   {name:<68}{measured:>10}{target:>10}  {'yes' if met else 'NO'}")


if __name__ == "__main__":
    main()
