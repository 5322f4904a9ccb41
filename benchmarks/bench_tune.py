"""How close does ``jdist.tune`` come to the ideal wall time of a sweep, beside Optuna's ``n_jobs``?

Measured side by side in one run, on this machine's CPU ranks:

1. 32 trials of a 1 s objective (4 steps of ``time.sleep(0.25)``: no CPU, so the figures are pure
   orchestration cost) on 4 slots of 1 rank (a 4-rank cluster), ideal 8.0 s;
2. the same with 2 ranks per trial on an 8-rank cluster (4 slots; a gloo ``all_reduce`` in the slot's
   default group every step), ideal 8.0 s;
3. Optuna's own ``study.optimize(objective, n_trials=32, n_jobs=4)`` on the same objective (threads in
   one process), ideal 8.0 s.

The sweep's wall time is the ``jdist.tune`` call (slots formed, 32 trials, the world group formed again);
the cluster's start is not in it. Dispatch latency: per slot, from the end of a trial on its rank to
the start of the next one there (both read on the rank, ``time.time()``), and the kernel's share of it
(the trial seen finished -> the next trial sent). ``--repeats`` runs of each, interleaved.

Usage::

    .venv/bin/python benchmarks/bench_tune.py [--trials 32] [--repeats 3] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import quantile  # noqa: E402

OBJECTIVE = """
import time
import torch, torch.distributed as dist
def sleepy(trial):
    trial.set_user_attr("t0", time.time())
    x = trial.suggest_float("x", -10.0, 10.0)
    t = torch.ones(1)
    for _ in range(4):
        time.sleep(0.25)
        if dist.get_world_size() > 1:
            dist.all_reduce(t)
    trial.set_user_attr("t1", time.time())
    return (x - 2.0) ** 2
"""

TARGETS = {"ratio": 1.05, "dispatch_p50_ms": 20.0}


def gaps(study: Any) -> list[float]:
    """Per slot, seconds from a trial's end on its rank to the start of the next one there."""
    by_slot: dict[int, list[tuple[float, float]]] = {}
    for t in study.trials:
        a = t.user_attrs
        if "t0" in a and "t1" in a:
            by_slot.setdefault(a["jdist_slot"], []).append((a["t0"], a["t1"]))
    out = []
    for spans in by_slot.values():
        spans.sort()
        out += [nxt[0] - prev[1] for prev, nxt in zip(spans, spans[1:])]
    return out


def jdist_sweeps(n: int, per_trial: int, trials: int, repeats: int) -> dict[str, Any]:
    from IPython.testing.globalipapp import start_ipython

    import jdist
    from jdist.kernel import tune as tune_mod
    from jdist.kernel.cluster import ClusterSession, set_current
    from jdist.kernel.supervise.supervisor import run_cell
    from jdist.options import ClusterConfig
    from jdist.plugins import option_table

    start_ipython()
    cluster = ClusterSession(ClusterConfig(n=n, backend="ddp"))
    t0 = time.perf_counter()
    cluster.start()
    start_s = time.perf_counter() - t0
    set_current(cluster)
    try:
        result = run_cell(cluster, OBJECTIVE, option_table().cell_options({}))
        if not result.ok:
            sys.exit(f"defining the objective failed on the ranks: {result}")
        walls, rank_gaps, kernel_dispatch, phases, spans = [], [], [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            study = jdist.tune("sleepy", trials=trials, per_trial=per_trial, show=False)
            walls.append(time.perf_counter() - t0)
            states = {t.state.name for t in study.trials}
            if states != {"COMPLETE"} or len(study.trials) != trials:
                sys.exit(f"the sweep did not complete every trial: {states}")
            rank_gaps += gaps(study)
            kernel_dispatch += tune_mod._last.dispatch_s
            phases.append(tune_mod._last.phases)
            spans += [t.user_attrs["t1"] - t.user_attrs["t0"] for t in study.trials]
    finally:
        cluster.stop()
        set_current(None)
    return {"ranks": n, "per_trial": per_trial, "cluster_start_s": start_s, "walls_s": walls,
            "rank_gap_s": rank_gaps, "kernel_dispatch_s": kernel_dispatch, "phases": phases, "trial_s": spans}


def optuna_threads(trials: int, n_jobs: int, repeats: int) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def sleepy(trial: Any) -> float:
        x = trial.suggest_float("x", -10.0, 10.0)
        for _ in range(4):
            time.sleep(0.25)
        return (x - 2.0) ** 2

    walls = []
    for _ in range(repeats):
        study = optuna.create_study()
        t0 = time.perf_counter()
        study.optimize(sleepy, n_trials=trials, n_jobs=n_jobs)
        walls.append(time.perf_counter() - t0)
    return {"n_jobs": n_jobs, "walls_s": walls}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    os.environ["JDIST_RUN_DIR"] = tempfile.mkdtemp(prefix="jdist-bench-tune-")
    ideal = args.trials / 4 * 1.0
    t_all = time.perf_counter()
    res: dict[str, Any] = {"trials": args.trials, "ideal_s": ideal, "cpu_count": os.cpu_count()}
    print("Optuna n_jobs=4...", flush=True)
    res["optuna_n_jobs_4"] = optuna_threads(args.trials, 4, args.repeats)
    print("jdist.tune, 4 slots of 1 rank (4 ranks)...", flush=True)
    res["jdist_1x4"] = jdist_sweeps(4, 1, args.trials, args.repeats)
    print("jdist.tune, 4 slots of 2 ranks (8 ranks)...", flush=True)
    res["jdist_2x4"] = jdist_sweeps(8, 2, args.trials, args.repeats)
    res["total_s"] = time.perf_counter() - t_all
    report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


def report(res: dict[str, Any]) -> None:
    ideal = res["ideal_s"]
    print(f"\n{res['trials']} trials of a 1 s objective on 4 concurrent slots, ideal {ideal:.1f} s; "
          f"{res['cpu_count']} cores; wall of each repeat")
    print(f"   {'runner':<46}{'min':>8}{'median':>8}{'max':>8}{'x ideal':>9}")
    rows = [("Optuna study.optimize(n_jobs=4) (threads)", res["optuna_n_jobs_4"]["walls_s"]),
            ("jdist.tune, 4 slots x 1 rank (4 ranks)", res["jdist_1x4"]["walls_s"]),
            ("jdist.tune, 4 slots x 2 ranks (8 ranks)", res["jdist_2x4"]["walls_s"])]
    for name, walls in rows:
        med = statistics.median(walls)
        print(f"   {name:<46}{min(walls):8.2f}{med:8.2f}{max(walls):8.2f}{med / ideal:8.3f}x")
    for key in ("jdist_1x4", "jdist_2x4"):
        r = res[key]
        g, k = r["rank_gap_s"], r["kernel_dispatch_s"]
        print(f"   {key}: next trial running on a slot after the previous ended there (rank clocks): "
              f"p50 {quantile(g, 0.5) * 1e3:.1f} ms, p90 {quantile(g, 0.9) * 1e3:.1f} ms, max {max(g) * 1e3:.1f} ms "
              f"({len(g)} gaps); kernel's share (seen finished -> sent) p50 {quantile(k, 0.5) * 1e3:.2f} ms; "
              f"cluster start {r['cluster_start_s']:.1f} s (not in the wall)")
        ph = {k: statistics.median(p[k] for p in r["phases"]) for k in r["phases"][0]}
        print(f"      median phases: forming the slots {ph['slots_s']:.3f} s, trials {ph['trials_s']:.2f} s, "
              f"the world group again {ph['world_s']:.3f} s; a trial on its ranks: median "
              f"{statistics.median(r['trial_s']):.4f} s, max {max(r['trial_s']):.4f} s")
    print("\nTargets beside this run's figures:")
    checks = [("jdist.tune 4 x 1 rank, median / ideal", statistics.median(res["jdist_1x4"]["walls_s"]) / ideal,
               TARGETS["ratio"], "x"),
              ("jdist.tune 4 x 2 ranks, median / ideal", statistics.median(res["jdist_2x4"]["walls_s"]) / ideal,
               TARGETS["ratio"], "x"),
              ("dispatch p50 (rank clocks), 4 x 1", quantile(res["jdist_1x4"]["rank_gap_s"], 0.5) * 1e3,
               TARGETS["dispatch_p50_ms"], " ms"),
              ("dispatch p50 (rank clocks), 4 x 2", quantile(res["jdist_2x4"]["rank_gap_s"], 0.5) * 1e3,
               TARGETS["dispatch_p50_ms"], " ms")]
    for name, value, target, unit in checks:
        print(f"   {name:<44}{value:>9.3f}{unit:<3} <= {target:g}{unit:<3} {'yes' if value <= target else 'NO'}")
    print(f"total benchmark time: {res['total_s']:.1f} s")


if __name__ == "__main__":
    main()
