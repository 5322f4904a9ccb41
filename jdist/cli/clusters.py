"""``jdist clusters`` and ``jdist stop``: the running jdist clusters of this user, from their state
files (the ones the JupyterLab sidebar lists), and ending those that ``jdist run`` owns.

A notebook's cluster belongs to its kernel: ``jdist stop`` names the fix (``%dist stop`` there, or the
sidebar) rather than pulling it away from a kernel that may be using it.

Example::

    $ jdist clusters
    $ jdist stop jdist-41233-9f1c2a7b
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from jdist.common.paths import clusters_dir
from jdist.common.procs import alive


def live_clusters(runtime_dir: str | None = None) -> list[dict[str, Any]]:
    """The state files of clusters whose owner (kernel or ``jdist run``) still runs, oldest first."""
    folder = clusters_dir(runtime_dir)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if alive(data.get("kernel")):
            out.append(data)
    return sorted(out, key=lambda d: d.get("started_at", 0))


def owner_of(state: dict[str, Any]) -> str:
    """``kernel <id>`` or ``jdist run (pid N)``: a notebook kernel has a kernel id, a command has none."""
    kernel = state.get("kernel") or {}
    if kernel.get("id"):
        return f"kernel {kernel['id'][:8]}" + (f" ({kernel['notebook']})" if kernel.get("notebook") else "")
    return f"jdist run (pid {kernel.get('pid')})"


def clusters_command(args: Any) -> int:
    """``jdist clusters``: id, ranks, backend, launcher, owner and age of each running cluster."""
    states = live_clusters(args.runtime_dir)
    if args.json:
        for state in states:
            print(json.dumps({"cluster_id": state["cluster_id"], "ranks": len(state.get("ranks", [])),
                              "config": state.get("config", {}), "owner": owner_of(state),
                              "started_at": state.get("started_at")}))
        return 0
    if not states:
        print("No jdist clusters are running.")
        return 0
    now = time.time()
    print(f"{'cluster':<28} {'ranks':>5}  {'backend':<10} {'launcher':<10} {'up':>7}  owner")
    for st in states:
        cfg = st.get("config", {})
        up = f"{now - st.get('started_at', now):.0f} s"
        print(f"{st['cluster_id']:<28} {len(st.get('ranks', [])):>5}  {cfg.get('backend', ''):<10} "
              f"{st.get('launcher', ''):<10} {up:>7}  {owner_of(st)}")
    return 0


def stop_command(args: Any) -> int:
    """``jdist stop CLUSTER``: SIGTERM to the ``jdist run`` that owns it (it ends its ranks, as on
    Slurm's time limit); a notebook's cluster is left to its kernel (one line with the fix)."""
    states = [s for s in live_clusters(args.runtime_dir) if s["cluster_id"].startswith(args.cluster)]
    if len(states) != 1:
        what = "no running cluster" if not states else f"{len(states)} clusters"
        print(f"jdist: error: {what} matches {args.cluster!r}; jdist clusters lists them", file=sys.stderr)
        return 2
    state = states[0]
    kernel = state["kernel"]
    if kernel.get("id"):
        print(f"jdist: error: {state['cluster_id']} belongs to {owner_of(state)}: stop it there with %dist stop "
              "(or the sidebar's Stop)", file=sys.stderr)
        return 2
    os.kill(kernel["pid"], signal.SIGTERM)
    deadline = time.monotonic() + args.wait
    while alive(kernel) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(kernel):
        print(f"jdist: {owner_of(state)} still runs {args.wait:g} s after SIGTERM", file=sys.stderr)
        return 1
    print(f"Stopped {state['cluster_id']} ({owner_of(state)} ended).")
    return 0


__all__ = ["clusters_command", "live_clusters", "owner_of", "stop_command"]
