"""How long does a debugger command on a rank take, from the notebook and back?

Measured in one run on 2 local CPU ranks of a real kernel (jupyter_client, as JupyterLab talks to it):

1. **pdb post-mortem** (``%dist debug``): after a cell failed on rank 1, ``p x`` commands through
   :func:`jdist.kernel.debug.postmortem.post_mortem` (its own per-command round trip: the kernel sends the line to the
   rank with ``apply``, the rank's pdb answers). Target: p50 <= 50 ms.
2. **The Debugger panel** (:mod:`jdist.kernel.debug.dapbridge`): while rank 1 is stopped at a gutter breakpoint,
   ``stackTrace``, ``scopes``, ``variables`` and ``evaluate`` requests on the kernel's control channel, as
   the panel sends them; beside, in the same run, ``debugInfo`` (answered by ipykernel alone: the control
   channel's own round trip) and ``threads`` answered by the kernel's own debugpy (no rank involved).
3. **A rank's cost of debugpy**: a pure-Python loop in a cell on rank 1 before debugpy started, after it
   started (a cell without breakpoints: untraced), and traced (a cell with a breakpoint that is not hit).

Usage::

    .venv/bin/python benchmarks/bench_debug.py [--commands 100] [--json results.json]
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_overhead import quantile  # noqa: E402
from conftest import KernelSession, Panel  # noqa: E402

FAILING = "%%distributed\nx = 41 + rank\nif rank == 1:\n    raise ValueError('boom')"
STOPPING = "%%distributed --debug-ranks 1\nseen = 40 + rank\nt = torch.ones(1) * seen\nprint(float(t))"
LOOP = ("%%distributed --targets 1 {flags}\nimport time\ndef spin(n):\n    s = 0\n    for i in range(n):\n"
        "        s += i * i\n    return s\nt0 = time.perf_counter(); spin(1_000_000); loop_s = time.perf_counter() - t0\n"
        "never = False\nif never:\n    print('not reached')")


def stats_ms(xs: list[float]) -> dict[str, float]:
    ms = [x * 1e3 for x in xs]
    return {"n": len(ms), "p50": statistics.median(ms), "p90": quantile(ms, 0.9), "max": max(ms)}


def loop_time(k: KernelSession, flags: str = "", panel: Panel | None = None, repeats: int = 7) -> float:
    """The best of ``repeats`` runs of the loop cell on rank 1 (a breakpoint on a line never reached if
    ``panel``: the cell then runs traced)."""
    cell = LOOP.format(flags=flags)
    if panel is not None:
        path = panel("dumpCell", code=cell)["body"]["sourcePath"]
        panel("setBreakpoints", source={"path": path}, breakpoints=[{"line": 11}])
    best = float("inf")
    for _ in range(repeats):
        k.run(cell)
        k.run("%dist pull loop_s --rank 1")
        best = min(best, k.value("loop_s"))
    return best


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commands", type=int, default=100, help="commands of each kind")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    env = dict(os.environ, JDIST_RUN_DIR=tempfile.mkdtemp(prefix="jdist-bench-debug-"))
    k = KernelSession(env)
    out: dict[str, Any] = {}
    try:
        k.run("%load_ext jdist")
        k.run("%%distributed -n 2 --backend ddp --timeout 300\nimport torch")
        untraced_before = loop_time(k)

        # 1. pdb post-mortem
        k.run(FAILING, allow_error=True)
        k.run("from jdist.kernel.debug.postmortem import post_mortem\nfrom jdist.kernel.cluster import current\n"
              f"_lines = ['p x'] * {args.commands} + ['q']\n"
              "_trips = post_mortem(current(), None, ask=lambda prompt: _lines.pop(0), say=lambda text: None)")
        out["pdb_ms"] = stats_ms(k.value("_trips"))

        # 2. the Debugger panel
        panel = Panel(k)
        panel("initialize", clientID="jupyterlab", adapterID="python", pathFormat="path", linesStartAt1=True)
        panel("attach")
        path = panel("dumpCell", code=STOPPING)["body"]["sourcePath"]
        panel("setBreakpoints", source={"path": path}, breakpoints=[{"line": 3}])
        panel("configurationDone")
        t0 = time.perf_counter()
        msg_id = k.start(STOPPING)
        thread = panel.wait_event("stopped", 120)["body"]["threadId"]
        out["first_stop_s"] = time.perf_counter() - t0  # debugpy started on rank 1 within it
        trips: dict[str, list[float]] = {c: [] for c in ("stackTrace", "scopes", "variables", "evaluate", "kernel",
                                                         "floor")}

        def timed(kind: str, command: str, **arguments: Any) -> dict[str, Any]:
            t = time.perf_counter()
            reply = panel(command, **arguments)
            trips[kind].append(time.perf_counter() - t)
            if not reply.get("success"):
                sys.exit(f"{command} failed: {reply}")
            return reply

        for _ in range(args.commands):
            frame = timed("stackTrace", "stackTrace", threadId=thread)["body"]["stackFrames"][0]
            scopes = timed("scopes", "scopes", frameId=frame["id"])["body"]["scopes"]
            timed("variables", "variables", variablesReference=scopes[0]["variablesReference"])
            timed("evaluate", "evaluate", expression="seen", frameId=frame["id"], context="repl")
            timed("kernel", "threads")  # the kernel's own debugpy
            timed("floor", "debugInfo")  # ipykernel answers it alone: the control channel's round trip
        panel("continue", threadId=1)
        k.collect(msg_id, 60)
        t0 = time.perf_counter()
        msg_id = k.start(STOPPING)
        thread = panel.wait_event("stopped", 120)["body"]["threadId"]
        out["next_stop_s"] = time.perf_counter() - t0
        panel("continue", threadId=1)
        k.collect(msg_id, 60)
        out["panel_ms"] = {c: stats_ms(xs) for c, xs in trips.items()}

        # 3. the loop on rank 1 with debugpy started: untraced, then traced
        untraced_after = loop_time(k, "--debug-ranks 1")
        traced = loop_time(k, "--debug-ranks 1", panel)
        panel("disconnect", restart=False, terminateDebuggee=False)
        out["loop_ms"] = {"before debugpy": untraced_before * 1e3, "debugpy started, untraced": untraced_after * 1e3,
                          "traced (a breakpoint in the cell)": traced * 1e3}
    finally:
        k.run("%dist stop", allow_error=True)
        k.shutdown()

    p = out["pdb_ms"]
    print(f"Debugger commands on a rank, 2 local CPU ranks, {os.cpu_count()} cores, {args.commands} of each")
    print(f"   {'command':44} {'p50':>8} {'p90':>8} {'max':>8}  target")
    print(f"   {'pdb post-mortem: p x (%dist debug)':44} {p['p50']:7.1f}ms {p['p90']:7.1f}ms {p['max']:7.1f}ms  "
          f"p50 <= 50 ms: {'met' if p['p50'] <= 50 else 'MISSED'}")
    floor = out["panel_ms"]["floor"]
    labels = {"kernel": "panel: threads, the kernel's own debugpy", "floor": "panel: debugInfo (ipykernel alone)"}
    for name, s in out["panel_ms"].items():
        label = labels.get(name, f"panel: {name} on rank 1")
        extra = "" if name in labels else f"  +{s['p50'] - floor['p50']:.1f} ms over debugInfo"
        print(f"   {label:44} {s['p50']:7.1f}ms {s['p90']:7.1f}ms {s['max']:7.1f}ms{extra}")
    print(f"   first stop (debugpy started on rank 1): {out['first_stop_s']:.2f} s; the next: {out['next_stop_s']:.2f} s")
    base = out["loop_ms"]["before debugpy"]
    print("A pure-Python loop (1M iterations) in a cell on rank 1, best of 7:")
    for name, ms in out["loop_ms"].items():
        print(f"   {name:44} {ms:7.1f} ms  {ms / base:5.2f}x")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
