"""The load of a rank's host: CPU, memory, network and GPUs, as :class:`jdist.protocol.HostMessage`.

The lowest rank of each host (local rank 0) samples it about once a second from its publisher
thread while a cell runs, never on the training thread: ``/proc/stat`` (CPU busy since the
previous sample, all cores), ``/proc/meminfo`` (``MemTotal - MemAvailable``), ``/proc/net/dev``
(bytes in and out per second, loopback left out) and, where ``pynvml`` (``nvidia-ml-py``) is
installed and NVML finds GPUs, each GPU's utilisation and memory. A read costs well under a
millisecond. Elsewhere than Linux the CPU, memory and network are ``None``/0.

Example:
    >>> sampler = HostSampler()
    >>> first = sampler.sample(cell=1)
    >>> first["kind"], first["cpu"] is None, first["mem_total"] > 0
    ('host', True, True)
"""

from __future__ import annotations

import socket
import time
from typing import Any

from jdist.protocol import PROTOCOL_VERSION, GpuSample, HostMessage

#: Seconds between two samples of a host.
EVERY_S = 1.0


class HostSampler:
    """Samples this host; the CPU and network figures are rates since the previous sample (the
    first sample has none)."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self._cpu: tuple[int, int] | None = None  # (busy, total) jiffies at the previous sample
        self._net: tuple[int, float] | None = None  # (bytes, monotonic time) at the previous sample
        self._nvml: Any = None  # the pynvml module once initialised; False: not available
        self.last = -1e9  # monotonic time of the previous sample

    def due(self, now: float) -> bool:
        return now - self.last >= EVERY_S

    def sample(self, cell: int) -> HostMessage:
        self.last = time.monotonic()
        used, total = _memory()
        return HostMessage(v=PROTOCOL_VERSION, kind="host", cell=cell, host=self.host, time=time.time(),
                           cpu=self._cpu_busy(), mem_used=used, mem_total=total, net_bytes_s=self._net_rate(),
                           gpus=self._gpus())

    def _cpu_busy(self) -> float | None:
        try:
            with open("/proc/stat", "rb") as fh:
                fields = [int(x) for x in fh.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
        busy = total - idle
        prev, self._cpu = self._cpu, (busy, total)
        if prev is None or total <= prev[1]:
            return None
        return (busy - prev[0]) / (total - prev[1])

    def _net_rate(self) -> float | None:
        try:
            with open("/proc/net/dev", "rb") as fh:
                lines = fh.read().decode().splitlines()[2:]
        except OSError:
            return None
        count = 0
        for line in lines:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                continue
            cols = rest.split()
            count += int(cols[0]) + int(cols[8])  # bytes received + transmitted
        now = time.monotonic()
        prev, self._net = self._net, (count, now)
        if prev is None or now <= prev[1]:
            return None
        return max(0.0, (count - prev[0]) / (now - prev[1]))

    def _gpus(self) -> list[GpuSample]:
        if self._nvml is False:
            return []
        try:
            if self._nvml is None:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            nvml = self._nvml
            out = []
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
                out.append(GpuSample(index=i, util=util, mem_used=int(mem.used), mem_total=int(mem.total)))
            return out
        except Exception:  # no pynvml, no driver, no GPU: the host's GPUs stay unknown
            self._nvml = False
            return []


def _memory() -> tuple[int, int]:
    """Bytes in use (``MemTotal - MemAvailable``) and in all; (0, 0) where ``/proc/meminfo`` is not."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            info = {}
            for line in fh:
                name, _, rest = line.partition(b":")
                if name in (b"MemTotal", b"MemAvailable"):
                    info[name] = int(rest.split()[0]) * 1024
                    if len(info) == 2:
                        break
    except OSError:
        return 0, 0
    total = info.get(b"MemTotal", 0)
    return total - info.get(b"MemAvailable", total), total


__all__ = ["EVERY_S", "HostSampler"]
