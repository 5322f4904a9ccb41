"""How close does ``jdist.tune`` come to the ideal wall time of a sweep, beside Optuna's ``n_jobs``?

Measured side by side in one run, on this machine's CPU ranks:

1. 32 trials of a 1 s objective (4 steps of ``time.sleep(0.25)``: no CPU, so the figures are pure
   orchestration cost) on 4 slots of 1 rank (a 4-rank cluster), ideal 8.0 s;
2. the same with 2 ranks per trial on an 8-rank cluster (4 slots), ideal 8.0 s; and on the same cluster
   an objective that also runs a gloo ``all_reduce`` in the slot's default group every step (the slot is
   a real group): its trials take longer on their ranks than 1 s, so beside 8.0 s it is also compared
   with the ideal for its measured trial time (trials / slots x the median trial on its ranks);
3. Optuna's own ``study.optimize(objective, n_trials=32, n_jobs=4)`` on the same objective (threads in
   one process), ideal 8.0 s;
4. the study's storage, per trial (ask, a parameter, an attribute, 20 reports each followed by a
   pruning question, tell), on the thread that drives the sweep: Optuna's in-memory storage, its journal
   file backend (a lock file, an open and an fsync per write), and the journal jdist keeps (in memory,
   mirrored to the same file format by a writer thread: :mod:`jdist.kernel.journal`).

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
    for _ in range(4):
        time.sleep(0.25)
    trial.set_user_attr("t1", time.time())
    return (x - 2.0) ** 2

def sleepy_reduce(trial):
    trial.set_user_attr("t0", time.time())
    x = trial.suggest_float("x", -10.0, 10.0)
    t = torch.ones(1)
    for _ in range(4):
        time.sleep(0.25)
        dist.all_reduce(t)
    trial.set_user_attr("t1", time.time())
    return (x - 2.0) ** 2
"""

TARGETS = {"ratio": 1.05, "dispatch_p50_ms": 20.0, "journal_vs_memory": 1.5}


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


def jdist_sweeps(n: int, per_trial: int, trials: int, repeats: int,
                 objectives: tuple[str, ...] = ("sleepy",)) -> dict[str, dict[str, Any]]:
    """Sweeps of each objective on one ``n``-rank cluster, ``repeats`` times, interleaved: per objective, the
    walls, the gaps between trials on a slot, the kernel's dispatch times, the phases and the trials' spans."""
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
        out = {name: {"ranks": n, "per_trial": per_trial, "cluster_start_s": start_s, "walls_s": [],
                      "rank_gap_s": [], "kernel_dispatch_s": [], "phases": [], "trial_s": []} for name in objectives}
        for _ in range(repeats):
            for name in objectives:
                r = out[name]
                t0 = time.perf_counter()
                study = jdist.tune(name, trials=trials, per_trial=per_trial, show=False)
                r["walls_s"].append(time.perf_counter() - t0)
                states = {t.state.name for t in study.trials}
                if states != {"COMPLETE"} or len(study.trials) != trials:
                    sys.exit(f"the sweep did not complete every trial: {states}")
                r["rank_gap_s"] += gaps(study)
                r["kernel_dispatch_s"] += tune_mod.last().dispatch_s
                r["phases"].append(tune_mod.last().phases)
                r["trial_s"] += [t.user_attrs["t1"] - t.user_attrs["t0"] for t in study.trials]
    finally:
        cluster.stop()
        set_current(None)
    return out


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


def storage_costs(folder: Path, trials: int = 200, reports: int = 20) -> dict[str, float]:
    """Milliseconds per trial of the study's storage calls for each storage (files in ``folder``)."""
    import optuna
    from optuna.storages import InMemoryStorage, JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from jdist.kernel.journal import MirroredJournal

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def per_trial(storage: Any) -> float:
        study = optuna.create_study(storage=storage, pruner=optuna.pruners.MedianPruner())
        t0 = time.perf_counter()
        for _ in range(trials):
            trial = study.ask()
            x = trial.suggest_float("x", -1.0, 1.0)
            trial.set_user_attr("jdist_slot", 0)
            for step in range(reports):
                trial.report(x + step, step)
                trial.should_prune()
            study.tell(trial, x * x)
        return (time.perf_counter() - t0) / trials * 1e3

    mirrored = MirroredJournal(folder / "mirrored.log")
    out = {"memory_ms": per_trial(InMemoryStorage()),
           "optuna_journal_file_ms": per_trial(JournalStorage(JournalFileBackend(str(folder / "optuna.log")))),
           "jdist_journal_ms": per_trial(JournalStorage(mirrored))}
    t0 = time.perf_counter()
    mirrored.flush()
    out["jdist_flush_s"] = time.perf_counter() - t0
    return out


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
    res["jdist_1x4"] = jdist_sweeps(4, 1, args.trials, args.repeats)["sleepy"]
    print("jdist.tune, 4 slots of 2 ranks (8 ranks)...", flush=True)
    two = jdist_sweeps(8, 2, args.trials, args.repeats, ("sleepy", "sleepy_reduce"))
    res["jdist_2x4"], res["jdist_2x4_reduce"] = two["sleepy"], two["sleepy_reduce"]
    print("the study's storage per trial...", flush=True)
    res["storage"] = storage_costs(Path(os.environ["JDIST_RUN_DIR"]))
    res["total_s"] = time.perf_counter() - t_all
    report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


def reduced_ideal(res: dict[str, Any]) -> float:
    """The ideal wall of the all_reduce objective's sweep for its measured trial time on the ranks."""
    return res["trials"] / 4 * statistics.median(res["jdist_2x4_reduce"]["trial_s"])


def report(res: dict[str, Any]) -> None:
    ideal = res["ideal_s"]
    print(f"\n{res['trials']} trials of a 1 s objective on 4 concurrent slots, ideal {ideal:.1f} s; "
          f"{res['cpu_count']} cores; wall of each repeat")
    print(f"   {'runner':<46}{'min':>8}{'median':>8}{'max':>8}{'x ideal':>9}")
    rows = [("Optuna study.optimize(n_jobs=4) (threads)", res["optuna_n_jobs_4"]["walls_s"]),
            ("jdist.tune, 4 slots x 1 rank (4 ranks)", res["jdist_1x4"]["walls_s"]),
            ("jdist.tune, 4 slots x 2 ranks (8 ranks)", res["jdist_2x4"]["walls_s"]),
            ("  the same, an all_reduce in the slot per step", res["jdist_2x4_reduce"]["walls_s"])]
    for name, walls in rows:
        med = statistics.median(walls)
        print(f"   {name:<46}{min(walls):8.2f}{med:8.2f}{max(walls):8.2f}{med / ideal:8.3f}x")
    reduce_ideal = reduced_ideal(res)
    print(f"   (with the all_reduce a trial took {statistics.median(res['jdist_2x4_reduce']['trial_s']):.4f} s on its "
          f"ranks: ideal {reduce_ideal:.2f} s for that trial time, median / that "
          f"{statistics.median(res['jdist_2x4_reduce']['walls_s']) / reduce_ideal:.3f}x)")
    for key in ("jdist_1x4", "jdist_2x4", "jdist_2x4_reduce"):
        r = res[key]
        g, k = r["rank_gap_s"], r["kernel_dispatch_s"]
        print(f"   {key}: next trial running on a slot after the previous ended there (rank clocks): "
              f"p50 {quantile(g, 0.5) * 1e3:.1f} ms, p90 {quantile(g, 0.9) * 1e3:.1f} ms, max {max(g) * 1e3:.1f} ms "
              f"({len(g)} gaps); kernel's share (seen finished -> sent) p50 {quantile(k, 0.5) * 1e3:.2f} ms; "
              f"cluster start {r['cluster_start_s']:.1f} s (not in the wall)")
        ph = {k: statistics.median(p[k] for p in r["phases"]) for k in r["phases"][0]}
        print(f"      median phases: checks and the study {ph['before_s']:.3f} s, then trials {ph['trials_s']:.2f} s "
              f"(with forming the slots, {ph['slots_s']:.3f} s, as the first trials travel), the world group "
              f"again {ph['world_s']:.3f} s, the view and the journal written {ph['after_s']:.3f} s; "
              "a trial on its ranks: median "
              f"{statistics.median(r['trial_s']):.4f} s, max {max(r['trial_s']):.4f} s")
    st = res["storage"]
    print("\nThe study's storage per trial (ask, a parameter, an attribute, 20 reports and pruning questions, "
          "tell), on the thread that drives the sweep:")
    for key, name in (("memory_ms", "Optuna InMemoryStorage"), ("optuna_journal_file_ms", "Optuna JournalFileBackend"),
                      ("jdist_journal_ms", "jdist journal (memory, mirrored to the file)")):
        print(f"   {name:<46}{st[key]:8.2f} ms  {st[key] / st['memory_ms']:6.2f}x memory")
    print(f"   (the writer thread had everything on disk {st['jdist_flush_s'] * 1e3:.0f} ms after the last tell)")
    print("\nTargets beside this run's figures:")
    checks = [("jdist.tune 4 x 1 rank, median / ideal", statistics.median(res["jdist_1x4"]["walls_s"]) / ideal,
               TARGETS["ratio"], "x"),
              ("jdist.tune 4 x 2 ranks, median / ideal", statistics.median(res["jdist_2x4"]["walls_s"]) / ideal,
               TARGETS["ratio"], "x"),
              ("4 x 2 with all_reduce, / ideal for its trials", statistics.median(res["jdist_2x4_reduce"]["walls_s"])
               / reduced_ideal(res), TARGETS["ratio"], "x"),
              ("dispatch p50 (rank clocks), 4 x 1", quantile(res["jdist_1x4"]["rank_gap_s"], 0.5) * 1e3,
               TARGETS["dispatch_p50_ms"], " ms"),
              ("dispatch p50 (rank clocks), 4 x 2", quantile(res["jdist_2x4"]["rank_gap_s"], 0.5) * 1e3,
               TARGETS["dispatch_p50_ms"], " ms"),
              ("jdist journal per trial / in-memory storage", st["jdist_journal_ms"] / st["memory_ms"],
               TARGETS["journal_vs_memory"], "x")]
    for name, value, target, unit in checks:
        print(f"   {name:<44}{value:>9.3f}{unit:<3} <= {target:g}{unit:<3} {'yes' if value <= target else 'NO'}")
    print(f"total benchmark time: {res['total_s']:.1f} s")


if __name__ == "__main__":
    main()
