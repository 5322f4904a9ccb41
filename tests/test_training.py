"""Training features on real 2-rank MPI clusters, once per backend (ddp, fsdp, horovod, deepspeed).

The same rank code runs under every backend with only the backend name changed:
``jdist.prepare(model, opt)``, gradient accumulation, bf16/fp16, clipping, LR helpers,
communication timing, and checkpoint/resume across a cluster restart. Nothing is mocked.
"""

from __future__ import annotations

import pytest
from conftest import wait_for
from ipyparallel import interactive

from jdist.kernel.cluster import ClusterSession
from jdist.options import ClusterConfig
from jdist.plugins import backend_spec

DEEPSPEED, HOROVOD = backend_spec("deepspeed"), backend_spec("horovod")

BACKENDS = {
    "ddp": "ddp",
    "fsdp": "fsdp",
    "horovod": pytest.param("horovod", marks=pytest.mark.skipif(
        HOROVOD.unavailable() is not None, reason="Horovod is not installed: make horovod (make test installs it)")),
    "deepspeed": pytest.param("deepspeed", marks=pytest.mark.skipif(
        DEEPSPEED.unavailable() is not None, reason="DeepSpeed is not installed: pip install 'jdist[deepspeed]'")),
}


def pytest_generate_tests(metafunc):
    """Every test on every backend, or on those its ``backends`` mark names: declared the same way
    for all tests, so pytest groups them by backend and starts each backend's cluster once."""
    if "cluster" in metafunc.fixturenames:
        mark = metafunc.definition.get_closest_marker("backends")
        names = mark.args if mark else tuple(BACKENDS)
        metafunc.parametrize("cluster", [BACKENDS[n] for n in names], indirect=True, scope="module")

# Rank-side helpers, sent with the test: a small model with dropout (so RNG state matters)
# and a DistributedSampler loader (so the loader position matters).
COMMON = r'''
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler

def make_model(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

g = torch.Generator().manual_seed(1)
X = torch.randn(256, 16, generator=g)
Y = X @ torch.randn(16, 4, generator=g) / 4  # learnable

def make_loader(bs=8):
    ds = TensorDataset(X, Y)
    return DataLoader(ds, batch_size=bs, sampler=DistributedSampler(ds, num_replicas=world_size, rank=rank, seed=0))

def full(t):
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().float().clone()

def params(model):
    return {k: full(v) for k, v in model.state_dict().items()}

def digest(model):
    return sum(float(v.double().sum()) * (i + 1) for i, v in enumerate(params(model).values()))
'''


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(tmp_path_factory.getbasetemp() / "ipython-test-training"))
        # automatic step records off (tests/test_auto_metrics.py has them): these loops read the comm timer
        # themselves, and the watchdog test trains without any record
        c = ClusterSession(ClusterConfig(n=2, backend=request.param, timeout=60, auto_metrics=False))
        c.start(lambda msg: None)
        _run(c, COMMON)
        yield c
        c.stop()


def _run(cluster: ClusterSession, code: str, timeout: float = 180) -> list[str]:
    ar = cluster.execute(code)
    try:
        ar.get(timeout=timeout)
    except Exception as exc:
        ranks = "\n".join(f"[rank {r}] {out}{err}" for r, (out, err) in enumerate(zip(ar.stdout, ar.stderr)))
        raise AssertionError(f"{exc}\n{ranks}") from None
    return list(ar.stdout)


def _pull(cluster: ClusterSession, name: str) -> list:
    return cluster.pull(name)


def test_same_code_trains_under_every_backend_with_comm_time(cluster):
    _run(cluster, r'''
model = make_model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, opt, loader = jdist.prepare(model, opt, make_loader())
jdist.rank.session().timer.take()
comm, losses = 0.0, []
for epoch in range(2):
    loader.set_epoch(epoch)
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        jdist.backward(loss)
        opt.step(); opt.zero_grad()
        comm += jdist.rank.session().timer.take()
        losses.append(loss.item())
result = dict(kind=type(opt.optimizer).__name__, hvd=getattr(opt.optimizer, "_jdist_horovod", False), first=sum(losses[:4]) / 4, last=sum(losses[-4:]) / 4,
              comm=comm, digest=digest(model), batch_size=jdist.rank.session().batch_size)
''')
    results = _pull(cluster, "result")
    backend = cluster.config.backend
    for r in results:
        assert r["last"] < r["first"], r  # it learns
        assert r["comm"] > 0, f"{backend}: no communication time measured"
        assert r["batch_size"] == 8
    assert results[0]["digest"] == pytest.approx(results[1]["digest"], rel=1e-6)  # ranks agree
    if backend == "horovod":
        assert all(r["kind"] == "AdamW" and r["hvd"] for r in results)  # Horovod's DistributedOptimizer subclass


def test_grad_accumulation_matches_one_large_batch(cluster):
    _run(cluster, r'''
def train(K, steps=3, total=16):
    m = make_model(dropout=0.0)  # compare exactly
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    m, o = jdist.prepare(m, o, grad_accum=K)
    mb = total // K
    for s in range(steps):
        for k in range(K):
            i = rank * 128 + s * total + k * mb
            jdist.backward(nn.functional.mse_loss(m(X[i:i + mb]), Y[i:i + mb]))
            o.step(); o.zero_grad()
    return params(m)
one, four = train(1), train(4)
jdist.prepare(make_model(), grad_accum=1)
accum_diff = max((one[k] - four[k]).abs().max().item() for k in one)
''')
    assert max(_pull(cluster, "accum_diff")) < 1e-5


def test_precision_bf16_and_fp16_train_and_fp16_uses_a_grad_scaler(cluster):
    # DeepSpeed runs fp16 on GPU ranks only (refused on CPU ranks: tests/test_deepspeed.py)
    for precision in ("bf16",) if cluster.config.backend == "deepspeed" else ("bf16", "fp16"):
        cluster.apply_live({"precision": precision})
        _run(cluster, r'''
model = make_model()
model, opt = jdist.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
losses, inside = [], set()
first = next(m for m in model.modules() if isinstance(m, nn.Linear))
first.register_forward_hook(lambda mod, args, output: inside.add(str(output.dtype)))
for i in range(30):
    xb, yb = X[(i % 16) * 16:(i % 16 + 1) * 16], Y[(i % 16) * 16:(i % 16 + 1) * 16]
    out = model(xb)
    loss = nn.functional.mse_loss(out, yb)
    jdist.backward(loss)
    jdist.clip_grad_norm_(model, 1.0)
    opt.step(); opt.zero_grad()
    losses.append(loss.item())
result = dict(out_dtype=str(out.dtype), finite=all(l == l for l in losses), learned=losses[-1] < losses[0],
              scaler=type(jdist.rank.session().train.scaler).__name__, inside=sorted(inside))
''')
        for r in _pull(cluster, "result"):
            assert r["out_dtype"] == "torch.float32" and r["finite"] and r["learned"], r
            assert r["inside"] == ["torch.bfloat16" if precision == "bf16" else "torch.float16"], r
            assert r["scaler"] == ("NoneType" if precision == "bf16" else
                                   "ShardedGradScaler" if cluster.config.backend == "fsdp" else "GradScaler"), r
    cluster.apply_live({"precision": "fp32"})
    _run(cluster, "prec = jdist.precision()")
    assert _pull(cluster, "prec") == ["fp32", "fp32"]


@pytest.mark.backends("ddp", "fsdp", "horovod")  # DeepSpeed: fp16 on GPU ranks only
def test_fp16_without_jdist_backward_says_what_to_call(cluster):
    cluster.apply_live({"precision": "fp16"})
    try:
        ar = cluster.execute(r'''
model = make_model()
model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
nn.functional.mse_loss(model(X[:8]), Y[:8]).backward()
opt.step()
''')
        with pytest.raises(Exception, match=r"jdist.backward\(loss\)"):
            ar.get(timeout=60)
    finally:
        cluster.apply_live({"precision": "fp32"})


@pytest.mark.backends("ddp", "fsdp", "horovod")  # DeepSpeed clips inside its step: tests/test_deepspeed.py
def test_clip_grad_norm_is_global_across_ranks(cluster):
    _run(cluster, r'''
model = make_model(dropout=0.0)
model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
xb, yb = X[rank * 64:(rank + 1) * 64], Y[rank * 64:(rank + 1) * 64] * 100
jdist.backward(nn.functional.mse_loss(model(xb), yb))
norm = jdist.clip_grad_norm_(model, 0.5)
after = torch.sqrt(sum(full(p.grad).pow(2).sum() for p in model.parameters())).item()
clip = (norm, after)
opt.step(); opt.zero_grad()
''')
    (n0, a0), (n1, a1) = _pull(cluster, "clip")
    assert n0 == pytest.approx(n1, rel=1e-5) and n0 > 0.5  # one global norm, from averaged gradients
    assert a0 == pytest.approx(0.5, rel=1e-3) and a1 == pytest.approx(0.5, rel=1e-3)


def test_lr_helpers_scale_and_warm_up_per_optimizer_step(cluster):
    _run(cluster, r'''
model = make_model()
base = jdist.scale_lr(0.1, "linear")
model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=base), grad_accum=2)
sched = jdist.warmup(opt, steps=4)
lrs = [opt.param_groups[0]["lr"]]
for i in range(8):  # 8 micro-batches = 4 optimizer steps
    jdist.backward(nn.functional.mse_loss(model(X[i * 8:(i + 1) * 8]), Y[i * 8:(i + 1) * 8]))
    opt.step(); sched.step(); opt.zero_grad()
    lrs.append(opt.param_groups[0]["lr"])
jdist.prepare(make_model(), grad_accum=1)
''')
    lrs = _pull(cluster, "lrs")[0]
    assert lrs[0] == pytest.approx(0.1)  # 0.2 (linear rule, 2 ranks) x start factor 1/2
    assert lrs[-1] == pytest.approx(0.2)
    assert lrs[1] == lrs[0] and lrs[2] > lrs[1]  # the schedule moves on optimizer steps, not micro-steps


#: Backends whose resume test restarts the ranks first (new processes: nothing of the first run is left in
#: memory). Restarting is the launcher's and each backend's set-up again, the same for every backend; a restart
#: costs 10-20 CPU-s on 2 cores, so Horovod (ddp's full-state checkpoint, with its own optimizer) and DeepSpeed
#: resume on the same ranks into new objects here. DeepSpeed's resume after a restart is
#: test_deepspeed.py::test_auto_restart_recreates_the_zero_3_engine_and_restores_its_checkpoint; Horovod's set-up
#: after a restart is test_fault_matrix.py's Horovod row (its exception, hang and second interrupt restart the ranks).
RESTART_TO_RESUME = ("ddp", "fsdp")


def test_checkpoint_resume_after_cluster_restart_matches_uninterrupted(cluster, tmp_path):
    ckpt = tmp_path / "ckpt"
    train = r'''
def train_until(stop, model, opt, sched, loader, step=0, epoch=0, save_at=None):
    while step < stop:
        loader.set_epoch(epoch)
        for xb, yb in loader:
            jdist.backward(nn.functional.mse_loss(model(xb), yb))
            opt.step(); sched.step(); opt.zero_grad()
            step += 1
            if step == save_at:
                jdist.save_checkpoint(CKPT, model=model, optimizer=opt, scheduler=sched, loader=loader, step=step,
                                      epoch=epoch, note="mid-epoch")
            if step == stop:
                return step
        epoch += 1
    return step

def fresh():
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return jdist.prepare(model, opt, sched, make_loader())
'''
    _run(cluster, f"CKPT = {str(ckpt)!r}\n" + train + r'''
model, opt, sched, loader = fresh()
train_until(20, model, opt, sched, loader)
uninterrupted = params(model)
model, opt, sched, loader = fresh()
train_until(20, model, opt, sched, loader, save_at=10)   # 16 batches per epoch: step 10 is mid-epoch 0
''')
    reference = _pull(cluster, "uninterrupted")
    if cluster.config.backend in RESTART_TO_RESUME:
        cluster.restart()
    else:  # the same ranks, with everything the first run made gone
        _run(cluster, "del model, opt, sched, loader, uninterrupted\nimport gc; gc.collect()")
    _run(cluster, COMMON + f"CKPT = {str(ckpt)!r}\n" + train + r'''
model, opt, sched, loader = fresh()
state = jdist.load_checkpoint(CKPT, model=model, optimizer=opt, scheduler=sched, loader=loader)
train_until(20, model, opt, sched, loader, step=state["step"], epoch=state["epoch"])
resumed = params(model)
''')
    states = _pull(cluster, "state")
    assert states[0] == {"step": 10, "epoch": 0, "note": "mid-epoch"}
    import torch

    for ref, got in zip(reference, _pull(cluster, "resumed")):
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=0, atol=1e-6)
    assert ckpt.is_dir() == (cluster.config.backend in ("fsdp", "deepspeed"))  # sharded: a folder


def test_automatic_checkpoints_every_n_steps_keep_the_newest(cluster, tmp_path):
    _run(cluster, f"AUTO = {str(tmp_path / 'auto')!r}\n" + r'''
model = make_model()
model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
jdist.checkpoint_every(5, AUTO, keep=2, model=model, optimizer=opt)
for step in range(1, 16):
    jdist.backward(nn.functional.mse_loss(model(X[:8]), Y[:8]))
    opt.step(); opt.zero_grad()
    jdist.log(step=step, loss=0.0)
jdist.checkpoint_every(None)
latest = str(jdist.latest_checkpoint(AUTO))
''')
    assert sorted(p.name for p in (tmp_path / "auto").iterdir()) == ["step-00000010", "step-00000015"]
    assert _pull(cluster, "latest")[0].endswith("step-00000015")


@interactive
def _state_bytes():
    import jdist

    return jdist.rank.sources.state_bytes(jdist.rank.session())


def test_state_bytes_metric_counts_local_shards_by_kind(cluster):
    """Parameters, gradients and AdamW state of a 1.1M-parameter model, as this rank holds them."""
    _run(cluster, r'''
big = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))
big, bopt = jdist.prepare(big, torch.optim.AdamW(big.parameters(), lr=1e-3))
jdist.backward(big(torch.randn(4, 512)).pow(2).mean())
bopt.step()
''')
    per_rank = cluster.apply(_state_bytes)
    n_params = 512 * 1024 + 1024 + 1024 * 512 + 512
    p = 4 * n_params  # fp32
    # (parameters, gradients, optimizer state) in units of p; the small models prepared earlier in
    # this module add under 1 %
    expected = {"ddp": (1, 1, 2), "horovod": (1, 1, 2), "fsdp": (0.5, 0.5, 1),
                # ZeRO-2: parameters replicated; gradient partitions freed by the step; optimizer state:
                # this rank's half of fp32 master weights and of both AdamW moments
                "deepspeed": (1, 0, 1.5)}[cluster.config.backend]
    for got in per_rank:
        assert got.params == pytest.approx(expected[0] * p, rel=0.05), got
        assert got.grads == pytest.approx(expected[1] * p, rel=0.05, abs=0.01 * p), got
        assert got.optimizer == pytest.approx(expected[2] * p, rel=0.05), got
        assert got.total == got.params + got.grads + got.optimizer
    _run(cluster, "del big, bopt")


@pytest.mark.backends("horovod")
def test_horovod_fp16_compression_trains_and_ranks_agree(cluster):
    _run(cluster, r'''
model = make_model(dropout=0.0)
model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05), compression="fp16", grad_accum=2)
losses = []
for i in range(40):
    xb, yb = X[rank * 128 + (i % 16) * 8:][:8], Y[rank * 128 + (i % 16) * 8:][:8]
    loss = nn.functional.mse_loss(model(xb), yb)
    jdist.backward(loss); opt.step(); opt.zero_grad(); losses.append(loss.item())
result = dict(comp=opt.optimizer._compression.__name__, passes=opt.optimizer.backward_passes_per_step,
              learned=sum(losses[-8:]) < sum(losses[:8]), digest=digest(model))
jdist.prepare(make_model(), grad_accum=1)
''')
    r0, r1 = _pull(cluster, "result")
    assert r0["comp"] == "FP16Compressor" and r0["passes"] == 2 and r0["learned"]
    assert r0["digest"] == pytest.approx(r1["digest"], rel=1e-6)


@pytest.mark.backends("fsdp")
def test_fsdp_options_shard_policy_mixed_precision_policy_and_clear_errors(cluster):
    _run(cluster, r'''
model = make_model(dropout=0.0)
model, opt = jdist.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2), shard=[nn.Linear],
                           param_dtype="bf16", reduce_dtype="fp32", reshard_after_forward=False)
from torch.distributed.fsdp import FSDPModule
sharded = [type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule)]
losses = []
for i in range(20):
    out = model(X[i * 8:(i + 1) * 8])
    loss = nn.functional.mse_loss(out.float(), Y[i * 8:(i + 1) * 8])
    jdist.backward(loss); opt.step(); opt.zero_grad(); losses.append(loss.item())
timer, sent = jdist.rank.session().timer, []
for i in range(2):  # the bytes of one step's all-gathers and reduce-scatters (the records' comm_bytes)
    timer.take_sent()
    jdist.backward(nn.functional.mse_loss(model(X[:8]).float(), Y[:8])); opt.zero_grad()
    sent.append(timer.take_sent())
errors = []
for kwargs in ({"cpu_offload": True}, {"wrap": True}):
    try:
        jdist.prepare(make_model(), **kwargs)
    except Exception as exc:
        errors.append(str(exc))
result = dict(sharded=sharded, out=str(out.dtype), learned=losses[-1] < losses[0], errors=errors, sent=sent)
''')
    r = _pull(cluster, "result")[0]
    assert r["sent"][0] > 0 and r["sent"][0] == r["sent"][1], r["sent"]
    assert r["sharded"].count("FSDPLinear") == 3 and r["sharded"][0] == "FSDPSequential"
    assert r["out"] == "torch.bfloat16" and r["learned"]  # FSDP's own mixed precision: bf16 compute
    assert "these ranks already run on the CPU" in r["errors"][0] and "--gpus N" in r["errors"][0]
    assert "unknown option(s) for --backend fsdp: wrap" in r["errors"][1]


@pytest.mark.backends("fsdp")
def test_fsdp_cpu_ranks_shard_on_a_cpu_mesh_where_cuda_exists(cluster):
    # On a GPU machine, fully_shard's default mesh is a CUDA mesh even for CPU ranks ("Expected all
    # tensors to be on the same device ... cuda:0 and cpu", seen on an H100). This CPU-only torch
    # has no CUDA, so the test makes torch report one, as it does there, while the model is sharded.
    _run(cluster, r'''
from unittest import mock
with mock.patch("torch._C._get_accelerator", return_value=torch.device("cuda")):
    model = jdist.prepare(make_model(dropout=0.0))
weight = next(model.parameters())
loss = model(X[:8]).pow(2).mean(); jdist.backward(loss)
result = dict(mesh=weight.device_mesh.device_type, device=str(weight.device), grad=weight.grad is not None)
''')
    for r in _pull(cluster, "result"):
        assert r == {"mesh": "cpu", "device": "cpu", "grad": True}


def test_scheduler_made_before_prepare_follows_optimizer_steps_and_samples_count_micro_batches(cluster):
    _run(cluster, r'''
model = make_model()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=4)   # made before prepare
model, opt, sched, loader = jdist.prepare(model, opt, sched, make_loader(), grad_accum=2)
lrs = []
for i, (xb, yb) in enumerate(loader):
    jdist.backward(nn.functional.mse_loss(model(xb), yb))
    opt.step(); sched.step(); opt.zero_grad()
    if jdist.is_sync_step():                     # log once per optimizer step
        lrs.append(opt.param_groups[0]["lr"])
        jdist.log(loss=0.0)
    if i == 7:
        break
_sent = jdist.rank.session().stream.first   # the cell's records as sent (samples/s is filled in then)
''')
    lrs = _pull(cluster, "lrs")[0]
    assert lrs == pytest.approx([0.0625, 0.075, 0.0875, 0.1])  # one scheduler step per optimizer step
    _run(cluster, 'samples = [r["samples_per_s"] * r["step_time_s"] for r in _sent[-4:]]')
    for samples in _pull(cluster, "samples"):
        assert samples == pytest.approx([16.0] * 4)  # 2 micro-batches of 8 per logged step
    _run(cluster, "jdist.prepare(make_model(), grad_accum=1)")


@pytest.mark.backends("horovod")
def test_horovod_also_has_a_torch_group_and_warns_when_gradients_would_not_be_averaged(cluster):
    _run(cluster, r'''
import torch.distributed as dist, warnings
t = torch.tensor([float(rank + 1)]); dist.all_reduce(t)      # cell code written for ddp works
model = jdist.prepare(make_model())                          # no optimizer: Horovod would not average
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model(X[:4]); model(X[:4])
result = dict(total=t.item(), warnings=[str(w.message) for w in caught])
''')
    r = _pull(cluster, "result")[0]
    assert r["total"] == 3.0
    assert len(r["warnings"]) == 1 and "model, opt = jdist.prepare(model, opt)" in r["warnings"][0]


def test_watchdog_never_stops_healthy_training_without_output(cluster, tmp_path):
    # training with no output and no jdist.log under a 0.4 s watchdog until the watchdog has sampled the
    # ranks 15 times (every 0.125 s once quiet for 0.25 s; a sample waits for both ranks' answers, so
    # fewer per second under load): it finds them inside a collective or a backward most of the time (the
    # old watchdog's false hang), and must never call it one
    import threading

    from jdist.kernel.supervise.detectors import HangWatchdog, default_detectors
    from jdist.kernel.supervise.outcome import CellStatus
    from jdist.kernel.supervise.supervisor import CellSupervisor

    enough = tmp_path / "enough"
    code = r'''
import os, time, torch.distributed as dist
model = make_model(dropout=0.0)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
model, opt = jdist.prepare(model, opt)
def step():
    jdist.backward(nn.functional.mse_loss(model(X[:64]), Y[:64])); opt.step(); opt.zero_grad()
t0, steps, done = time.perf_counter(), 0, torch.zeros(1)
while not done.item():  # until the test has seen enough samples (by rank 0), the same steps on every rank
    for _ in range(25): step()
    steps += 25
    done.fill_(os.path.exists(ENOUGH) or time.perf_counter() - t0 >= 120); dist.broadcast(done, 0)
'''.replace("ENOUGH", repr(str(enough)))
    watchdog = HangWatchdog(0.4)

    def note_enough() -> None:
        wait_for(lambda: watchdog.samples_taken >= 15, timeout=120, interval=0.05, what="15 watchdog samples")
        enough.touch()

    threading.Thread(target=note_enough, daemon=True).start()
    sup = CellSupervisor(cluster, code, None, "none", lambda run: [], detectors=[*default_detectors(0), watchdog])
    result = sup.run()
    assert result.outcome.status is CellStatus.FINISHED, (result.outcome, result.hang)
    assert enough.exists() and watchdog.samples_taken >= 15  # it looked all along
    steps = _pull(cluster, "steps")
    assert steps[0] >= 25 and len(set(steps)) == 1, steps  # it trained, in step on every rank
