"""What a bug report needs from one rank (``%dist doctor``): versions, devices, environment, network, clock,
its newest collectives. The kernel gathers every rank's and lays them out (:mod:`jdist.kernel.doctor`).

Example (a process that is no rank: no session, torch's part as it is):
    >>> facts = rank_facts()
    >>> facts["rank"], facts["versions"]["python"].count(".") >= 2, "jdist" in facts["versions"]
    (None, True, True)
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
import time
from typing import Any

#: Environment variables a distributed bug report asks for (and every variable with one of the prefixes).
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
ENV_PREFIXES = ("NCCL_", "TORCH_", "JDIST_", "FI_", "UCX_", "MPICH_", "HYDRA_", "SLURM_JOB", "SLURM_NODE")
#: Secrets never leave the rank: a variable whose name has one of these is shown as set, not its value.
SECRET_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
#: Distributions whose version a report shows (where installed; importing none of them).
PACKAGES = ("torch", "numpy", "ipyparallel", "mpi4py", "jdist", "deepspeed", "horovod", "tensorflow", "ray",
            "accelerate", "transformers", "lightning")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, str]:
    """The environment variables of :data:`ENV_NAMES` and :data:`ENV_PREFIXES` that are set (secrets masked)."""
    out = {}
    for name, value in sorted(os.environ.items()):
        if name in ENV_NAMES or name.startswith(ENV_PREFIXES):
            out[name] = "(set)" if any(p in name for p in SECRET_PARTS) else value
    return out


def _libraries() -> dict[str, str]:
    """The communication libraries: NCCL (where torch has CUDA), gloo (in torch), the MPI library."""
    libs: dict[str, str] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        import torch.distributed as dist

        libs["gloo"] = "in torch" if dist.is_gloo_available() else "not built"
        if torch.cuda.is_available():
            try:
                libs["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception as exc:  # (no NCCL in this build)
                libs["nccl"] = f"unavailable ({exc})"
        libs["cuda"] = str(torch.version.cuda or "none (CPU build)")
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        libs["mpi"] = mpi.Get_library_version().strip().splitlines()[0]
    return libs


def _devices() -> list[str]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(f"cuda:{i} {p.name} ({p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor})")
    return out


def _network() -> dict[str, list[str]]:
    import psutil

    return {name: [a.address for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
            for name, addrs in sorted(psutil.net_if_addrs().items())}


def rank_facts() -> dict[str, Any]:
    """This rank's facts as plain data (what :func:`jdist.rank.rpc.doctor` returns)."""
    from .collectives import latest_collectives
    from .session import current

    s = current()
    ctx = s.ctx if s is not None else None
    versions = {"python": platform.python_version(), "platform": platform.platform()}
    versions.update({name: v for name in PACKAGES if (v := _version(name)) is not None})
    chosen = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")
    return {
        "rank": ctx.rank if ctx is not None else None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(ctx.device) if ctx is not None else None,
        "backend": s.backend_name if s is not None else None,
        "master_addr": ctx.master_addr if ctx is not None else None,
        "versions": versions,
        "libraries": _libraries(),
        "devices": _devices(),
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "environment": environment(),
        "network": _network(),
        "interface": chosen,
        "collectives": [(list(c.group), c.seq, c.what(), c.done) for c in latest_collectives()],
        "clock": time.time(),
    }


__all__ = ["ENV_NAMES", "ENV_PREFIXES", "PACKAGES", "environment", "rank_facts"]
