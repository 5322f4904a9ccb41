"""Out of memory with what took it (jdist.kernel.supervise.memory): a MemoryError on one real rank, under a memory
limit on that rank alone."""

from __future__ import annotations

import pytest

OOM = """
for step in range(30):
    loss = model(torch.randn(64, 256)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    if step == 10:
        time.sleep(1.1)   # (the state's bytes are counted about once a second)
if rank == 1:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 2**20, hard))   # this rank's memory: 256 MiB more
    try:
        junk = bytearray(2 * 2**30)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
"""


@pytest.mark.cluster
def test_a_memory_error_on_one_rank_says_what_took_the_memory_and_the_fixes_with_numbers(cluster_kernel):
    k = cluster_kernel
    k.run("%%distributed\nimport resource, time\n"
          "net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1))\n"
          "model, opt = jdist.prepare(net, torch.optim.Adam(net.parameters()))")
    out = k.run("%%distributed\n" + OOM, allow_error=True, timeout=120)
    shown = out.shown
    assert "first failure on rank 1: MemoryError" in shown, shown
    assert "rank 1 ran out of memory (MemoryError): host memory (RSS) " in shown and " at its last record (peak " in shown
    # 263,169 float32 parameters (1 MiB), as many gradients, Adam's two moments
    assert "what jdist counts (prepared models and optimizers): parameters 1 MiB, gradients 1 MiB, optimizer state " \
           "2 MiB (4 MiB); the rest, " in shown, shown
    assert "The other ranks' peaks: r0 " in shown
    assert "Fixes, in order: (1) shard the state over the 2 ranks: --backend fsdp holds about 2 MiB of the 4 MiB per " \
           "rank; (2) half the micro-batch" in shown, shown
    out = k.run("%%distributed --output all\nprint('after', torch.ones(2 ** 20).sum().item())")  # the ranks go on
    assert out.stdout.count("after 1048576.0") == 2, out.stdout


def _memory_cgroup() -> tuple[str, str] | None:
    """A memory cgroup this test may make a child of (this process's own: the ranks start in it), and the name of
    its limit file; None where there is none to write (cgroup v1's memory controller or cgroup v2's)."""
    import os
    from pathlib import Path

    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidates = [(Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes")]
        elif controllers == "":
            candidates = [(Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"),
                          (Path("/sys/fs/cgroup/unified") / path.lstrip("/"), "memory.max")]
        else:
            continue
        for parent, limit in candidates:
            probe = parent / f"jdist-probe-{os.getpid()}"
            try:
                probe.mkdir()
            except OSError:
                continue
            try:
                ok = (probe / limit).exists()
                if ok:
                    (probe / limit).write_text(str(2**30))
            except OSError:
                ok = False
            finally:
                probe.rmdir()
            if ok:
                return str(parent), limit
    return None


KILLED = """
import os, time
keep = []
for step in range(40):
    if rank == 1:
        if step == 3:   # this rank alone under a memory limit of 150 MiB more than it holds
            os.makedirs(CGROUP, exist_ok=True)
            open(os.path.join(CGROUP, LIMIT), "w").write(str(150 * 2**20))
            open(os.path.join(CGROUP, "cgroup.procs"), "w").write(str(os.getpid()))
        if step >= 3:
            keep.append(torch.ones(5 * 2**20))   # 20 MiB a step, written
    jdist.log(loss=float(step))
    time.sleep(0.25)
"""


@pytest.mark.cluster
def test_a_rank_the_oom_killer_ends_under_its_memory_limit_is_said_with_its_growth_and_the_rank_that_grew(
        cluster_kernel):
    """A real cgroup memory limit on rank 1 alone (skipped where no memory cgroup can be made): the kernel's OOM
    killer ends it with SIGKILL, and the death says so, with its memory and growth from its last records."""
    import os
    import time
    from pathlib import Path

    found = _memory_cgroup()
    if found is None:
        pytest.skip("no memory cgroup to make a child of here (cgroup v1 memory or v2 memory.max, writable)")
    parent, limit = found
    child = Path(parent) / f"jdist-oom-test-{os.getpid()}"
    k = cluster_kernel
    try:
        out = k.run(f"%%distributed\nCGROUP, LIMIT = {str(child)!r}, {limit!r}\n" + KILLED, allow_error=True,
                    timeout=120)
        shown = out.shown
        assert "rank 1 died: killed by the out-of-memory killer (its host, or a memory limit" in shown, shown
        assert "rank 1 was killed by the out-of-memory killer: host memory (RSS) " in shown, shown
        assert " at its last record (peak " in shown and "/s over its last " in shown, shown
        assert "Growth over the last records: r1 +" in shown and "rank 1 grew the most." in shown, shown
        assert "The other ranks' peaks: r0 " in shown and "Fixes, in order: " in shown, shown
    finally:
        for _ in range(50):  # (an empty cgroup is removed with rmdir, once its one process is gone)
            try:
                child.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
    # (the ranks are gone: the module's kernel stops with them; %dist restart after a death is test_faults.py's)
