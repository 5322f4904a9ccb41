"""Does the kernel stay small and quick as runs grow long and wide? (issue 26)

Six measurements, one table each, targets beside the figures:

1. **Memory per record**: a run's values in the kernel (``Run.nbytes``, and everything the run
   object holds by ``tracemalloc``), for 2 CPU ranks logging 3 scalars and for 8 ranks logging 3
   scalars with every automatic metric set; beside them the same records in the dict store jdist
   had before (commit ``BEFORE``, read from git; skipped without the history).
2. **RSS over 10 runs of 200k records** (2 ranks x 100k steps), in a fresh process going through
   the kernel's own path (the pickled data messages decoded, one batch per poll, the run log
   written, ``KernelRuns`` and the memory budget): RSS after each run, with the default budget
   and with a 64 MiB one; then a released run read back.
3. **Ingest**: the kernel's CPU per record on that path, in process (the messages encoded as the
   ranks encode them; records/s one core sustains); and end to end, a real kernel and 8 real CPU ranks each logging 20,000 steps as
   fast as they can (the kernel's CPU over the cell, and the cell's wall time).
4. **Live aggregation at 64/256/512 ranks**: synthetic records (no processes) at 10 logs/s per
   rank for 30 simulated seconds, fed to the live dashboard (``Dashboard.feed``/``update``, every
   0.25 s) exactly as the supervisor does: its CPU as a share of one core.
5. **The run view at 512 ranks** (64 hosts) in JupyterLab and real Chromium, for a run being
   written at 10 logs/s per rank: from Open to the heatmap drawn, the server's answer for the
   view, and from records written to the view showing them.
6. **Cold start against its floor** at 2, 4, 8 and 16 ranks: the first ``%%distributed -n N``
   cell (body ``pass``) in a fresh kernel, beside N ranks under plain ``mpiexec`` that only import
   torch and make a gloo group, alternated, best of 3.

Usage::

    .venv/bin/python benchmarks/bench_scale.py [--json out.json] [--skip-kernel] [--skip-browser] [--skip-cold | --only-cold]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

#: The commit whose dict-per-record store the figures are compared with.
BEFORE = "53a1c49"
TARGETS = {"bytes_per_record": 150, "ingest_per_s": 200_000, "aggregation_512_core": 0.10}
AUTO_CPU = {"comm_time_s": None, "compute_time_s": None, "samples_per_s": None, "state_bytes": None,
            "param_bytes": None, "grad_bytes": None, "optim_bytes": None}


def record(rank: int, step: int, full: bool) -> dict[str, Any]:
    """A record as ``jdist.log`` makes it on a CPU rank: 3 scalars and the automatic metrics
    (``full``: every one set, as with a prepared model under DDP)."""
    rec = {"rank": rank, "cell": 3, "seq": step, "step": step, "time": 1.7e9 + step * 0.01 + rank * 1e-4,
           "loss": random.random(), "acc": random.random(), "lr": 1e-3, "step_time_s": 0.01 + random.random() * 1e-3,
           "mem_bytes": 300_000_000 + step, "mem_peak_bytes": 310_000_000, **AUTO_CPU}
    if full:
        rec.update(comm_time_s=0.002, compute_time_s=0.008, samples_per_s=3200.0, state_bytes=3 * 2**20,
                   param_bytes=2**20, grad_bytes=2**20, optim_bytes=2**20)
    return rec


def messages(world: int, steps: int, batch: int = 50, full: bool = False, columns: bool = True) -> list[bytes]:
    """The ranks' data messages as they arrive: each rank's batches, the ranks interleaved; encoded
    as the ranks do (:func:`jdist.codec.encode_data`: the records as columns), or (``columns``
    False) as pickled dicts, as before."""
    from jdist.codec import encode_data

    per_rank = []
    for r in range(world):
        out = []
        for start in range(0, steps, batch):
            msg = {"v": 1, "kind": "records", "cell": 3,
                   "records": [record(r, s, full) for s in range(start, min(start + batch, steps))]}
            out.append(encode_data(msg) if columns else pickle.dumps(msg, protocol=5))
        per_rank.append(out)
    return [m for group in zip(*per_rank) for m in group]


def before_run_class() -> Any:
    """``Run`` as it was at ``BEFORE`` (records kept as dicts), or None without git history."""
    try:
        src = subprocess.run(["git", "show", f"{BEFORE}:jdist/metrics/records.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    src = src.replace("from .stats import", "from jdist.metrics.stats import")
    spec = importlib.util.spec_from_loader("jdist_records_before", loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # dataclasses looks the module up
    exec(compile(src, f"{BEFORE}:jdist/metrics/records.py", "exec"), module.__dict__)
    return module.Run


# -- 1. memory per record ----------------------------------------------------------------------


def bytes_per_record(world: int, steps: int, full: bool) -> dict[str, Any]:
    from jdist.metrics import Run
    from jdist.metrics.store import RecordBatch

    msgs = messages(world, steps, full=full, columns=False)
    n = world * steps
    out: dict[str, Any] = {"world": world, "steps": steps, "full": full}
    for label, make, add in (("now", lambda: Run("m", world),
                              lambda run, recs: run.add_batch(RecordBatch.from_records(recs))),
                             ("before", before_run_class(), lambda run, recs: run.add(recs))):
        if make is None:
            continue
        gc.collect()
        tracemalloc.start()
        run = make() if label == "now" else make("m", world)
        for m in msgs:
            add(run, pickle.loads(m)["records"])
        if label == "now":
            run.finished_adding()
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[label] = {"traced_per_record": held / n}
        if label == "now":
            out[label]["nbytes_per_record"] = run.nbytes / n
        del run
    return out


# -- 2. RSS over many runs ------------------------------------------------------------------------

RSS_SCRIPT = r"""
import gc, json, os, pickle, sys, tempfile, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {here!r})
from bench_scale import messages
from jdist.codec import decode_data
from jdist.metrics import Run, budget
from jdist.kernel import sinks
from jdist.metrics.store import RecordBatch
import pandas  # what the kernel has loaded anyway (history)

def rss_mb():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

if {max_mb} is not None:
    budget.configure(max_mb={max_mb})
root = tempfile.mkdtemp()
msgs = messages(2, {steps})  # the same records each run (new ids): decoding is what costs
out = {{"start_mb": rss_mb(), "after": []}}
for i in range({runs}):
    run = Run(f"run{{i:02d}}", 2)
    made = [sinks.KernelRuns(), sinks.RunLogSink(root)]
    for s in made:
        s.start(run)
    pending = []
    for k, m in enumerate(msgs):
        pending.append(decode_data(m)["records"])
        if k % 40 == 39 or k == len(msgs) - 1:  # one batch per poll, as RecordCollector.flush
            new = run.add_batch(RecordBatch.concat(pending))
            pending = []
            for s in made:
                s.add(new)
    run.status, run.ended = "finished", time.time()
    for s in made:
        s.finish(run)
    gc.collect()
    out["after"].append(rss_mb())
first = sinks.runs()[0]
out["first_released"] = first.released
t0 = time.perf_counter()
hist = first.history
out["reload_s"] = time.perf_counter() - t0
out["reload_rows"] = len(hist)
out["budget"] = budget.configure()
print("@@" + json.dumps(out))
"""


def rss_over_runs(runs: int, steps: int, max_mb: float | None) -> dict[str, Any]:
    script = RSS_SCRIPT.format(root=str(ROOT), here=str(HERE), steps=steps, runs=runs, max_mb=max_mb)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@")), None)
    if line is None:
        sys.exit(f"the RSS measurement failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(line[2:])


# -- 3. ingest -------------------------------------------------------------------------------------


def ingest_in_process(world: int, steps: int, full: bool) -> dict[str, Any]:
    """The kernel's path for each record: the ranks' messages decoded, one batch per poll added to
    the run, the run log written."""
    from jdist.codec import decode_data
    from jdist.metrics import Run, RunLog
    from jdist.metrics.store import RecordBatch

    msgs = messages(world, steps, full=full)
    n = world * steps
    run = Run("ingest", world)
    log = RunLog(run, tempfile.mkdtemp())
    per_poll = max(1, len(msgs) // max(1, n // 2000))  # ~2000 records a poll
    t0, c0 = time.perf_counter(), time.process_time()
    pending: list[RecordBatch] = []
    for k, m in enumerate(msgs):
        pending.append(decode_data(m)["records"])
        if k % per_poll == per_poll - 1 or k == len(msgs) - 1:
            log.append(run.add_batch(RecordBatch.concat(pending)))
            pending = []
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    log.close()
    assert run.count() == n
    return {"world": world, "records": n, "cpu_us_per_record": cpu / n * 1e6, "per_s_one_core": n / cpu,
            "wall_s": wall}


INGEST_SETUP = """
import json, resource, time
get_ipython().run_line_magic("load_ext", "jdist")
def _cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
"""
INGEST_START = "%%distributed -n {n} --no-dashboard\nimport random"
INGEST_CELL = """_c0, _t0 = _cpu(), time.perf_counter()
get_ipython().run_cell_magic("distributed", "--no-dashboard", '''
for i in range({steps}):
    jdist.log(step=i, loss=random.random(), acc=0.5, lr=1e-3)
''')
_run = jdist.last_run()
print("@@" + json.dumps({{"cpu_s": _cpu() - _c0, "wall_s": time.perf_counter() - _t0, "records": _run.count(),
                         "span_s": _run.time_span()[1][1] - _run.time_span()[0][1]}}))
"""


def ingest_end_to_end(n: int, steps: int) -> dict[str, Any]:
    """A real kernel and ``n`` real CPU ranks each logging ``steps`` steps as fast as they can."""
    sys.path.insert(0, str(HERE))
    from bench_overhead import Kernel

    workdir = Path(tempfile.mkdtemp())
    kernel = Kernel(workdir, "python3")
    env_dir = tempfile.mkdtemp()
    os.environ["JDIST_RUN_DIR"] = env_dir
    with open(workdir / "kernel-stderr.log", "w") as err:
        kernel.start(stderr=err)
        try:
            kernel.run(INGEST_SETUP)
            kernel.run(INGEST_START.format(n=n))
            runs = []
            for count in (1, steps):  # a cell of one step: the cost of a cell, without the records
                _, text, _ = kernel.run(INGEST_CELL.format(steps=count))
                line = next((ln for ln in text.splitlines() if ln.startswith("@@")), None)
                if line is None:
                    sys.exit(f"the end-to-end ingest cell printed no result:\n{text}")
                runs.append(json.loads(line[2:]))
            kernel.run('get_ipython().run_line_magic("dist", "stop")')
        finally:
            kernel.stop()
    empty, res = runs
    res.update(ranks=n, steps=steps, kernel_core=res["cpu_s"] / res["wall_s"], empty_cell_cpu_s=empty["cpu_s"],
               cpu_us_per_record=(res["cpu_s"] - empty["cpu_s"]) / res["records"] * 1e6)
    return res


# -- 4. live aggregation ---------------------------------------------------------------------------


def aggregation(world: int, seconds: float = 30.0, rate: float = 10.0) -> dict[str, Any]:
    """The live dashboard's CPU at ``world`` ranks logging ``rate`` times a second (simulated clock)."""
    from jdist.kernel.dashboard import Dashboard
    from jdist.metrics.store import RecordBatch
    from jdist.metrics import Run

    run = Run("agg", world, total_steps=int(seconds * rate))
    board = Dashboard(run)
    poll, redraw = 0.05, 0.25
    steps = int(seconds * rate)
    step_of = [0] * world
    cpu = 0.0
    t = 0.0
    next_draw = 0.0
    while min(step_of) < steps:
        t += poll
        recs = []
        for r in range(world):  # every rank has logged the steps due by now (its pace varies a little)
            due = min(steps, int(t * rate * (1.0 - 0.02 * (r % 7) / 7)))
            for s in range(step_of[r], due):
                rec = record(r, s, full=True)
                rec["seq"] = s
                recs.append(rec)
            step_of[r] = max(step_of[r], due)
        c0 = time.process_time()
        if recs:
            board.feed(run.add_batch(RecordBatch.from_records(recs)))
        if t >= next_draw:
            board.update(force=True)
            next_draw = t + redraw
        cpu += time.process_time() - c0
    return {"world": world, "records": run.count(), "sim_s": t, "cpu_s": cpu, "core": cpu / t}


# -- 5. the run view at 512 ranks in a real browser --------------------------------------------------

BROWSER_TARGETS = {"first_paint_s": 2.0, "update_p90_s": 2.0}


def browser_view(world: int = 512, hosts: int = 64, seconds: float = 20.0) -> dict[str, Any]:
    """A running ``world``-rank run (the benchmark appends 5 steps of every rank each 0.5 s, 10 logs/s
    per rank, with the kernel's run log) in JupyterLab's run view: from Open to the heatmap drawn;
    the server's answer for the view (every panel of 512 ranks); and from records written to the
    view showing them (it polls every second)."""
    import urllib.request

    sys.path.insert(0, str(ROOT / "tests"))
    from labserver import JupyterServerProcess
    from playwright.sync_api import sync_playwright

    from jdist.metrics import Run, RunLog, new_run_id

    chromium = Path(os.environ.get("JDIST_CHROMIUM", "/usr/bin/chromium"))
    if not chromium.exists():
        sys.exit(f"no chromium at {chromium}: run tools/install_chromium.sh (make test does)")
    base = Path(tempfile.mkdtemp(prefix="jdist-bench-scale-"))
    lab = JupyterServerProcess(base, app="lab", extra_args=["--LabApp.expose_app_in_browser=True"])
    lab.start()
    per_host = world // hosts
    run = Run(new_run_id(), world, backend="ddp", hosts={r: f"node{r // per_host:03d}" for r in range(world)})
    log = RunLog(run, lab.dirs["runs"])
    step = 0

    def append(steps: int) -> float:
        nonlocal step
        recs = [dict(record(r, s, full=True), seq=s, time=time.time()) for s in range(step, step + steps)
                for r in range(world)]
        log.append(run.add(recs))
        step += steps
        return time.time()

    append(20)
    out: dict[str, Any] = {"world": world, "hosts": hosts}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1500, "height": 1300})
            page.goto(f"{lab.url}/lab?token={lab.token}")
            page.locator("li.lm-TabBar-tab[data-id='jdist-sidebar']").click()
            card = page.locator(f"#jdist-sidebar .jp-jdist-run[data-run-id='{run.run_id}']")
            card.wait_for(timeout=60_000)
            t0 = time.perf_counter()
            card.locator(".jp-jdist-open").click()
            page.locator(".jp-jdist-runview .jp-jdist-chart-step_heat image.jp-jdist-heat").wait_for(timeout=60_000)
            out["first_paint_s"] = time.perf_counter() - t0
            url = f"{lab.url}/jdist/api/runs/{run.run_id}?token={lab.token}"
            lags, answers = [], []
            body = b""
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                written = append(5)
                count = run.count()
                if len(lags) % 2:  # every other batch: the server's answer with the new records (not cached)
                    a = time.perf_counter()
                    with urllib.request.urlopen(url) as resp:
                        body = resp.read()
                    answers.append(time.perf_counter() - a)
                page.wait_for_function("(n) => Number(document.querySelector('.jp-jdist-runview').dataset.records)"
                                       " >= n", arg=count, timeout=30_000)
                lags.append(time.time() - written)
                time.sleep(max(0.0, 0.5 - (time.time() - written)))
            out["detail_p50_s"] = statistics.median(answers)
            out["detail_kib"] = len(body) / 1024
            out["update_p50_s"] = statistics.median(lags)
            out["update_p90_s"] = sorted(lags)[int(0.9 * (len(lags) - 1))]
            out["records"] = run.count()
            shots = ROOT / "build" / "screenshots"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "bench-run-view-512-ranks.png"))
            browser.close()
    finally:
        log.close()
        lab.stop()
    return out


# -- 6. cold start against its floor -----------------------------------------------------------------

FLOOR = r"""
import os, sys, torch, torch.distributed as dist
rank, world = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=rank, world_size=world)
dist.barrier()
dist.destroy_process_group()
"""
COLD_TARGET = 1.20


def floor_s(n: int) -> float:
    """Seconds for ``n`` ranks under plain ``mpiexec`` to import torch, make a gloo group and end: the
    least a first ``%%distributed -n <n>`` cell can take (jdist's ranks do that too)."""
    import socket

    from jdist.kernel.launch.local_mpi import local_mpiexec

    script = Path(tempfile.mkdtemp()) / "floor.py"
    script.write_text(FLOOR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t0 = time.perf_counter()
    subprocess.run([local_mpiexec(), "-n", str(n), sys.executable, str(script), str(port)], check=True, timeout=600)
    return time.perf_counter() - t0


def cold_starts(sizes: tuple[int, ...] = (2, 4, 8, 16), repeats: int = 3) -> list[dict[str, Any]]:
    """The first ``%%distributed -n <n>`` cell in a fresh kernel (``bench_overhead.cold_start``)
    beside its floor, alternated, best of ``repeats`` each (the floor alone moves by 20% between runs here)."""
    sys.path.insert(0, str(HERE))
    from bench_overhead import cold_start

    os.environ.setdefault("JDIST_RUN_DIR", tempfile.mkdtemp())
    out = []
    for n in sizes:
        jd, fl = [], []
        for _ in range(repeats):
            fl.append(floor_s(n))
            jd.append(cold_start(Path(tempfile.mkdtemp()), "python3", n))
        out.append({"ranks": n, "jdist_s": min(jd), "floor_s": min(fl), "jdist_all": jd, "floor_all": fl,
                    "ratio": min(jd) / min(fl)})
    return out


# -- report ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--skip-kernel", action="store_true", help="leave out the end-to-end run with a real kernel")
    ap.add_argument("--skip-browser", action="store_true", help="leave out the run view in a real browser")
    ap.add_argument("--skip-cold", action="store_true", help="leave out cold start against its floor")
    ap.add_argument("--only-cold", action="store_true", help="only cold start against its floor")
    args = ap.parse_args(argv)
    random.seed(0)
    res: dict[str, Any] = {}

    if not args.only_cold:
        print("1. Kernel memory per record (a run's values; tracemalloc: all the run object holds)")
        print(f"   {'scenario':44} {'now: values':>12} {'now: all':>10} {'before':>10}  target")
        res["memory"] = []
        for world, steps, full, label in ((2, 50_000, False, "2 ranks, 3 scalars, CPU metrics"),
                                          (8, 12_500, True, "8 ranks, 3 scalars, every automatic metric")):
            m = bytes_per_record(world, steps, full)
            res["memory"].append(m)
            before = f"{m['before']['traced_per_record']:.0f} B" if "before" in m else "n/a"
            worst = max(m["now"]["traced_per_record"], m["now"]["nbytes_per_record"])
            met = "met" if worst <= TARGETS["bytes_per_record"] else "MISSED"
            print(f"   {label:44} {m['now']['nbytes_per_record']:>10.0f} B {m['now']['traced_per_record']:>8.0f} B "
                  f"{before:>10}  <= {TARGETS['bytes_per_record']} B: {met}")

        print("\n2. Kernel RSS over 10 runs of 200,000 records (2 ranks x 100,000 steps), fresh process")
        res["rss"] = {}
        for label, max_mb in (("default budget (512 MiB, 10 runs)", None), ("budget 64 MiB", 64)):
            r = rss_over_runs(10, 100_000, max_mb)
            res["rss"][label] = r
            growth = r["after"][-1] - r["start_mb"]
            cap = r["budget"]["max_mb"]
            print(f"   {label:34} start {r['start_mb']:.0f} MiB, after each run: "
                  + " ".join(f"{x:.0f}" for x in r["after"]))
            print(f"   {'':34} growth {growth:.0f} MiB (budget {cap:.0f} MiB: {'met' if growth <= cap else 'MISSED'}); "
                  f"held {r['budget']['held_mb']:.0f} MiB in {r['budget']['runs_in_memory']} runs, "
                  f"{r['budget']['runs_released']} released; the first run's history "
                  + (f"read back from disk in {r['reload_s']:.2f} s" if r["first_released"] else
                     f"(in memory) in {r['reload_s']:.2f} s") + f" ({r['reload_rows']:,} rows)")

        print("\n3. Ingest into the kernel")
        res["ingest"] = [ingest_in_process(2, 100_000, False), ingest_in_process(8, 25_000, True)]
        for g in res["ingest"]:
            met = "met" if g["per_s_one_core"] >= TARGETS["ingest_per_s"] else "MISSED"
            print(f"   in process, {g['world']} ranks: {g['cpu_us_per_record']:.2f} us CPU per record -> "
                  f"{g['per_s_one_core']:,.0f} records/s on one core (target >= {TARGETS['ingest_per_s']:,}: {met})")
        if not args.skip_kernel:
            e = ingest_end_to_end(8, 20_000)
            res["end_to_end"] = e
            print(f"   real kernel, 8 CPU ranks x 20,000 steps: {e['records']:,} records, cell {e['wall_s']:.1f} s "
                  f"(ranks logging for {e['span_s']:.1f} s), kernel CPU {e['cpu_s']:.2f} s = "
                  f"{e['kernel_core']:.0%} of a core; a cell of 1 step {e['empty_cell_cpu_s']:.2f} s: "
                  f"{e['cpu_us_per_record']:.1f} us per record -> {1e6 / e['cpu_us_per_record']:,.0f} records/s on one core")
            print("   (issue 26 measured the same cell before: 3.8 s, the kernel at ~80% of a core)")

        print("\n4. Live dashboard aggregation, synthetic ranks at 10 logs/s each (records fed every 0.05 s,"
              " redrawn every 0.25 s)")
        res["aggregation"] = []
        for world in (64, 256, 512):
            a = aggregation(world)
            res["aggregation"].append(a)
            target = f" (target <= {TARGETS['aggregation_512_core']:.0%}: " \
                     f"{'met' if a['core'] <= TARGETS['aggregation_512_core'] else 'MISSED'})" if world == 512 else ""
            print(f"   {world:4} ranks: {a['records']:>7,} records over {a['sim_s']:.0f} s: "
                  f"{a['core']:.1%} of a core{target}")
    if not (args.skip_browser or args.only_cold):
        b = browser_view()
        res["browser"] = b
        print(f"\n5. The sidebar's run view of a running run, {b['world']} ranks on {b['hosts']} hosts, real Chromium")
        print(f"   Open -> heatmap drawn: {b['first_paint_s']:.2f} s (target <= {BROWSER_TARGETS['first_paint_s']} s: "
              f"{'met' if b['first_paint_s'] <= BROWSER_TARGETS['first_paint_s'] else 'MISSED'})")
        print(f"   the server's answer for the view (every panel): p50 {b['detail_p50_s'] * 1e3:.0f} ms, "
              f"{b['detail_kib']:.0f} KiB")
        print(f"   records written -> shown (the view polls every 1 s): p50 {b['update_p50_s']:.2f} s, p90 "
              f"{b['update_p90_s']:.2f} s (target <= {BROWSER_TARGETS['update_p90_s']} s: "
              f"{'met' if b['update_p90_s'] <= BROWSER_TARGETS['update_p90_s'] else 'MISSED'}); "
              f"{b['records']:,} records")
    if not args.skip_cold:
        print("\n6. Cold start: the first %%distributed -n N cell (body pass) in a fresh kernel, against the floor"
              "\n   (N ranks under plain mpiexec: import torch, a gloo group, end); best of 3, alternated")
        res["cold"] = cold_starts()
        print(f"   {'ranks':>5} {'jdist':>8} {'floor':>8} {'ratio':>6}  target")
        for c in res["cold"]:
            met = "met" if c["ratio"] <= COLD_TARGET else "MISSED"
            print(f"   {c['ranks']:>5} {c['jdist_s']:>7.2f}s {c['floor_s']:>7.2f}s {c['ratio']:>5.2f}x  "
                  f"<= {COLD_TARGET:.2f}x: {met}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
