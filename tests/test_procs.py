"""jdist.common.procs on real processes: a process's identity holds when the machine's wall clock is set."""

from __future__ import annotations

import os

import psutil
import pytest

from jdist.common.procs import alive, identity
from jdist.kernel.launch.ipcontroller import owner_alive, write_owner


@pytest.mark.skipif(not hasattr(psutil, "_pslinux"), reason="the boot time psutil reads is Linux's /proc/stat")
def test_a_process_is_itself_after_the_wall_clock_is_set(monkeypatch, tmp_path):
    me = identity(os.getpid())
    write_owner(tmp_path / "owner", os.getpid())
    # the wall clock set 2 s on (a VM's clock corrected after a pause): the boot time in /proc/stat moves with it,
    # and psutil's create_time with that; a controller then took its living kernel for gone and ended
    boot_time = psutil._pslinux.boot_time
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: boot_time() + 2.0)
    assert alive(me) and owner_alive(tmp_path / "owner")
    assert not alive({"pid": os.getpid(), "create_time": me["create_time"] - 1.0})  # another process's start
