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
