"""Cell execution end to end (jdist.kernel.supervise): a real kernel, a real 2-rank MPI cluster,
real DDP on gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jdist.metrics.store import read_frames

TRAIN = """
torch.manual_seed(rank)                      # different data per rank
model = jdist.prepare(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
jdist.progress(total_steps={steps}, batch_size=16)
for step in range({steps}):
    x = torch.randn(16, 8); y = x.sum(1, keepdim=True)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    jdist.log(step=step, loss=loss.item())
"""


@pytest.fixture(scope="module")
def trained(cluster_kernel):
    out = cluster_kernel.run("%%distributed\n" + TRAIN.format(steps=60))
    return cluster_kernel, out


def test_state_persists_across_cells(cluster_kernel):
    cluster_kernel.run("%%distributed\nsecret = rank * 10 + 7")
    out = cluster_kernel.run("%%distributed --output all\nprint('secret', secret)")
    assert "[rank 0] secret 7" in out.stdout and "[rank 1] secret 17" in out.stdout


def test_ddp_training_leaves_identical_parameters(trained):
    kernel, _ = trained
    kernel.run("%%distributed\nflat = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()")
    kernel.run("%dist pull flat")
    flat = kernel.value("flat")
    assert len(flat) == 2 and flat[0] == flat[1]
    # rank 1 started from different weights (seed per rank): DDP broadcast and synced them
    assert len(flat[0]) == 9


def test_every_record_of_every_rank_arrives(trained):
    kernel, _ = trained
    counts = kernel.value("[jdist.last_run().count(r) for r in (0, 1)]")
    assert counts == [60, 60]
    steps = kernel.value("sorted(set(jdist.last_run().history.query('rank == 1').step))")
    assert steps == list(range(60))


def test_history_columns_and_comm_time_positive(trained):
    kernel, _ = trained
    cols = kernel.value("jdist.last_run().history.columns.tolist()")
    for c in ["rank", "step", "loss", "step_time_s", "comm_time_s", "compute_time_s", "mem_bytes", "mem_peak_bytes", "samples_per_s"]:
        assert c in cols
    comm = kernel.value("jdist.last_run().history.comm_time_s.tolist()")
    assert all(c > 0 for c in comm), "every DDP step all-reduces gradients"
    ok = kernel.value("bool((jdist.last_run().history.eval('compute_time_s + comm_time_s - step_time_s').abs() < 1e-9).all())")
    assert ok
    mem = kernel.value("int(jdist.last_run().history.mem_bytes.min())")
    assert mem > 50 * 2**20  # a torch process's RSS
    sps = kernel.value("float(jdist.last_run().history.samples_per_s.min())")
    assert sps > 0


def test_loss_goes_down(trained):
    kernel, _ = trained
    first, last = kernel.value("(lambda h: (float(h[h.step < 5].loss.mean()), float(h[h.step >= 55].loss.mean())))(jdist.last_run().history)")
    assert last < first


def test_dashboard_shown_and_replaced_by_static_summary(trained):
    _, out = trained
    finals = [d for d in out.displays if "image/svg+xml" in d.get("data", {})]
    assert finals, [d.get("data", {}).keys() for d in out.displays]
    text = finals[-1]["data"]["text/plain"]
    assert "finished" in text and "loss" in text
    widgets = [d for d in out.displays if "application/vnd.jupyter.widget-view+json" in d.get("data", {})]
    assert widgets, "the live dashboard widget was displayed while the cell ran"


def test_run_log_written_to_disk(trained, kernel_env):
    kernel, _ = trained
    path = Path(kernel.value("str(jdist.last_run().path)"))
    assert path.parent == Path(kernel_env["JDIST_RUN_DIR"])
    meta = json.loads((path / "meta.json").read_text())
    assert meta["status"] == "finished" and meta["world_size"] == 2 and meta["records"] == 120
    batches, _ = read_frames(path / "metrics.jdc")
    assert sum(len(b) for b in batches) == 120 and batches[0][0]["loss"] > 0


# Transport loss for one cell: the ranks keep their records, but neither the live batches nor the
# records with the cell's end reach the kernel (only the end message's count does).
LOSE_RECORDS = (
    "_s = jdist.rank.session(); _send = type(_s.channel).publish.__get__(_s.channel)\n"
    "def _lossy(m):\n"
    "    if m['kind'] == 'cell_end':\n"
    "        _s.channel.publish = _send\n"
    "        _send({**m, 'records': []})\n"
    "    elif m['kind'] != 'records':\n"
    "        _send(m)\n"
    "_s.channel.publish = _lossy\n"
)


def test_a_runs_duration_is_its_cells_when_the_records_come_late(cluster_kernel):
    # 0.5 s of work, then 5 quick steps: their records come at the cell's end (the summary said "after 0.0 s")
    cluster_kernel.run("%%distributed\nimport time\ntime.sleep(0.5)\nfor step in range(5):\n    jdist.log(step=step, x=1.0)")
    started, ended = cluster_kernel.value("(jdist.last_run().started, jdist.last_run().ended)")
    assert ended - started >= 0.5
    head = cluster_kernel.value("jdist.last_run().summary().splitlines()[0]")
    assert float(head.split(" after ")[1].split(" s,")[0]) >= 0.5, head


COMPRESSED = """
def train_with(**compression):
    torch.manual_seed(0)
    m = jdist.prepare(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)), **compression)
    hooks.append([hook.__name__ for hook, _ in m._comm_hooks])
    o = torch.optim.SGD(m.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)   # each rank its own batches
    losses = []
    for step in range(40):
        x = torch.randn(16, 32, generator=g); y = x[:, :8].sum(1, keepdim=True) / 4
        loss = ((m(x) - y) ** 2).mean()
        o.zero_grad(); loss.backward(); o.step()
        losses.append(loss.item())
    return losses, float(sum(p.detach().double().sum() for p in m.parameters()))
hooks = []
trained = {c: train_with(**({} if c == "none" else {"compression": c}),
                         **({"powersgd_start_iter": 5} if c == "powersgd" else {}))
           for c in ("none", "fp16", "bf16", "powersgd")}
"""


def test_ddp_gradient_compression_trains_like_uncompressed_and_is_timed(cluster_kernel):
    # torch's own hooks (fp16/bf16 casts, PowerSGD rank 1 from step 5) on gloo, timed by DDP's reducer (no Python
    # timing hook of jdist's: tests/test_auto_metrics.py)
    out = cluster_kernel.run("%%distributed\n" + COMPRESSED, timeout=120)
    assert out.error is None, out.shown
    timed = cluster_kernel.value("[int((jdist.last_run().history.query('rank == 0').comm_time_s"
                                 ".iloc[40 * i:40 * (i + 1)] > 0).sum()) for i in range(4)]")  # each model's 40 steps
    assert all(timed), timed  # (on CPU ranks the reducer's statistics time sampled steps: jdist/rank/auto_metrics.py)
    sent = cluster_kernel.value("[jdist.last_run().history.query('rank == 1').comm_bytes.iloc[40 * i:40 * (i + 1)]"
                                ".astype(int).tolist() for i in range(4)]")
    # the bytes the all-reduces carried, every step: 2177 float32 gradients (8708 B); half of it in fp16 and bf16;
    # PowerSGD rank 1 after its 5 plain steps: P and Q of the 64x32 weight (64 + 32) and the 129 values it leaves
    # uncompressed (biases, the 1x64 weight), 225 floats
    assert sent == [[8708] * 40, [4354] * 40, [4354] * 40, [8708] * 5 + [900] * 35], sent
    cluster_kernel.run("%dist pull trained")
    trained = cluster_kernel.value("trained")
    cluster_kernel.run("%dist pull hooks")
    assert cluster_kernel.value("hooks") == [[[], ["jdist_fp16_compress_hook"], ["jdist_bf16_compress_hook"],
                                              ["jdist_powerSGD_hook"]]] * 2  # (no Python timing hook on CPU ranks)
    for ranks in zip(*[t.items() for t in trained]):  # the replicas stay identical under every compression
        assert len({params for _, (_, params) in ranks}) == 1, ranks
    plain = trained[0]["none"][0]
    for c, tolerance in (("fp16", 0.01), ("bf16", 0.05), ("powersgd", 0.2)):
        losses = trained[0][c][0]
        assert losses[-1] < losses[0] / 4, (c, losses)  # it trains
        assert abs(losses[-1] - plain[-1]) <= tolerance * plain[-1] + 1e-3, (c, losses[-1], plain[-1])


RESUMED = """
from jdist.rank.backends.ddp import powersgd_states
def net_and_opt(seed):
    torch.manual_seed(seed)
    m = jdist.prepare(nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)),
                      compression="powersgd", powersgd_start_iter=3, bucket_cap_mb=0.25)   # (several buckets)
    return m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
def train(m, o, steps):
    losses = []
    for step in steps:
        g = torch.Generator().manual_seed(1000 * rank + step)
        x = torch.randn(16, 32, generator=g); y = x[:, :8].sum(1, keepdim=True) / 4
        loss = ((m(x) - y) ** 2).mean(); o.zero_grad(); loss.backward(); o.step(); losses.append(loss.item())
    return losses
m, o = net_and_opt(0)
train(m, o, range(8))
jdist.save_checkpoint(PATH, model=m, optimizer=o, step=8)
straight = train(m, o, range(8, 16))
m2, o2 = net_and_opt(1)
jdist.load_checkpoint(PATH, model=m2, optimizer=o2)
resumed = train(m2, o2, range(8, 16))
m3, o3 = net_and_opt(2)
jdist.load_checkpoint(PATH, model=m3, optimizer=o3)
(hook3, state3), (_, fresh) = powersgd_states(m3)[0], powersgd_states(net_and_opt(3)[0])[0]
hook3.pending.clear()   # m3 as before: the state a new hook starts from
for name in ("iter", "error_dict", "p_memory_dict", "q_memory_dict"):
    setattr(state3, name, getattr(fresh, name))
unrestored = train(m3, o3, range(8, 16))
def close(a, b, rtol):
    return all(abs(x - y) <= rtol * abs(y) for x, y in zip(a, b))
resume = (close(resumed, straight, 1e-5), not close(unrestored, straight, 1e-3))
"""


def test_a_powersgd_run_resumes_exactly_from_its_checkpoint(cluster_kernel, tmp_path):
    # PowerSGD's step count, P/Q (warm start) and each rank's error feedback are in the checkpoint; several
    # buckets, which PowerSGD on gloo runs one after the other (else a rank aborts: jdist/rank/backends/ddp.py)
    out = cluster_kernel.run("%%distributed\n" + RESUMED.replace("PATH", repr(str(tmp_path / "psgd.pt"))))
    assert out.error is None, out.shown
    cluster_kernel.run("%dist pull resume")
    # the same 8 losses, to the bit where MKL's kernels do not depend on the buffers' alignment (MKL_CBWR=COMPATIBLE;
    # on an AVX-512 EPYC they differed in the 7th digit from step 5 without it); without the state: off by far more
    assert cluster_kernel.value("resume") == [(True, True)] * 2


def test_lost_stream_batches_are_fetched_from_the_ranks(cluster_kernel):
    # Lose every record in transport: only the end-of-cell count reaches the kernel,
    # and the kernel must fetch all records itself.
    cluster_kernel.run(
        "%%distributed\n" + LOSE_RECORDS +
        "for step in range(25):\n"
        "    jdist.log(step=step, x=float(step))\n"
        "    if step % 5 == 0: __import__('time').sleep(0.12)\n"
    )
    assert cluster_kernel.value("[jdist.last_run().count(r) for r in (0, 1)]") == [25, 25]


def test_records_beyond_what_ranks_keep_are_reported_lost(cluster_kernel):
    cluster_kernel.run("%%distributed\n_stream = jdist.rank.session().stream\n_stream.keep_first = _stream.keep_last = 5")
    try:
        out = cluster_kernel.run(
            "%%distributed\n" + LOSE_RECORDS +
            "for step in range(20):\n"
            "    jdist.log(step=step, x=1.0)\n"
        )
        assert cluster_kernel.value("[jdist.last_run().count(r) for r in (0, 1)]") == [10, 10]
        assert "10 of 20 records of rank 0 were lost in transport" in out.stderr
        assert cluster_kernel.value("sorted(jdist.last_run().history.query('rank == 0').step)") == [0, 1, 2, 3, 4, 15, 16, 17, 18, 19]
    finally:
        cluster_kernel.run("%%distributed\ndel _stream.keep_first, _stream.keep_last")


def test_syntax_error_reported_once_and_not_sent(cluster_kernel):
    out = cluster_kernel.run("%%distributed\nfor x in :\n    pass", allow_error=True)
    assert out.error is not None
    assert "not sent to the ranks" in out.traceback and out.traceback.count("SyntaxError") == 1
