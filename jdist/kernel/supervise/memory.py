"""Out of memory, with what took it: the lines a rank's out-of-memory failure adds to the cell's error.

A rank that raised ``MemoryError``, torch's ``OutOfMemoryError`` (CUDA) or a CPU allocator's "can't allocate
memory" gets, from the run's records (its last ones reached the kernel with the cell's end): its memory at its
last record and how fast it grew, what jdist counts of it (the prepared models' parameters and gradients, the
prepared optimizers' state: ``param_bytes``, ``grad_bytes``, ``optim_bytes``) and the rest (activations, data,
the process), the other ranks' peaks, the allocation that failed where the message says it, and the fixes in
order with this model's numbers: shard the state across the ranks, a smaller micro-batch with gradient
accumulation, activation checkpointing, bf16.

Example (a 2-rank DDP run whose rank 1 failed; numbers in MiB):
    >>> from jdist.errors import RankFailure
    >>> from jdist.metrics import Run
    >>> MiB = 2**20
    >>> run = Run("x", 2, backend="ddp")
    >>> _ = run.add([{"rank": r, "seq": s, "step": s, "time": 100.0 + s, "mem_bytes": (500 + 10 * s + 100 * r) * MiB,
    ...               "mem_peak_bytes": (520 + 10 * s + 100 * r) * MiB, "param_bytes": 64 * MiB,
    ...               "grad_bytes": 64 * MiB, "optim_bytes": 128 * MiB} for s in range(5) for r in (0, 1)])
    >>> failure = RankFailure(1, "MemoryError", "")
    >>> print("\\n".join(memory_lines(run, failure)))  # doctest: +NORMALIZE_WHITESPACE
    rank 1 ran out of memory (MemoryError): host memory (RSS) 640 MiB at its last record (peak 660 MiB), growing
    10 MiB/s over its last 5 records.
      Of it, what jdist counts (prepared models and optimizers): parameters 64 MiB, gradients 64 MiB, optimizer
      state 128 MiB (256 MiB); the rest, 384 MiB, is activations, data and the process itself.
      The other ranks' peaks: r0 560 MiB.
      Fixes, in order: (1) shard the state over the 2 ranks: --backend fsdp holds about 128 MiB of the 256 MiB per
      rank; (2) half the micro-batch with twice the accumulation (jdist.prepare(..., grad_accum=2), the same global
      batch): about half the activations; (3) activation checkpointing (torch.utils.checkpoint on the largest
      blocks): their activations are recomputed in the backward instead of kept; (4) --precision bf16: activations
      in half the bytes.
"""

from __future__ import annotations

import math
import re
from typing import Any

from jdist.errors import RankFailure
from jdist.metrics import Run

#: The exceptions (names) that are an out-of-memory, and the messages of the ones that say so in their text.
OOM_NAMES = ("MemoryError", "OutOfMemoryError")
OOM_TEXT = re.compile(r"CUDA out of memory|can't allocate memory|out of memory", re.IGNORECASE)
#: "Tried to allocate 2.00 GiB" (CUDA) or "you tried to allocate 40000000000 bytes" (CPU).
_TRIED = re.compile(r"[Tt]ried to allocate ([\d.]+) ?(bytes|[KMGT]iB)")
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def is_oom(failure: RankFailure) -> bool:
    """Whether a rank's failure is an out-of-memory.

    >>> is_oom(RankFailure(0, "RuntimeError", "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    True
    >>> is_oom(RankFailure(0, "ValueError", "bad"))
    False
    """
    return failure.ename in OOM_NAMES or bool(OOM_TEXT.search(failure.evalue or ""))


def size(n: float) -> str:
    """Bytes in the unit that reads best.

    >>> size(640 * 2**20), size(3.5 * 2**30), size(900)
    ('640 MiB', '3.50 GiB', '900 B')
    """
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB"
    if n >= 2**10:
        return f"{n / 2**10:.0f} KiB"
    return f"{n:.0f} B"


def _tried(failure: RankFailure) -> float | None:
    m = _TRIED.search(failure.evalue or "")
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def _series(run: Run, rank: int, metric: str) -> list[tuple[float, float]]:
    """(time, value) of ``metric`` on ``rank``, oldest first (records without it left out)."""
    try:
        history = run.history
    except Exception:
        return []
    if metric not in history or "time" not in history:
        return []
    rows = history[(history["rank"] == rank)][["time", metric]].dropna()
    return [(float(t), float(v)) for t, v in zip(rows["time"], rows[metric])]


def memory_lines(run: Run | None, failure: RankFailure, last: int = 10) -> list[str]:
    """The lines for an out-of-memory on ``failure.rank`` (see the module doc); ``[]`` for another failure."""
    if not is_oom(failure):
        return []
    return _report(run, failure.rank, f"rank {failure.rank} ran out of memory ({failure.ename})", _tried(failure),
                   last)


def killed_lines(run: Run | None, rank: int, last: int = 10) -> list[str]:
    """The lines for ``rank`` ended by the kernel's out-of-memory killer (a SIGKILL, no exception): its memory at its
    last record and how fast it grew, which rank grew the most, what jdist counts of it and the fixes. The killer
    picks the largest process of the host or of the memory limit (cgroup) that ran out: not always the one that
    grew, so each rank's growth is said.

    >>> from jdist.metrics import Run
    >>> MiB = 2**20
    >>> run = Run("x", 2, backend="ddp")
    >>> _ = run.add([{"rank": r, "seq": s, "step": s, "time": 100.0 + s, "mem_bytes": (500 + 40 * s * r) * MiB}
    ...              for s in range(5) for r in (0, 1)])
    >>> print("\\n".join(killed_lines(run, 1)[:2]))  # doctest: +NORMALIZE_WHITESPACE
    rank 1 was killed by the out-of-memory killer: host memory (RSS) 660 MiB at its last record, growing 40 MiB/s
    over its last 5 records.
      Growth over the last records: r1 +40 MiB/s, r0 +0 B/s: rank 1 grew the most.
    """
    lines = _report(run, rank, f"rank {rank} was killed by the out-of-memory killer", None, last)
    if run is None or len(lines) < 2:
        return lines
    rates = {r: rate for r in run.ranks if (rate := _rate(_series(run, r, "mem_bytes")[-last:])) is not None}
    if len(rates) > 1:
        order = sorted(rates, key=lambda r: -rates[r])
        said = ", ".join(f"r{r} {'+' if rates[r] >= 0 else '-'}{size(abs(rates[r]))}/s" for r in order)
        lines.insert(1, f"  Growth over the last records: {said}: rank {order[0]} grew the most.")
    return lines


def _rate(series: list[tuple[float, float]]) -> float | None:
    """Bytes per second from the first to the last of (time, bytes); None for fewer than two points in time."""
    if len(series) < 2 or series[-1][0] <= series[0][0]:
        return None
    return (series[-1][1] - series[0][1]) / (series[-1][0] - series[0][0])


def _report(run: Run | None, rank: int, head: str, tried: float | None, last: int) -> list[str]:
    kind = "GPU memory (allocated)" if run is not None and run.device_kind == "cuda" else "host memory (RSS)"
    latest = run.latest(rank) if run is not None else None
    if not latest or latest.get("mem_bytes") is None:
        return [head + ": it had sent no record with its memory (it ran out before its first step, or the cell "
                "logged none)." + (f" It tried to allocate {size(tried)}." if tried else "")]
    assert run is not None
    mem, peak = float(latest["mem_bytes"]), latest.get("mem_peak_bytes")
    series = _series(run, rank, "mem_bytes")[-last:]
    rate = _rate(series)
    growth = "" if rate is None else (f", {'growing' if rate >= 0 else 'shrinking'} {size(abs(rate))}/s over its "
                                      f"last {len(series)} records")
    lines = [f"{head}: {kind} {size(mem)} at its last record"
             + (f" (peak {size(float(peak))})" if peak is not None else "") + growth + "."]
    parts = {name: latest.get(f"{key}_bytes") for name, key in
             (("parameters", "param"), ("gradients", "grad"), ("optimizer state", "optim"))}
    state = sum(float(v) for v in parts.values() if v is not None and not math.isnan(float(v)))
    rest = max(0.0, mem - state)
    if state:
        counted = ", ".join(f"{name} {size(float(v))}" for name, v in parts.items() if v is not None)
        lines.append(f"  Of it, what jdist counts (prepared models and optimizers): {counted} ({size(state)}); the "
                     f"rest, {size(rest)}, is activations, data and the process itself.")
    others = {r: (run.latest(r) or {}).get("mem_peak_bytes") for r in run.ranks if r != rank}
    others = {r: v for r, v in others.items() if v is not None}
    if others:
        lines.append("  The other ranks' peaks: " + ", ".join(f"r{r} {size(float(v))}" for r, v in sorted(others.items()))
                     + ".")
    if tried:
        lines.append(f"  The allocation that failed: {size(tried)}.")
    fixes = []
    world = run.world_size
    if state and world > 1 and run.backend in ("ddp", "horovod"):
        fixes.append(f"shard the state over the {world} ranks: --backend fsdp holds about {size(state / world)} of the "
                     f"{size(state)} per rank")
    elif state and world > 1 and run.backend == "deepspeed":
        fixes.append(f"--zero 3 shards parameters, gradients and optimizer state: about {size(state / world)} of the "
                     f"{size(state)} per rank")
    fixes.append("half the micro-batch with twice the accumulation (jdist.prepare(..., grad_accum=2), the same "
                 "global batch): about half the activations")
    fixes.append("activation checkpointing (torch.utils.checkpoint on the largest blocks): their activations are "
                 "recomputed in the backward instead of kept")
    fixes.append("--precision bf16: activations in half the bytes")
    lines.append("  Fixes, in order: " + "; ".join(f"({i}) {fix}" for i, fix in enumerate(fixes, 1)) + ".")
    return lines


__all__ = ["OOM_NAMES", "is_oom", "killed_lines", "memory_lines", "size"]
