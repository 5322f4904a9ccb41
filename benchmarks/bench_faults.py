"""Time to detect and to recover from each fault of docs/reliability.md, on 2 CPU ranks.

Drives a real Jupyter kernel (jupyter_client, kernelspec ``python3``) with ``%load_ext
jdist`` and a real 2-rank MPI cluster, ``--timeout 120`` (so any release faster than
that is jdist's doing, not the process-group timeout). Each fault is produced
``--repeats`` times; the table gives the median (and max) of:

* exception on one rank while the other waits in ``all_reduce``: time from the raise
  (a timestamp written by the failing rank) to the error in the notebook; recovery = the
  next ``all_reduce`` cell;
* mismatched collective (rank 0 calls ``all_reduce``, rank 1 does not), ``--watchdog 2``:
  time to the HangError beyond the watchdog period;
* interrupt (Kernel -> Interrupt) while rank 0 waits in ``all_reduce`` and rank 1 loops:
  time from the interrupt request to the cell's end;
* a rank SIGKILLed mid-training (the out-of-memory killer's signal): time from the kill
  to the error; recovery = ``%dist restart`` (restart, replay of set-up cells, restore
  of the newest checkpoint);
* kernel shutdown (graceful, and SIGKILL) with a live cluster: time until no rank,
  mpiexec or controller process is left (checked by PID);
* bad input (``-n 0``): time to the error.

Usage::

    .venv/bin/python benchmarks/bench_faults.py [--repeats 3] [--json faults.json]
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
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import KernelSession  # noqa: E402  (the test suite's real-kernel driver)

STEP = "loss = model(torch.ones(8, 4)).pow(2).mean(); jdist.backward(loss); opt.step(); opt.zero_grad()"
SETUP = (
    "%%distributed\nimport os, signal, time, torch, torch.nn as nn, torch.distributed as dist\n"
    "model = jdist.prepare(nn.Linear(4, 1))\nopt = jdist.prepare(torch.optim.SGD(model.parameters(), lr=0.1))\n"
)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Bench:
    def __init__(self, workdir: Path):
        self.dir = workdir
        self.env = dict(os.environ, JDIST_RUN_DIR=str(workdir / "runs"), IPYTHONDIR=str(workdir / "ipython"))
        self.k = self._kernel()

    def _kernel(self) -> KernelSession:
        k = KernelSession(self.env)
        k.run("%load_ext jdist")
        k.run("%%distributed -n 2 --backend ddp --timeout 120\nimport torch")
        k.run(SETUP)
        return k

    def stamp(self, name: str) -> str:
        return f"open({str(self.dir / name)!r}, 'w').write(repr(time.time()))"

    def read(self, name: str) -> float:
        return float((self.dir / name).read_text())

    def check(self, out: Any, *needles: str) -> None:
        text = out.traceback + out.stderr + out.stdout
        missing = [n for n in needles if n not in text]
        if missing:
            raise RuntimeError(f"expected {missing} in:\n{text}")

    def next_collective(self) -> float:
        t0 = time.perf_counter()
        out = self.k.run(f"%%distributed\nx = torch.ones(1); dist.all_reduce(x); {STEP}\nprint(int(x.item()))")
        if out.stdout.strip() != "2":
            raise RuntimeError(out.stdout)
        return time.perf_counter() - t0

    # -- faults -----------------------------------------------------------------------
    def exception(self) -> dict[str, float]:
        out = self.k.run(f"%%distributed\nif rank == 1:\n    {self.stamp('raised')}\n    raise ValueError('bad')\n"
                         "dist.all_reduce(torch.ones(1))", allow_error=True, timeout=120)
        shown = time.time() - self.read("raised")
        self.check(out, "released because rank 1 failed", "re-created")
        return {"detect_s": shown, "recover_s": self.next_collective()}

    def hang(self, watchdog: float = 2.0) -> dict[str, float]:
        out = self.k.run(f"%%distributed --watchdog {watchdog:g}\n{self.stamp('hang')}\n"
                         "if rank == 0:\n    dist.all_reduce(torch.ones(1))", allow_error=True, timeout=120)
        shown = time.time() - self.read("hang")
        self.k.run("%%distributed --watchdog 30\npass")
        self.check(out, "HangError", "waiting in all_reduce")
        return {"detect_s": shown - watchdog, "recover_s": self.next_collective()}

    def interrupt(self) -> dict[str, float]:
        msg = self.k.start("%%distributed\nif rank == 0:\n    dist.all_reduce(torch.ones(1))\n"
                           "while True:\n    time.sleep(0.01)")
        time.sleep(2.0)
        t0 = time.perf_counter()
        self.k.km.interrupt_kernel()
        out = self.k.collect(msg, timeout=60)
        stopped = time.perf_counter() - t0
        self.check(out, "variables on the ranks are kept")
        return {"detect_s": stopped, "recover_s": self.next_collective()}

    def death(self) -> dict[str, float]:
        ckpt = self.dir / "ckpt"
        self.k.run(f"%%distributed\njdist.checkpoint_every(5, {str(ckpt)!r}, model=model, optimizer=opt)")
        out = self.k.run(
            f"%%distributed\nfor step in range(1, 1000):\n    {STEP}\n    jdist.log(step=step, loss=loss.item())\n"
            f"    if step == 12 and rank == 1:\n        {self.stamp('killed')}\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n    time.sleep(0.02)", allow_error=True, timeout=120)
        shown = time.time() - self.read("killed")
        self.check(out, "rank 1 died: killed by SIGKILL")
        t0 = time.perf_counter()
        out = self.k.run("%dist restart", timeout=300)
        recover = time.perf_counter() - t0
        self.check(out, "(step 10)")
        self.k.run("%%distributed\njdist.checkpoint_every(None)")
        return {"detect_s": shown, "recover_s": recover}

    def shutdown(self, now: bool) -> dict[str, float]:
        pids = self.k.value("[r['pid'] for r in jdist.kernel.cluster.current().ranks] + "
                            "[jdist.kernel.cluster.current().ipp.controller.process.pid] + "
                            "[l.process.pid for l in jdist.kernel.cluster.current().ipp.engines.values()]")
        t0 = time.perf_counter()
        self.k.kc.stop_channels()
        self.k.km.shutdown_kernel(now=now)
        while any(_alive(p) for p in pids):
            if time.perf_counter() - t0 > 60:
                raise RuntimeError(f"left behind: {[p for p in pids if _alive(p)]}")
            time.sleep(0.05)
        gone = time.perf_counter() - t0
        self.k = self._kernel()
        return {"detect_s": gone, "recover_s": float("nan")}

    def bad_input(self) -> dict[str, float]:
        t0 = time.perf_counter()
        out = self.k.run("%%distributed --restart -n 0\npass", allow_error=True)
        took = time.perf_counter() - t0
        self.check(out, "at least 1")
        return {"detect_s": took, "recover_s": self.next_collective()}

    def close(self) -> None:
        self.k.run("%dist stop", allow_error=True)
        self.k.shutdown()


FAULTS: dict[str, tuple[str, Callable[[Bench], dict[str, float]]]] = {
    "exception": ("exception on one rank, the other in all_reduce", Bench.exception),
    "hang": ("mismatched all_reduce, --watchdog 2 (beyond the 2 s)", Bench.hang),
    "interrupt": ("interrupt, rank 0 blocked in all_reduce", Bench.interrupt),
    "death": ("rank SIGKILLed mid-training; %dist restart", Bench.death),
    "shutdown": ("kernel shutdown (graceful): processes gone", lambda b: b.shutdown(now=False)),
    "kill_kernel": ("kernel SIGKILLed: processes gone", lambda b: b.shutdown(now=True)),
    "bad_input": ("bad input (-n 0)", Bench.bad_input),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in FAULTS}
    with tempfile.TemporaryDirectory(prefix="jdist-bench-faults-") as tmp:
        bench = Bench(Path(tmp))
        try:
            for i in range(args.repeats):
                for name, (_, fn) in FAULTS.items():
                    results[name].append(fn(bench))
                    print(f"  repeat {i + 1}/{args.repeats} {name}: {results[name][-1]}", flush=True)
        finally:
            bench.close()

    def cell(values: list[float]) -> str:
        values = [v for v in values if v == v]
        if not values:
            return "-"
        return f"{statistics.median(values):.2f} s (max {max(values):.2f})"

    print(f"\nFault handling on 2 CPU ranks, {args.repeats} repeats (median, max):\n")
    print("| fault | time to detect / stop | time to recover |\n|---|---|---|")
    for name, (label, _) in FAULTS.items():
        runs = results[name]
        print(f"| {label} | {cell([r['detect_s'] for r in runs])} | {cell([r['recover_s'] for r in runs])} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
