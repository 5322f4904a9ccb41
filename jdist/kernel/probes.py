"""Start-time checks of the machine, before any rank starts (the pure checks are the option
table's, :meth:`jdist.options.OptionTable.check`; the launcher probes its own needs).

Each raises ValueError with the fix.
"""

from __future__ import annotations

import ctypes
import os
import socket

from jdist.options import ClusterConfig
from jdist.plugins import backend_spec, launcher_class


def visible_gpus() -> int:
    """CUDA devices visible to this process; 0 without a GPU.

    The driver's count (NVML, read through ctypes in milliseconds) narrowed by ``CUDA_VISIBLE_DEVICES``,
    so the kernel never imports torch for it (that import cost 4.4 s of a 13 s ``--gpus 1`` cold start on
    the H100 machine). Without NVML (no NVIDIA driver, or another CUDA-like stack): torch's count.
    """
    count = _nvml_device_count()
    if count is None:
        try:
            import torch
        except ImportError:
            return 0
        return torch.cuda.device_count()
    return narrow_by_visible_devices(count, os.environ.get("CUDA_VISIBLE_DEVICES"))


def narrow_by_visible_devices(count: int, visible: str | None) -> int:
    """How many of ``count`` devices CUDA shows under ``CUDA_VISIBLE_DEVICES=visible``: the entries up to
    the first invalid one (CUDA's rule), at most ``count``.

    >>> narrow_by_visible_devices(4, None), narrow_by_visible_devices(4, "0,2"), narrow_by_visible_devices(4, "")
    (4, 2, 0)
    >>> narrow_by_visible_devices(2, "1,-1,0"), narrow_by_visible_devices(1, "0,1,2"), narrow_by_visible_devices(8, "GPU-5f3a,GPU-9b1c")
    (1, 1, 2)
    """
    if visible is None:
        return count
    n = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-") or (entry.isdigit() and int(entry) >= count):
            break
        n += 1
    return min(n, count)


def _nvml_device_count() -> int | None:
    """NVML's count of NVIDIA devices on this machine, None where NVML is not there or fails."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None
    finally:
        nvml.nvmlShutdown()


def port_in_use(port: int) -> str | None:
    """Who holds TCP ``port`` on this machine (e.g. ``"PID 123, python"``), None if it is free."""
    import psutil

    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("", port))
        return None
    except OSError:
        pass
    finally:
        probe.close()
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f"PID {conn.pid}, {psutil.Process(conn.pid).name()}"
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        pass
    return "held by another process"


def probe(config: ClusterConfig, running: ClusterConfig | None = None) -> None:
    """Check that ``config`` can start here. ``running``: the config of the cluster it replaces
    (its own ``--port`` is held by its rank 0 until it stops, so that port is not probed)."""
    missing = backend_spec(config.backend).unavailable()
    if missing:
        raise ValueError(missing)
    if config.port is not None and not (running is not None and running.port == config.port):
        holder = port_in_use(config.port)
        if holder:
            raise ValueError(f"--port {config.port} is in use on this machine ({holder}). "
                             "Choose another --port, or leave --port out (no port is needed on one machine).")
    if config.gpus and not launcher_class(config.launcher).remote:  # remote launchers probe their hosts
        have = visible_gpus()
        if have < config.n:
            raise ValueError(
                f"--gpus {config.n} asks for {config.n} GPUs but this machine has {have} visible CUDA GPU(s). "
                f"Use -n {config.n} to run {config.n} CPU ranks with gloo" + (f", or --gpus {have}." if have else ".")
            )
