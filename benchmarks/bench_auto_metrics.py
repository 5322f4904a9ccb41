"""Automatic metrics (records without ``jdist.log``) against torchrun: the same unchanged DDP script, 2 CPU ranks.

The script (written to a temporary folder) is what a torchrun user runs: ``init_process_group("gloo")``, its
own ``DistributedDataParallel`` and optimizer, no jdist at all. Rank 0 times every step (forward to after
``opt.step()``) with ``time.perf_counter`` and prints the median and mean. Three launches, interleaved in
each round (the order rotates), each a column:

* ``torchrun --standalone --nproc-per-node 2``;
* ``jdist run -n 2 --auto-metrics off`` (no hook installed: jdist's rank, nothing more);
* ``jdist run -n 2`` (automatic metrics on: a record per optimizer step with loss, step and comm time,
  memory; the DDP timed by its reducer's own clock; the plain view's sink, as stdout is a pipe).

Two sizes: an MLP 64 -> 64 -> 64 -> 1, batch 32 (~1 ms steps), and 64 -> 1024 -> 1024 -> 1 (~10 ms).
Rows: the median over ``--repeats`` rounds of each run's median step (and mean step). Targets, automatic
metrics on against torchrun: ≤ 1.03× at ~1 ms steps, ≤ 1.01× at ~10 ms steps.

Separate launches differ by tens of percent on a loaded 2-core machine, more than the hooks cost. So a
second table (``--in-process``, also run by default) measures the hooks' own cost where nothing else
varies: one process, one gloo rank, pinned to one core where it can be, the ~1 ms model's loop with a
jdist rank session and its publisher thread (records encoded as for the kernel, then dropped), blocks of
steps interleaved: no hooks, automatic metrics without timing the DDP, and all of them. The
target there is the 1 ms budget: ≤ 30 µs a step. (Until 2026-11-28 this table left the DDP's reads out: each
block's new ``AutoSteps`` did not know the DDP built before it, so only the reducer's statistics were paid for;
with the reads, every step, automatic metrics cost +92 µs. They are now read on a sample of short steps.)

``--reads-only`` (also run by default) counts, over 3000 steps of that loop, the reads of the DDP's statistics and
those that found nothing new (each a wasted 30-50 µs; target: under 10%).

A third table (``--comm-check-only``, also run by default) checks the communication time the records carry
for a DDP timed by its reducer: the ~10 ms model (two buckets) under ``jdist run -n 2``, rank 0's
``comm_time_s`` against the union of each step's ``gloo:all_reduce`` events in torch.profiler, the same
50 steps (medians). DDP's interval ends with the backward pass, so it may only be longer.

Times on this machine move by more than the hooks cost, so two counts that do not depend on the machine's
load follow (also run by default): the Python opcodes the hooks add to a step, by function (``--opcodes-only``:
``sys.settrace`` over 200 steps of the in-process loop, the DDP timed as in a run; seconds), and, with
``--instructions`` (valgrind's callgrind; about 10 minutes), the machine instructions of the training thread per
step with automatic metrics off and on, from two runs of each (200 and 1200 steps; the difference leaves out
Python's start and torch's import). Target: ≤ 1.03× the instructions without hooks, the 1 ms budget in a unit that
a loaded machine does not move. Instructions are not time: the in-process table's time is more than the hooks'
share of the instructions (cache misses, say, which these counts leave out); and the publisher thread's work
(about 13 µs a record on this machine) runs beside the training thread, on another core where there is one.

Usage::

    .venv/bin/python benchmarks/bench_auto_metrics.py [--repeats 5] [--steps 1000] [--json auto.json] [--instructions]
    .venv/bin/python benchmarks/bench_auto_metrics.py --in-process-only [--blocks 30]
    .venv/bin/python benchmarks/bench_auto_metrics.py --comm-check-only
    .venv/bin/python benchmarks/bench_auto_metrics.py --opcodes-only [--instructions]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent

SCRIPT = """import sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
steps, width = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)
for step in range(20):  # warm-up, not timed
    loss = (model(x) - y).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
times = []
for step in range(steps):
    t = time.perf_counter()
    loss = (model(x) - y).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    times.append(time.perf_counter() - t)
if rank == 0:
    times.sort()
    print(f"STEP_MEDIAN_S {times[len(times) // 2]:.7f} STEP_MEAN_S {sum(times) / len(times):.7f}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""

#: The comm-time check: the ~10 ms model's DDP (two buckets) under ``jdist run``; rank 0 profiles steps
#: ``PROFILED`` with torch.profiler and prints the median, over those steps, of the union of each step's
#: ``gloo:all_reduce`` events; the bench compares it with the same steps' ``comm_time_s`` in the run log.
PROFILED = range(100, 150)
PROFILE_SCRIPT = f"""import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function
from jdist.rank.backends.base import merged_seconds
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)
def step():
    loss = (model(x) - y).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
for _ in range({PROFILED.start}):
    step()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range({len(PROFILED)}):
        with record_function("bench_step"):
            step()
events = prof.events()
reduces = [(e.time_range.start, e.time_range.end) for e in events if e.name == "gloo:all_reduce"]
unions = sorted(merged_seconds([r for r in reduces if s.time_range.start <= r[0] < s.time_range.end])
                for s in events if s.name == "bench_step")
if dist.get_rank() == 0:
    print(f"PROFILED_US {{unions[len(unions) // 2]:.1f}} ALL_REDUCES {{len(reduces)}}", flush=True)
for _ in range(5):
    step()
"""

KINDS = ("torchrun", "jdist off", "jdist on")
#: (label, hidden width, step count factor), the targets: automatic metrics on / torchrun.
SIZES = (("~1 ms steps", 64, 1.0, 1.03), ("~10 ms steps", 1024, 0.3, 1.01))


def command(kind: str, *args: str) -> list[str]:
    if kind == "torchrun":
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "train.py", *args]
    auto = ["--auto-metrics", "off"] if kind == "jdist off" else []
    return [sys.executable, "-m", "jdist", "run", "-n", "2", "--no-live", *auto, "train.py", *args]


def run_once(kind: str, work: Path, steps: int, width: int, retried: bool = False) -> tuple[float, float]:
    out = subprocess.run(command(kind, str(steps), str(width)), cwd=work, capture_output=True, text=True, timeout=600,
                         check=False)
    if out.returncode != 0:
        if "terminate called without an active exception" in out.stderr and not retried:
            return run_once(kind, work, steps, width, True)  # gloo's teardown abort, seen under torchrun too
        raise SystemExit(f"{kind} failed:\n{out.stdout}\n{out.stderr}")
    for line in out.stdout.splitlines():
        if line.startswith("STEP_MEDIAN_S"):
            parts = line.split()
            return float(parts[1]), float(parts[3])
    raise SystemExit(f"{kind}: no step times in\n{out.stdout}\n{out.stderr}")


#: The in-process variants: (label, automatic metrics on, the DDP timed).
IN_PROCESS = (("no hooks", False, False), ("hooks, DDP not timed", True, False), ("automatic metrics on", True, True))


#: How often the DDP's reducer timed a step in the last in-process block (1: every step).
every = [0]


class Encoded:
    """What a rank's channel does to a message (encodes it), without a kernel to send it to."""

    def publish(self, message: object) -> None:
        from jdist.codec import encode_data

        encode_data(message)


def one_rank_group() -> None:
    """A one-rank gloo default group on a free loopback port (what :func:`in_process` and :func:`opcodes` train in)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def one_ms_model() -> Any:
    """The ~1 ms model (a 3-layer MLP of width 64) in DDP, seeded; its batch is ``torch.randn(32, 64)``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    return DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))


def in_process(blocks: int, per_block: int = 300) -> dict[str, tuple[float, float, float]]:
    """(median, mean, paired) step (s) of each :data:`IN_PROCESS` variant: the median over the blocks of each
    block's median and mean, blocks of ``per_block`` steps interleaved; ``paired``: the median over the rounds of
    the block's median less the same round's block without hooks (a round's blocks run within a second, so the
    machine's slower and faster minutes cancel). The mean also holds what the publisher thread does on the same
    core (a batch of records every 0.25 s), which the median leaves out."""
    import torch
    import torch.distributed as dist

    from jdist.rank import auto_metrics
    from jdist.rank.session import Publisher, local_session

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    one_rank_group()
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    every[0] = 0
    medians: dict[str, list[float]] = {label: [] for label, _, _ in IN_PROCESS}
    means: dict[str, list[float]] = {label: [] for label, _, _ in IN_PROCESS}
    with local_session(channel=Encoded()) as s:
        publisher = Publisher(s)
        loops = {}
        for label, auto, timed in IN_PROCESS:
            auto_metrics.disable(s)
            if auto:
                auto_metrics.enable(s)
            real = auto_metrics.AutoSteps.time_by_reducer
            if not timed:  # the split: the DDP built now is not timed (its reducer keeps no statistics)
                auto_metrics.AutoSteps.time_by_reducer = lambda *args, **kwargs: None
            model = one_ms_model()
            auto_metrics.AutoSteps.time_by_reducer = real
            loops[label] = (auto, timed, model, torch.optim.SGD(model.parameters(), lr=0.01))
        for _ in range(blocks):
            for label, (auto, timed, model, opt) in loops.items():
                auto_metrics.disable(s)
                if auto:
                    steps = auto_metrics.enable(s)  # a new AutoSteps: the DDP is given to it again
                    if timed:
                        steps.time_by_reducer(model)
                times = []
                for _ in range(per_block):
                    t = time.perf_counter()
                    loss = (model(x) - y).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    times.append(time.perf_counter() - t)
                if auto and timed:
                    every[0] = steps.reduced[0].every
                means[label].append(sum(times) / len(times))
                times.sort()
                medians[label].append(times[len(times) // 2])
                s.end_cell()
                s.begin_cell()
        publisher.stop()
        auto_metrics.disable(s)
    dist.destroy_process_group()
    base = medians[IN_PROCESS[0][0]]
    return {label: (statistics.median(medians[label]), statistics.median(means[label]),
                    statistics.median(m - b for m, b in zip(medians[label], base))) for label in medians}


def print_in_process(blocks: int) -> dict[str, tuple[float, float, float]]:
    steps = in_process(blocks)
    base, base_mean, _ = steps["no hooks"]
    print(f"\nthe hooks' own cost: one process, one gloo rank, one core, the ~1 ms model, {blocks} blocks of 300 "
          "steps interleaved (median over the blocks; paired: median over the rounds of each round's difference)\n")
    print(f"{'':<24} {'median':>9} {'added':>9} {'paired':>9} {'mean':>9} {'added':>9}  target (paired)  ok")
    for label, (step, mean, paired) in steps.items():
        target = "≤ 30 µs" if label == "automatic metrics on" else ""
        ok = ("yes" if 1e6 * paired <= 30 else "NO") if target else ""
        print(f"{label:<24} {1e6 * step:>6.1f} µs {1e6 * (step - base):>+6.1f} µs {1e6 * paired:>+6.1f} µs "
              f"{1e6 * mean:>6.1f} µs {1e6 * (mean - base_mean):>+6.1f} µs  {target:<15} {ok}")
    print(f"(the DDP's communication timed on every {every[0]}th step at this step time: the others' records have "
          "no comm time; auto_metrics.READ_EVERY_S)")
    return steps


#: The loop whose instructions are counted: one gloo rank, the ~1 ms model, a rank session with its publisher thread,
#: automatic metrics ``on`` or ``off`` (argv 1), ``steps`` steps after 30 (argv 2). The DDP is read on every 10th
#: step, as at ~1 ms steps outside valgrind (which runs the loop ~50x slower).
COUNT_SCRIPT = """import socket, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from jdist.codec import encode_data
from jdist.rank import auto_metrics
from jdist.rank.session import Publisher, local_session
auto_metrics.READ_EVERY_S = 1e9
class Encoded:
    def publish(self, message): encode_data(message)
mode, steps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
x, y = torch.randn(32, 64), torch.randn(32, 1)
with local_session(channel=Encoded()) as s:
    publisher = Publisher(s)
    if mode == "on":
        auto_metrics.enable(s)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(30 + steps):
        loss = (model(x) - y).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    s.end_cell()
    publisher.stop()
    auto_metrics.disable(s)
dist.destroy_process_group()
"""


def opcodes(steps: int = 200) -> dict[str, float]:
    """Python opcodes per step of the in-process ~1 ms loop, by function (``file:name``), automatic metrics on
    (the DDP timed by its reducer, read every 10th step) less off; the key ``""`` holds the total without hooks."""
    import torch
    import torch.distributed as dist

    from jdist.rank import auto_metrics
    from jdist.rank.session import local_session

    one_rank_group()
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    root = str(Path(auto_metrics.__file__).parents[2]) + os.sep
    read_every = auto_metrics.READ_EVERY_S
    auto_metrics.READ_EVERY_S = 1e9  # every 10th step, whatever this machine's step time

    def count(auto: bool) -> collections.Counter[str]:
        seen: collections.Counter[str] = collections.Counter()

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            frame.f_trace_opcodes = True
            code = frame.f_code
            key = f"{code.co_filename.replace(root, '').split('site-packages' + os.sep)[-1]}:{code.co_name}"

            def local(frame: Any, event: str, arg: Any) -> Any:
                if event == "opcode":
                    seen[key] += 1
                return local

            return local

        with local_session(channel=Encoded()) as s:
            if auto:
                auto_metrics.enable(s)
            model = one_ms_model()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for i in range(50 + steps):
                if i == 50:
                    sys.settrace(tracer)
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            sys.settrace(None)
            s.end_cell()
            auto_metrics.disable(s)
        return seen

    try:
        off, on = count(False), count(True)
    finally:
        auto_metrics.READ_EVERY_S = read_every
        dist.destroy_process_group()
    added = {k: (on[k] - off[k]) / steps for k in set(on) | set(off) if on[k] != off[k]}
    return {"": sum(off.values()) / steps, **added}


def print_opcodes() -> dict[str, float]:
    added = opcodes()
    base = added.pop("")
    total = sum(added.values())
    print(f"\nPython opcodes per step (sys.settrace, 200 steps of the in-process loop): {base:.0f} without hooks, "
          f"{total:+.0f} with automatic metrics on ({100 * total / base:+.1f}%)\n")
    for key, n in sorted(added.items(), key=lambda kv: -abs(kv[1])):
        if abs(n) >= 1:
            print(f"{n:+8.1f}  {key}")
    return {"without": base, **added}


def instructions() -> dict[str, float] | None:
    """The training thread's instructions per step, automatic metrics off and on (callgrind, see the module doc);
    None without valgrind."""
    if shutil.which("valgrind") is None:
        print("\n(instructions: valgrind is not installed; skipped)")
        return None
    runs = [(mode, steps) for mode in ("off", "on") for steps in (200, 1200)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "count.py").write_text(COUNT_SCRIPT)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

        def start(mode: str, steps: int) -> subprocess.Popen[bytes]:
            return subprocess.Popen(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                                     f"--callgrind-out-file={work}/cg.{mode}.{steps}", sys.executable, "count.py",
                                     mode, str(steps)], cwd=work, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)

        for pair in (runs[:2], runs[2:]):  # two at a time (two cores)
            for proc in [start(*run) for run in pair]:
                if proc.wait() != 0:
                    raise SystemExit("valgrind's run of the counting loop failed")
        totals = {}
        for mode, steps in runs:
            text = (work / f"cg.{mode}.{steps}-01").read_text(errors="replace")  # thread 1: the training thread
            totals[(mode, steps)] = int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("summary:")))
    per_step = {mode: (totals[(mode, 1200)] - totals[(mode, 200)]) / 1000 for mode in ("off", "on")}
    ratio = per_step["on"] / per_step["off"]
    print(f"\ntraining thread instructions per step (callgrind, 1000 steps: 1200 less 200)\n")
    print(f"automatic metrics off  {per_step['off']:>10.0f}")
    print(f"automatic metrics on   {per_step['on']:>10.0f}  {per_step['on'] - per_step['off']:+.0f}  "
          f"{ratio:.3f}x  target ≤ 1.03x  {'yes' if ratio <= 1.03 else 'NO'}")
    return {**per_step, "ratio": ratio}


def comm_check(work: Path) -> dict[str, float]:
    """jdist's comm time (DDP timed by its reducer) against torch.profiler's all-reduces, same steps, rank 0."""
    from jdist.metrics.store import read_frames

    (work / "profiled.py").write_text(PROFILE_SCRIPT)
    runs = work / "runs-profiled"
    out = subprocess.run([sys.executable, "-m", "jdist", "run", "-n", "2", "--no-live", "profiled.py"], cwd=work,
                         capture_output=True, text=True, timeout=600, check=False,
                         env={**os.environ, "JDIST_RUN_DIR": str(runs)})
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("PROFILED_US")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"the comm check failed:\n{out.stdout}\n{out.stderr}")
    profiled_us, reduces = float(line.split()[1]), int(line.split()[3])
    batches, _ = read_frames(next(runs.iterdir()) / "metrics.jdc")
    comm = sorted(r["comm_time_s"] for b in batches for r in b if r["rank"] == 0 and r["step"] in PROFILED)
    jdist_us = 1e6 * comm[len(comm) // 2]
    print(f"\ncomm time per step, rank 0, {len(comm)} steps of the ~10 ms model ({reduces // len(PROFILED)} "
          "all-reduces a step), medians\n")
    print(f"jdist comm_time_s (DDP's reducer)          {jdist_us / 1000:7.3f} ms")
    print(f"torch.profiler gloo:all_reduce, union      {profiled_us / 1000:7.3f} ms")
    print(f"jdist / profiler                           {jdist_us / profiled_us:7.3f}  (DDP's interval runs from the "
          "first bucket's start to the end of the backward pass: an upper bound)")
    return {"jdist_us": jdist_us, "profiler_us": profiled_us}


def reads(steps: int = 3000) -> dict[str, Any]:
    """How often the DDP is read and how many reads find nothing new (each is a wasted 30-50 µs): the in-process
    ~1 ms loop with automatic metrics on, ``steps`` steps, ``AutoSteps._reduced`` counted."""
    import torch
    import torch.distributed as dist

    from jdist.rank import auto_metrics
    from jdist.rank.session import Publisher, local_session

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    one_rank_group()
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    counts = {"reads": 0, "empty": 0}
    real = auto_metrics.AutoSteps._reduced

    def counted(self: Any, now: bool) -> Any:
        ends = [r.end for r in self.reduced]
        out = real(self, now)
        if not now:
            counts["reads"] += 1
            counts["empty"] += [r.end for r in self.reduced] == ends
        return out

    auto_metrics.AutoSteps._reduced = counted  # type: ignore[method-assign]
    try:
        with local_session(channel=Encoded()) as s:
            publisher = Publisher(s)
            steps_ = auto_metrics.enable(s)
            model = one_ms_model()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            every: collections.Counter[int] = collections.Counter()
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                every[steps_.reduced[0].every] += 1
            per_step = (time.perf_counter() - t0) / steps
            s.end_cell()
            publisher.stop()
            auto_metrics.disable(s)
    finally:
        auto_metrics.AutoSteps._reduced = real  # type: ignore[method-assign]
        dist.destroy_process_group()
    share = counts["empty"] / max(1, counts["reads"])
    print(f"\nthe DDP's reads: {steps} steps of the in-process loop at {1e6 * per_step:.0f} µs, {counts['reads']} reads, "
          f"{counts['empty']} found nothing ({100 * share:.1f}%; target < 10%: {'yes' if share < 0.1 else 'NO'}); "
          f"steps by n (read every n-th): {dict(sorted(every.items()))}")
    return {**counts, "per_step_us": 1e6 * per_step, "every": dict(every)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1000, help="timed steps at ~1 ms (x0.3 at ~10 ms)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--blocks", type=int, default=30, help="in-process blocks of 300 steps per variant")
    ap.add_argument("--in-process-only", action="store_true", help="only the hooks' own cost (about 1 minute)")
    ap.add_argument("--comm-check-only", action="store_true",
                    help="only jdist's comm time against torch.profiler's (about 20 s)")
    ap.add_argument("--opcodes-only", action="store_true", help="only the Python opcodes the hooks add (seconds)")
    ap.add_argument("--reads-only", action="store_true",
                    help="only how often the DDP is read and how many reads find nothing (seconds)")
    ap.add_argument("--instructions", action="store_true",
                    help="also the training thread's instructions per step under valgrind (about 10 minutes)")
    args = ap.parse_args()
    if args.in_process_only:
        print_in_process(args.blocks)
        return
    if args.opcodes_only:
        print_opcodes()
        if args.instructions:
            instructions()
        return
    if args.reads_only:
        reads()
        return
    if args.comm_check_only:
        with tempfile.TemporaryDirectory() as tmp:
            comm_check(Path(tmp))
        return
    medians: dict[tuple[str, str], list[float]] = {}
    means: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["JDIST_RUN_DIR"] = str(work / "runs")
        (work / "train.py").write_text(SCRIPT)
        for i in range(args.repeats):
            order = KINDS[i % 3:] + KINDS[:i % 3]  # interleaved, the order rotating
            for label, width, factor, _ in SIZES:
                for kind in order:
                    t0 = time.monotonic()
                    median, mean = run_once(kind, work, max(50, int(args.steps * factor)), width)
                    medians.setdefault((label, kind), []).append(1000 * median)
                    means.setdefault((label, kind), []).append(1000 * mean)
                    print(f"  round {i + 1} {label} {kind}: median {1000 * median:.3f} ms "
                          f"({time.monotonic() - t0:.1f} s)", file=sys.stderr)
    print(f"\nunchanged DDP script, 2 CPU ranks, median of {args.repeats} interleaved rounds (ms per step)\n")
    print(f"{'':<24} {'torchrun':>9} {'jdist off':>10} {'jdist on':>9} {'off/tr':>7} {'on/tr':>7}  target   ok")
    summary = {}
    for label, _, _, target in SIZES:
        for stat, table in (("median", medians), ("mean", means)):
            t, off, on = (statistics.median(table[(label, k)]) for k in KINDS)
            ok = on / t <= target
            name = f"{label}, {stat}"
            print(f"{name:<24} {t:>9.3f} {off:>10.3f} {on:>9.3f} {off / t:>7.3f} {on / t:>7.3f}  ≤ {target:<5} "
                  f"{'yes' if ok else 'NO'}")
            summary[name] = {k: table[(label, k)] for k in KINDS} | {"target": target, "ok": ok}
    # each round's runs are minutes apart at most: their ratios leave out what drifts between rounds
    print(f"\nratios within each round (median step), then their median over the {args.repeats} rounds\n")
    for label, _, _, target in SIZES:
        rounds = list(zip(*(medians[(label, k)] for k in KINDS)))
        off_tr = [off / t for t, off, _ in rounds]
        on_tr = [on / t for t, _, on in rounds]
        print(f"{label:<14} off/tr {' '.join(f'{r:.3f}' for r in off_tr)}  median {statistics.median(off_tr):.3f}")
        print(f"{'':<14} on/tr  {' '.join(f'{r:.3f}' for r in on_tr)}  median {statistics.median(on_tr):.3f}  "
              f"≤ {target}: {'yes' if statistics.median(on_tr) <= target else 'NO'}")
        summary[f"{label}, paired"] = {"off/torchrun": off_tr, "on/torchrun": on_tr, "target": target}
    with tempfile.TemporaryDirectory() as tmp:
        summary["comm check"] = comm_check(Path(tmp))
    steps = print_in_process(args.blocks)
    summary["in process"] = {label: {"median_us": 1e6 * step, "mean_us": 1e6 * mean, "paired_added_us": 1e6 * paired}
                             for label, (step, mean, paired) in steps.items()}
    summary["reads"] = reads()
    summary["opcodes"] = print_opcodes()
    if args.instructions:
        summary["instructions"] = instructions()
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
