"""How much does running DDP training through jdist cost, compared with plain torchrun?

Measured side by side in one run, on 2 CPU ranks (gloo):

1. Per-step time of the same training loop (``benchmarks/ddp_plain.py``: MLP
   64 -> 256 -> 256 -> 10, batch 64, SGD, fixed seed, synthetic data, 1 torch thread
   per rank), run (a) by ``torchrun --nproc_per_node 2`` with DDP and (b) as a
   ``%%distributed`` cell in a real Jupyter kernel (nbclient), with ``jdist.log`` every
   step (dashboard on and ``--no-dashboard``) and without it. Steps are timed on each
   rank with ``time.perf_counter``; warm-up steps are dropped. The variants are
   interleaved, ``--repeats`` times, with the order rotated each repeat.
2. Cold start: the first ``%%distributed -n 2`` cell (body ``pass``) in a fresh kernel; at the
   end, ``%dist restart --fresh`` and ``%dist stop``; then the first ``-n 4`` cell in another fresh kernel.
3. Warm empty-cell round trip: ``%%distributed pass`` vs ipyparallel's ``%%px pass`` on
   the same engines (and ``view.execute("pass", block=True)`` as the floor), interleaved.
4. Communication time: the same loop with ``jdist.log`` for ``--steps`` steps under
   ``torch.profiler``; each rank's sum of jdist's ``comm_time_s`` over those steps beside the
   sum of the profiler's ``gloo:all_reduce`` events.

Usage::

    .venv/bin/python benchmarks/bench_overhead.py [--steps 300] [--warmup 20] [--repeats 9]
                                                  [--empty-runs 30] [--json results.json]

See docs/benchmarks.md for what the figures mean and the figures of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLAIN_SCRIPT = HERE / "ddp_plain.py"
RANKS = 2
MARK = "@@JDIST-BENCH@@"

#: Variant name -> (%%distributed options, log every step?)
JDIST_VARIANTS: dict[str, tuple[str, bool]] = {
    "jdist_log": ("", True),
    "jdist_log_nodash": ("--no-dashboard", True),
    "jdist_nolog": ("", False),
}
LABELS = {
    "plain": "torchrun + DDP (plain)",
    "jdist_log": "%%distributed + jdist.log",
    "jdist_log_nodash": "%%distributed + jdist.log --no-dashboard",
    "jdist_nolog": "%%distributed, no jdist.log",
}


# ---------------------------------------------------------------------------------------
# statistics helpers
def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def step_summary(per_rank: list[list[float]], warmup: int) -> dict[str, Any]:
    """Per-rank median/mean/p90 of the steps after warm-up; the mean over ranks of each (seconds)."""
    kept = [t[warmup:] for t in per_rank]
    medians = [statistics.median(t) for t in kept]
    p90s = [quantile(t, 0.9) for t in kept]
    return {
        "median_s": statistics.fmean(medians),
        "mean_s": statistics.fmean(statistics.fmean(t) for t in kept),
        "p90_s": statistics.fmean(p90s),
        "rank_median_s": medians,
        "rank_p90_s": p90s,
        "steps": len(kept[0]),
    }


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


# ---------------------------------------------------------------------------------------
# (a) plain torchrun
def torchrun_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def run_plain(total_steps: int, workdir: Path, attempts: int = 3) -> dict[str, Any]:
    """One torchrun run; its per-rank step times (rank 0 writes them after an all_gather).

    A non-zero exit after the times were written (a crash in process teardown) is kept
    but counted in ``teardown_failures``; a run that wrote nothing is retried.
    """
    out = workdir / "plain.json"
    cmd = torchrun_cmd() + [
        "--standalone", "--nproc_per_node", str(RANKS), str(PLAIN_SCRIPT), "--steps", str(total_steps), "--out", str(out)
    ]
    for attempt in range(attempts):
        out.unlink(missing_ok=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
        wall = time.perf_counter() - t0
        if out.exists():
            data = json.loads(out.read_text())
            out.unlink()
            data["wall_s"] = wall
            data["exit_code"] = proc.returncode
            data["attempts"] = attempt + 1
            if proc.returncode != 0:
                tail = "\n".join(l for l in proc.stderr.splitlines() if "terminate" in l or "exitcode" in l)
                print(f"   note: torchrun exited {proc.returncode} after writing its results:\n{tail}", flush=True)
            return data
        print(f"   torchrun failed (exit {proc.returncode}) before writing results; retrying", flush=True)
    sys.exit(f"torchrun failed {attempts} times (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


# ---------------------------------------------------------------------------------------
# (b) a real Jupyter kernel driven by nbclient
class Kernel:
    """A Jupyter kernel (kernelspec ``python3``) that runs cells one at a time via nbclient."""

    def __init__(self, workdir: Path, kernel_name: str):
        import nbformat
        from nbclient import NotebookClient

        self.nbformat = nbformat
        self.nb = nbformat.v4.new_notebook()
        self.client = NotebookClient(
            self.nb, kernel_name=kernel_name, timeout=600, allow_errors=False,
            resources={"metadata": {"path": str(workdir)}},
        )
        self._ctx: Any = None

    def start(self, stderr: Any = None) -> float:
        t0 = time.perf_counter()
        self._ctx = self.client.setup_kernel(stderr=stderr)
        self._ctx.__enter__()
        self.run("pass")  # kernel is ready once it answered one cell
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None

    def run(self, source: str) -> tuple[list[dict[str, Any]], str, float]:
        """Execute one cell; returns (marker records, all stdout text, client-side wall seconds)."""
        cell = self.nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        t0 = time.perf_counter()
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        wall = time.perf_counter() - t0
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        recs = [json.loads(line[len(MARK):]) for line in text.splitlines() if line.startswith(MARK)]
        return recs, text, wall

    def run_one(self, source: str) -> tuple[dict[str, Any], float]:
        recs, text, wall = self.run(source)
        if len(recs) != 1:
            sys.exit(f"benchmark cell printed no result; its output was:\n{text}")
        return recs[0], wall


SETUP_CELL = f"""
import json, time, statistics
MARK = {MARK!r}
def _emit(**kw):
    print(MARK + json.dumps(kw), flush=True)
def _cpu():
    # CPU seconds used so far by this kernel (all threads) and by the ipyparallel controller (+children)
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    ctl = None
    try:
        proc = jdist.kernel.cluster.current().ipp.controller.process   # a psutil.Process
        ctl = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            t = p.cpu_times()
            ctl += t.user + t.system
    except Exception:
        pass
    return ru.ru_utime + ru.ru_stime, ctl
_t0 = time.perf_counter()
get_ipython().run_line_magic("load_ext", "jdist")
_emit(load_ext_s=time.perf_counter() - _t0)
"""

COLD_CELL = """
_t0 = time.perf_counter()
get_ipython().run_cell_magic("distributed", "-n {n}", "pass")
_emit(cold_start_s=time.perf_counter() - _t0)
"""

#: On the ranks: load benchmarks/ddp_plain.py, build its model and data, prepare the model.
LOAD_LOOP = """
import importlib.util as _ilu
_spec = _ilu.spec_from_file_location("jdist_bench_loop", {path!r})
_bench = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
_model, _x, _y = _bench.build(rank, {total})
_model = jdist.prepare(_model)
"""

RANK_CODE = LOAD_LOOP + """_times, _loss = _bench.train(_model, _x, _y, log={log})
bench_out = {{"times": _times, "loss": _loss, "threads": __import__("torch").get_num_threads()}}
del _model, _x, _y
"""

TRAIN_CELL = """
_before = jdist.last_run()
_code = {code!r}
_c0 = _cpu()
_t0 = time.perf_counter()
get_ipython().run_cell_magic("distributed", {opts!r}, _code)
_wall = time.perf_counter() - _t0
_c1 = _cpu()
get_ipython().run_line_magic("dist", "pull bench_out")
_run = jdist.last_run()
_hist = None
if {logs} and _run is not None and _run is not _before:
    _h = _run.history
    _hist = {{"rows": len(_h), "step_time_s": [_h[_h["rank"] == r].sort_values("step")["step_time_s"].tolist() for r in range({ranks})],
              "comm_time_s": [_h[_h["rank"] == r].sort_values("step")["comm_time_s"].tolist() for r in range({ranks})]}}
_emit(times=[o["times"] for o in bench_out], loss=[o["loss"] for o in bench_out],
      threads=[o["threads"] for o in bench_out], wall_s=_wall, history=_hist,
      kernel_cpu_s=_c1[0] - _c0[0], controller_cpu_s=None if _c0[1] is None else _c1[1] - _c0[1])
"""

COMM_CELL = """
_code = {code!r}
get_ipython().run_cell_magic("distributed", "", _code)
get_ipython().run_line_magic("dist", "pull bench_out")
_h = jdist.last_run().history
_h = _h[_h["step"] >= {warmup}]
_emit(profiler_s=[o["profiler_comm_s"] for o in bench_out], events=[o["events"] for o in bench_out],
      jdist_s=[float(_h[_h["rank"] == r]["comm_time_s"].sum()) for r in range({ranks})],
      steps=[int((_h["rank"] == r).sum()) for r in range({ranks})])
"""

COMM_CODE = LOAD_LOOP + """from torch.profiler import profile, ProfilerActivity
_bench.train(_model, _x[:{warmup}], _y[:{warmup}], log=lambda i, v: jdist.log(step=i, loss=v))
with profile(activities=[ProfilerActivity.CPU]) as _prof:
    _bench.train(_model, _x[{warmup}:], _y[{warmup}:], log=lambda i, v: jdist.log(step={warmup} + i, loss=v))
_ev = [e for e in _prof.events() if e.name == "gloo:all_reduce"]
bench_out = {{"profiler_comm_s": sum(e.time_range.elapsed_us() for e in _ev) / 1e6, "events": len(_ev)}}
del _model, _x, _y, _prof, _ev
"""

EMPTY_CELL = """
_ip = get_ipython()
_rc = jdist.kernel.cluster.current().client
_view = _rc.activate()   # %%px on all engines, blocking (what ipyparallel's docs do)
_floor_view = _rc[:]
def _timed(fn):
    t = time.perf_counter(); fn(); return time.perf_counter() - t
_kinds = {{
    "distributed": lambda: _ip.run_cell_magic("distributed", "", "pass"),
    "px": lambda: _ip.run_cell_magic("px", "", "pass"),
    "execute": lambda: _floor_view.execute("pass", block=True),
}}
for _ in range(3):
    for _f in _kinds.values():
        _f()
_samples = {{k: [] for k in _kinds}}
for _ in range({n}):
    for _k, _f in _kinds.items():
        _samples[_k].append(_timed(_f))
_emit(**_samples)
"""

RESTART_CELL = """
_t0 = time.perf_counter()
get_ipython().run_line_magic("dist", "restart --fresh")   # the cells without jdist.log would be replayed
_emit(restart_s=time.perf_counter() - _t0)
"""

STOP_CELL = """
_t0 = time.perf_counter()
get_ipython().run_line_magic("dist", "stop")
_emit(stop_s=time.perf_counter() - _t0)
"""


def cold_start(workdir: Path, kernel_name: str, n: int) -> float:
    """Seconds of the first ``%%distributed -n <n>`` cell in a fresh kernel (stopped after)."""
    kernel = Kernel(workdir, kernel_name)
    with open(workdir / f"kernel-{n}-stderr.log", "w") as log:
        kernel.start(stderr=log)
        try:
            kernel.run_one(SETUP_CELL)
            rec, _ = kernel.run_one(COLD_CELL.format(n=n))
            kernel.run_one(STOP_CELL)
        finally:
            kernel.stop()
    return rec["cold_start_s"]


def run_jdist(kernel: Kernel, variant: str, total_steps: int) -> dict[str, Any]:
    opts, logs = JDIST_VARIANTS[variant]
    code = RANK_CODE.format(
        path=str(PLAIN_SCRIPT), total=total_steps, log="lambda i, v: jdist.log(step=i, loss=v)" if logs else "None"
    )
    c0 = time.process_time()  # this process: nbclient, which decodes what a browser would get
    rec, wall = kernel.run_one(TRAIN_CELL.format(code=code, opts=opts, logs=logs, ranks=RANKS))
    rec["client_wall_s"], rec["client_cpu_s"] = wall, time.process_time() - c0
    return rec


# ---------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


#: The goals of issue 11, printed beside the measured figures (docs/benchmarks.md).
TARGETS = {
    "step_ratio": 1.03,        # per-step time, jdist.log every step + dashboard, / torchrun
    "kernel_cpu_pct": 5.0,     # kernel CPU during a training cell, % of one core
    "cold_start_s": 4.0,       # first %%distributed -n 2 cell
    "cold_start_4_s": 6.0,     # first %%distributed -n 4 cell
    "stop_s": 1.0,             # %dist stop
    "restart_s": 5.0,          # %dist restart --fresh (2 ranks, no cell replayed)
    "log_call_us": 10.0,       # one jdist.log call on a rank (the hot path)
    "comm_vs_profiler_pct": 15.0,  # jdist's comm time vs torch.profiler's on the same steps
}


def log_call_cost(calls: int = 20000) -> dict[str, float]:
    """One ``jdist.log(step=, loss=)`` call, in µs: the median of 5 runs of ``calls`` calls on
    one process's rank session (records go to a list; the publisher thread completes and "sends"
    them every 0.1 s, as on a rank)."""
    import jdist
    from jdist.rank.session import local_session

    runs = []
    with local_session() as s:
        s.start_publisher()  # as on a rank: a thread completes and sends the records every 0.1 s
        try:
            for _ in range(5):
                t0 = time.perf_counter()
                for i in range(calls):
                    jdist.log(step=i, loss=0.5)
                runs.append((time.perf_counter() - t0) / calls * 1e6)
        finally:
            s.stop_publisher()
    return {"median_us": statistics.median(runs), "min_us": min(runs), "max_us": max(runs)}


def print_targets(res: dict[str, Any]) -> None:
    """Each goal beside the figure measured in this run."""
    steps, cold = res["steps"], res["cold"]
    ratio = steps["jdist_log"]["paired_ratio"]["median"]
    best = steps["jdist_log"]["median_s"]["min"] / steps["plain"]["median_s"]["min"]
    cell = steps["jdist_log"]["cell_wall_s"]["median"]
    kernel_pct = 100 * steps["jdist_log"]["kernel_cpu_s"]["median"] / cell
    comm_dev = max(abs(j / p - 1) for p, j in zip(res["comm"]["profiler_s"], res["comm"]["jdist_s"]))
    rows = [
        ("step ratio, jdist.log every step + dashboard / torchrun, best", f"{best:.3f}x",
         f"<= {TARGETS['step_ratio']:.2f}x", best <= TARGETS["step_ratio"]),
        ("  the same, median of the paired per-repeat ratios", f"{ratio:.3f}x",
         f"<= {TARGETS['step_ratio']:.2f}x", ratio <= TARGETS["step_ratio"]),
        ("kernel CPU during the training cell, % of one core", f"{kernel_pct:.1f} %",
         f"<= {TARGETS['kernel_cpu_pct']:.0f} %", kernel_pct <= TARGETS["kernel_cpu_pct"]),
        (f"first %%distributed -n {RANKS} cell (cold start)", f"{cold['cold_start_s']:.2f} s",
         f"<= {TARGETS['cold_start_s']:.0f} s", cold["cold_start_s"] <= TARGETS["cold_start_s"]),
        ("first %%distributed -n 4 cell (cold start, another kernel)", f"{cold['cold_start_4_s']:.2f} s",
         f"<= {TARGETS['cold_start_4_s']:.0f} s", cold["cold_start_4_s"] <= TARGETS["cold_start_4_s"]),
        ("%dist stop", f"{cold['stop_s']:.2f} s", f"<= {TARGETS['stop_s']:.0f} s", cold["stop_s"] <= TARGETS["stop_s"]),
        ("%dist restart --fresh (new ranks, no cell replayed)", f"{cold['restart_s']:.2f} s",
         f"<= {TARGETS['restart_s']:.0f} s", cold["restart_s"] <= TARGETS["restart_s"]),
        ("comm time, jdist vs torch.profiler, worst rank (|ratio - 1|)", f"{comm_dev * 100:.1f} %",
         f"<= {TARGETS['comm_vs_profiler_pct']:.0f} %", comm_dev * 100 <= TARGETS["comm_vs_profiler_pct"]),
        ("one jdist.log call on a rank (median of 5 x 20000)", f"{res['log_call']['median_us']:.1f} us",
         f"<= {TARGETS['log_call_us']:.0f} us", res["log_call"]["median_us"] <= TARGETS["log_call_us"]),
    ]
    print("Targets (issue 11) beside this run's figures:")
    print(f"   {'figure':<64}{'measured':>12}{'target':>12}  met")
    for name, measured, target, met in rows:
        print(f"   {name:<64}{measured:>12}{target:>12}  {'yes' if met else 'NO'}")
    print()


def ms(x: float) -> str:
    return f"{x * 1e3:8.2f}"


def print_report(res: dict[str, Any]) -> None:
    cfg = res["config"]
    print()
    print(f"jdist overhead benchmark: {RANKS} CPU ranks (gloo), MLP 64-256-256-10, batch 64, "
          f"{cfg['steps']} steps after {cfg['warmup']} warm-up, {cfg['repeats']} repeat(s) interleaved")
    m = res["machine"]
    print(f"machine: {m['cpu_count']} cores ({m['processor']}), torch {m['torch']}, "
          f"CUDA {'yes' if m['cuda_available'] else 'no'}, Python {m['python']}")
    print()
    print("1. Per-step time, ms. Per repeat: the median step on each rank, averaged over the ranks;")
    print("   min / median / max of that over the repeats, then the median over repeats of the mean and p90 step.")
    print(f"   {'variant':<42}{'min':>8}{'median':>8}{'max':>8}{'mean':>8}{'p90':>8}{'x plain':>9}{'paired x':>19}")
    steps = res["steps"]
    base = steps["plain"]["median_s"]["median"]
    for v in ["plain", *JDIST_VARIANTS]:
        s = steps[v]
        pr = s.get("paired_ratio")
        paired = f"{pr['min']:.2f}/{pr['median']:.2f}/{pr['max']:.2f}" if pr else "-"
        print(f"   {LABELS[v]:<42}{ms(s['median_s']['min'])}{ms(s['median_s']['median'])}{ms(s['median_s']['max'])}"
              f"{ms(s['mean_s']['median'])}{ms(s['p90_s']['median'])}{s['median_s']['median'] / base:>8.2f}x{paired:>19}")
    print("   (x plain: ratio of the medians; paired x: min/median/max of the per-repeat ratio to that repeat's plain run)")
    print("   best repeats (min column) / plain's best, as timeit does (other load only adds time): "
          + ", ".join(f"{v} {steps[v]['median_s']['min'] / steps['plain']['median_s']['min']:.3f}x"
                      for v in JDIST_VARIANTS))
    h = steps["jdist_log"].get("history_median_s")
    if h:
        print(f"   cross-check, jdist.last_run().history.step_time_s (median, mean over ranks), jdist_log: "
              f"{h['median'] * 1e3:.2f} ms (min {h['min'] * 1e3:.2f}, max {h['max'] * 1e3:.2f}); "
              f"comm_time_s median {steps['jdist_log']['history_comm_median_s']['median'] * 1e3:.2f} ms")
    print("   cell wall time in the kernel (whole cell, incl. build + DDP wrap), median: "
          + ", ".join(f"{v} {steps[v]['cell_wall_s']['median']:.2f} s" for v in JDIST_VARIANTS)
          + f"; plain torchrun process wall {steps['plain']['process_wall_s']['median']:.2f} s")
    print("   CPU used outside the ranks during the cell, median: "
          + ", ".join(f"{v} kernel {steps[v]['kernel_cpu_s']['median']:.2f} s"
                      + (f" + controller {steps[v]['controller_cpu_s']['median']:.2f} s" if "controller_cpu_s" in steps[v] else "")
                      + f" + client (nbclient) {steps[v]['client_cpu_s']['median']:.2f} s"
                      for v in JDIST_VARIANTS))
    losses = {v: steps[v]["final_loss"] for v in steps}
    print("   final loss (rank 0), same code path check: "
          + ", ".join(f"{v} {losses[v]:.6f}" for v in losses))
    f = res["first_cells"]
    print("   not in the table, the session's first training cell of each kind (warm-up round): "
          + ", ".join(f"{v} {f[v]['median_s'] * 1e3:.2f} ms/step, cell {f[v]['cell_wall_s']:.2f} s" for v in f))
    ld = res["load_1min"]
    print(f"   1-min load average during part 1: min {ld['min']:.2f}, median {ld['median']:.2f}, max {ld['max']:.2f} "
          f"(on {m['cpu_count']} cores)")
    print()
    c = res["cold"]
    print("2. Cold start (fresh kernel)")
    print(f"   kernel start (nbclient, until it ran one cell)        {c['kernel_start_s']:6.2f} s")
    print(f"   %load_ext jdist                                        {c['load_ext_s']:6.2f} s")
    print(f"   first %%distributed -n {RANKS} cell (pass), in kernel      {c['cold_start_s']:6.2f} s"
          f"   (nbclient round trip {c['cold_client_wall_s']:.2f} s)")
    if c.get("registered_s") is not None and c.get("ready_s") is not None:
        print(f"     of which (jdist's own progress lines): engines registered {c['registered_s']:.1f} s, "
              f"rank setup (import torch, process group) {c['ready_s'] - c['registered_s']:.1f} s, "
              f"ready at {c['ready_s']:.1f} s")
    print(f"   first %%distributed -n 4 cell (pass), another fresh kernel {c['cold_start_4_s']:6.2f} s")
    print(f"   %dist restart --fresh after section 3                  {c['restart_s']:6.2f} s")
    print(f"   %dist stop at the end                                  {c['stop_s']:6.2f} s")
    print()
    e = res["empty"]
    print(f"3. Warm empty-cell round trip, ms ({e['runs']} runs each, interleaved; timed in the kernel)")
    print(f"   {'cell':<42}{'min':>8}{'median':>9}{'p90':>9}")
    for k, label in (("distributed", "%%distributed pass"), ("px", "%%px pass (same engines)"),
                     ("execute", "view.execute('pass', block=True)")):
        d = e[k]
        print(f"   {label:<42}{ms(d['min'])}{ms(d['median']):>9}{ms(d['p90']):>9}")
    print(f"   ratio %%distributed / %%px (medians): {e['distributed']['median'] / e['px']['median']:.2f}x")
    print()
    c = res["comm"]
    print(f"4. Communication time per rank over the same {c['steps'][0]} steps, jdist's comm_time_s (DDP comm hook) "
          "vs torch.profiler's gloo:all_reduce events")
    print(f"   {'rank':<8}{'profiler':>12}{'jdist':>12}{'jdist/profiler':>16}{'events':>8}")
    for r, (p, j, n) in enumerate(zip(c["profiler_s"], c["jdist_s"], c["events"])):
        print(f"   {r:<8}{p * 1e3:>10.1f}ms{j * 1e3:>10.1f}ms{j / p:>15.3f}x{n:>8}")
    print()
    print_targets(res)
    print(f"total benchmark time: {res['total_s']:.1f} s")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="timed training steps per run (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up steps dropped before timing (default 20)")
    parser.add_argument("--repeats", type=int, default=9, help="runs of each training variant (default 9)")
    parser.add_argument("--empty-runs", type=int, default=30, help="empty cells timed per kind (default 30)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernelspec to run (default python3)")
    parser.add_argument("--json", metavar="PATH", help="also write all figures to this JSON file")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.repeats < 1 or args.empty_runs < 1:
        parser.error("--steps, --repeats and --empty-runs must be positive, --warmup non-negative")

    t_start = time.perf_counter()
    total_steps = args.steps + args.warmup
    res: dict[str, Any] = {
        "config": {"steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
                   "empty_runs": args.empty_runs, "ranks": RANKS, "kernel": args.kernel},
        "machine": machine(),
    }
    workdir = Path(tempfile.mkdtemp(prefix="jdist-bench-"))
    os.environ["JDIST_RUN_DIR"] = str(workdir / "runs")  # keep run logs out of the user's data dir
    kernel = Kernel(workdir, args.kernel)
    raw: dict[str, list[dict[str, Any]]] = {v: [] for v in ["plain", *JDIST_VARIANTS]}
    kernel_log = open(workdir / "kernel-stderr.log", "w")  # the kernel's own warnings, shown on failure
    try:
        print("starting a Jupyter kernel...", flush=True)
        cold: dict[str, Any] = {"kernel_start_s": kernel.start(stderr=kernel_log)}
        rec, _ = kernel.run_one(SETUP_CELL)
        cold.update(rec)
        print(f"cold start: first %%distributed -n {RANKS} cell...", flush=True)
        recs, text, wall = kernel.run(COLD_CELL.format(n=RANKS))
        if len(recs) != 1:
            sys.exit(f"the cold-start cell printed no result; its output was:\n{text}")
        cold.update(recs[0], cold_client_wall_s=wall)
        # jdist's own progress lines: "2 rank(s) registered after 6.9 s; ..." and "Ready: ... (10.0 s)."
        reg = re.search(r"registered after ([0-9.]+) s", text)
        ready = re.search(r"Ready: .*\(([0-9.]+) s\)", text)
        cold["registered_s"] = float(reg.group(1)) if reg else None
        cold["ready_s"] = float(ready.group(1)) if ready else None

        # Round 0, not in the table: the first training cells of the session pay one-off costs
        # (the kernel imports ipywidgets/anywidget and opens the chart library widget for the first dashboard).
        first: dict[str, Any] = {}
        for v in JDIST_VARIANTS:
            print(f"warm-up round: {v}...", flush=True)
            r = run_jdist(kernel, v, total_steps)
            first[v] = {"cell_wall_s": r["wall_s"], "median_s": step_summary(r["times"], args.warmup)["median_s"]}
        res["first_cells"] = first

        order = ["plain", *JDIST_VARIANTS]
        loads = [os.getloadavg()[0]]
        for rep in range(args.repeats):
            k = rep % len(order)
            for v in order[k:] + order[:k]:
                print(f"repeat {rep + 1}/{args.repeats}: {v}...", flush=True)
                raw[v].append(run_plain(total_steps, workdir) if v == "plain" else run_jdist(kernel, v, total_steps))
                loads.append(os.getloadavg()[0])
        res["load_1min"] = spread(loads)

        print(f"warm empty cells: {args.empty_runs} x 3 kinds...", flush=True)
        rec, _ = kernel.run_one(EMPTY_CELL.format(n=args.empty_runs))
        res["empty"] = {"runs": args.empty_runs}
        for k, xs in rec.items():
            res["empty"][k] = {**spread(xs), "p90": quantile(xs, 0.9)}
        print("communication time vs torch.profiler...", flush=True)
        comm_code = COMM_CODE.format(path=str(PLAIN_SCRIPT), total=total_steps, warmup=args.warmup)
        res["comm"], _ = kernel.run_one(COMM_CELL.format(code=comm_code, warmup=args.warmup, ranks=RANKS))
        print("%dist restart, then %dist stop...", flush=True)
        rec, _ = kernel.run_one(RESTART_CELL)
        cold.update(rec)
        rec, _ = kernel.run_one(STOP_CELL)
        cold.update(rec)
        res["cold"] = cold
    except BaseException:
        try:  # do not leave engines behind if the kernel were killed rather than shut down
            kernel.run("get_ipython().run_line_magic('dist', 'stop')")
        except BaseException:
            pass
        log = workdir / "kernel-stderr.log"
        if log.exists() and log.stat().st_size:
            print("kernel stderr (last lines):\n" + "\n".join(log.read_text().splitlines()[-30:]), file=sys.stderr)
        raise
    finally:
        kernel.stop()
        kernel_log.close()
    try:
        print("cold start of 4 ranks in another fresh kernel...", flush=True)
        res["cold"]["cold_start_4_s"] = cold_start(workdir, args.kernel, 4)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    steps: dict[str, Any] = {}
    for v, runs in raw.items():
        sums = [step_summary(r["times"], args.warmup) for r in runs]
        entry: dict[str, Any] = {
            "median_s": spread([s["median_s"] for s in sums]),
            "p90_s": spread([s["p90_s"] for s in sums]),
            "mean_s": spread([s["mean_s"] for s in sums]),
            "per_repeat": sums,
            "final_loss": runs[-1]["loss"][0],
            "threads": runs[-1]["threads"],
        }
        if v == "plain":
            entry["process_wall_s"] = spread([r["wall_s"] for r in runs])
            entry["teardown_failures"] = sum(r["exit_code"] != 0 for r in runs)
            entry["retries"] = sum(r["attempts"] - 1 for r in runs)
        else:
            entry["cell_wall_s"] = spread([r["wall_s"] for r in runs])
            entry["kernel_cpu_s"] = spread([r["kernel_cpu_s"] for r in runs])
            entry["client_cpu_s"] = spread([r["client_cpu_s"] for r in runs])
            if all(r["controller_cpu_s"] is not None for r in runs):
                entry["controller_cpu_s"] = spread([r["controller_cpu_s"] for r in runs])
            entry["paired_ratio"] = spread([s["median_s"] / p["median_s"] for s, p in
                                            zip(sums, (step_summary(r["times"], args.warmup) for r in raw["plain"]))])
            hists = [r["history"] for r in runs if r.get("history")]
            if hists:
                entry["history_rows"] = [h["rows"] for h in hists]
                entry["history_median_s"] = spread([step_summary(h["step_time_s"], args.warmup)["median_s"] for h in hists])
                entry["history_comm_median_s"] = spread([step_summary(h["comm_time_s"], args.warmup)["median_s"]
                                                         for h in hists])
        steps[v] = entry
    res["steps"] = steps
    res["log_call"] = log_call_cost()
    res["total_s"] = time.perf_counter() - t_start
    print_report(res)
    for v in JDIST_VARIANTS:
        rows = steps[v].get("history_rows")
        if rows and any(r != RANKS * total_steps for r in rows):
            print(f"WARNING: {v}: jdist history had {rows} rows, expected {RANKS * total_steps} per run")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        print(f"figures written to {args.json}")
    return res


if __name__ == "__main__":
    main()
