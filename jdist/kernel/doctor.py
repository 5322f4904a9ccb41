"""``%dist doctor``: one report of what a bug report about the cluster needs, copyable, saved beside the runs.

Every rank answers with its facts (:func:`jdist.rank.doctor.rank_facts`: versions, communication libraries,
devices, the relevant environment variables, network interfaces and the one the process group uses, its clock,
its newest collective on each group from c10d's Flight Recorder); the kernel adds its own versions, each host's
clock offset against its own clock (the rank's clock against the middle of the call: within half the call's
round trip) and each rank's Python stack. What every rank has alike is said once; what differs, per rank.

Example (two ranks' facts, laid out; the real ones come from the ranks):
    >>> facts = [{"rank": r, "host": "n1", "pid": 10 + r, "device": "cpu", "backend": "ddp", "master_addr": "127.0.0.1",
    ...           "versions": {"torch": "2.13.0"}, "libraries": {"gloo": "in torch"}, "devices": [], "cpus": 2,
    ...           "affinity": 2, "environment": {"RANK": str(r)}, "network": {"lo": ["127.0.0.1"]},
    ...           "interface": "lo", "collectives": [], "clock": 100.0} for r in (0, 1)]
    >>> print(layout(facts, {}, kernel_clock=100.001, round_trip=0.004, title="jdist doctor"))
    jdist doctor
    ranks: rank 0 n1 pid 10 cpu, rank 1 n1 pid 11 cpu; backend ddp; master address 127.0.0.1
    versions (every rank): torch 2.13.0
    libraries (every rank): gloo in torch
    CPUs (every rank): 2 (the process may use 2)
    environment (every rank): (none of the relevant variables is the same everywhere)
    environment (per rank): rank 0: RANK=0; rank 1: RANK=1
    network, host n1: lo 127.0.0.1; the process group's interface: lo
    clocks against the kernel's: n1 -1.0 ms (+-2.0 ms)
    newest collectives (c10d's Flight Recorder): none recorded
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from jdist.common.stacks import Frame, where_in_cell
from jdist.metrics import default_run_dir

from .cluster import ClusterSession


def _same(facts: Sequence[dict[str, Any]], key: str) -> tuple[Any, dict[int, Any]]:
    """(the value every rank has, or None; else each rank's)."""
    values = [f[key] for f in facts]
    if all(v == values[0] for v in values):
        return values[0], {}
    return None, {f["rank"]: f[key] for f in facts}


def _pairs(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def layout(facts: Sequence[dict[str, Any]], stacks: dict[int, list[Frame]], kernel_clock: float,
           round_trip: float, title: str) -> str:
    """The report's text from the ranks' facts (rank order), their stacks, the kernel's clock at the middle of
    the call and the call's round trip (seconds)."""
    facts = sorted(facts, key=lambda f: f["rank"])
    lines = [title]
    backend = {f["backend"] for f in facts}
    lines.append("ranks: " + ", ".join(f"rank {f['rank']} {f['host']} pid {f['pid']} {f['device']}" for f in facts)
                 + f"; backend {', '.join(sorted(b or '-' for b in backend))}; master address "
                 + ", ".join(sorted({str(f['master_addr']) for f in facts})))
    for key, label, show in (("versions", "versions", _pairs), ("libraries", "libraries", _pairs)):
        same, each = _same(facts, key)
        if each:
            lines.append(f"{label} (they differ): " + "; ".join(f"rank {r}: {show(v)}" for r, v in each.items()))
        else:
            lines.append(f"{label} (every rank): {show(same) or '-'}")
    devices, per = _same(facts, "devices")
    if per:
        lines.append("devices: " + "; ".join(f"rank {r}: {', '.join(v) or 'none'}" for r, v in per.items()))
    elif devices:
        lines.append(f"devices (every rank sees): {', '.join(devices)}")
    cpus = {(f["cpus"], f["affinity"]) for f in facts}
    if len(cpus) == 1:
        n, aff = cpus.pop()
        lines.append(f"CPUs (every rank): {n} (the process may use {aff})")
    else:
        lines.append("CPUs: " + "; ".join(f"rank {f['rank']}: {f['cpus']} (may use {f['affinity']})" for f in facts))
    names = sorted({k for f in facts for k in f["environment"]})
    common = {k: facts[0]["environment"][k] for k in names
              if all(f["environment"].get(k) == facts[0]["environment"].get(k) for f in facts)}
    lines.append("environment (every rank): " + (", ".join(f"{k}={v}" for k, v in common.items()) or
                                                 "(none of the relevant variables is the same everywhere)"))
    differing = [k for k in names if k not in common]
    if differing:
        lines.append("environment (per rank): " + "; ".join(
            f"rank {f['rank']}: " + ", ".join(f"{k}={f['environment'].get(k, '(unset)')}" for k in differing)
            for f in facts))
    hosts: dict[str, list[dict[str, Any]]] = {}
    for f in facts:
        hosts.setdefault(f["host"], []).append(f)
    for host, on in hosts.items():
        nets = "; ".join(f"{name} {', '.join(addrs)}" for name, addrs in on[0]["network"].items() if addrs)
        chosen = sorted({str(f["interface"]) for f in on if f["interface"]})
        lines.append(f"network, host {host}: {nets or '-'}; the process group's interface: "
                     f"{', '.join(chosen) or 'chosen by gloo/NCCL (no *_SOCKET_IFNAME set)'}")
    offsets = {host: statistics.median(f["clock"] - kernel_clock for f in on) for host, on in hosts.items()}
    lines.append("clocks against the kernel's: " + ", ".join(
        f"{host} {1e3 * off:+.1f} ms (+-{1e3 * round_trip / 2:.1f} ms)" for host, off in offsets.items()))
    seen = [(f["rank"], c) for f in facts for c in f["collectives"]]
    if seen:
        lines.append("newest collectives (c10d's Flight Recorder): " + "; ".join(
            f"rank {r}: {what} on ranks {','.join(map(str, group))}{'' if done else ' (not completed)'}"
            for r, (group, _, what, done) in seen))
    else:
        lines.append("newest collectives (c10d's Flight Recorder): none recorded")
    if stacks:
        lines.append("stacks: " + "; ".join(f"rank {r}: {_where(frames)}" for r, frames in sorted(stacks.items())))
    return "\n".join(lines)


def _where(frames: list[Frame]) -> str:
    """Where a rank is: idle (in its engine's event loop, no cell frame), or its place in the cell and the
    innermost frame."""
    if not frames:
        return "no answer"
    if not any(path.startswith(CELL_PREFIXES) or "ipykernel_" in path for path, _, _ in frames):
        return "idle"
    return f"{where_in_cell(frames)} (in {frames[0][2]})"


#: Where IPython keeps a cell's code (the frames of a running cell).
CELL_PREFIXES = ("<ipython-input", "<cell")


def doctor(cluster: ClusterSession, run_dir: str | None = None) -> tuple[str, Path]:
    """Gather every rank's facts and stacks; returns the report and the file it was saved to
    (``<run dir>/doctor-<cluster id>-<time>.txt``)."""
    from jdist import __version__

    t0 = time.time()
    facts = cluster.call("doctor", timeout=30)
    t1 = time.time()
    stacks = cluster.stacks()
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t1))
    title = (f"jdist doctor: cluster {cluster.cluster_id}, {cluster.config.n} rank(s), {when} UTC; kernel on "
             f"{platform.node()}, jdist {__version__}, Python {platform.python_version()}")
    text = layout(facts, stacks, (t0 + t1) / 2, t1 - t0, title)
    folder = Path(run_dir) if run_dir else default_run_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"doctor-{cluster.cluster_id}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(t1))}.txt"
    path.write_text(text + "\n")
    return text, path


__all__ = ["doctor", "layout"]
