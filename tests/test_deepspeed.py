"""``--backend deepspeed`` on a real 2-rank MPI cluster with real DeepSpeed (ZeRO 1/2/3, offload, bf16,
engines re-made, a user's own ``deepspeed.initialize``, a HF model built sharded, the HF ``Trainer``
with a DeepSpeed config, faults, interrupt, ``--auto-restart`` from a ZeRO-3 checkpoint).
The shared training features (accumulation, LR rules, checkpoints across a restart, the memory
breakdown) run under this backend in tests/test_training.py with the other backends' cell code.
GPU-only parts (NCCL, fp16 loss scaling) are in tests/test_gpu.py.
"""

from __future__ import annotations

import re

import pytest

from jdist.plugins import backend_spec

DEEPSPEED = backend_spec("deepspeed")

pytestmark = pytest.mark.skipif(DEEPSPEED.unavailable() is not None,
                                reason="DeepSpeed is not installed: pip install 'jdist[deepspeed]' (make test installs it)")

SETUP = r'''%%distributed
import gc, os, time, weakref, torch, torch.nn as nn, torch.distributed as dist
import deepspeed

def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

g = torch.Generator().manual_seed(1)
X, Y = torch.randn(160, 16, generator=g), torch.randn(160, 4, generator=g)

def full_params(model):
    """Every parameter, whole (ZeRO-3 gathers the shards)."""
    params = list(getattr(model, "module", model).parameters())
    with deepspeed.zero.GatheredParameters(params) if hasattr(params[0], "ds_id") else torch.no_grad():
        return [p.detach().float().clone() for p in params]

def ddp_reference(steps, lr=0.1):
    """What DDP gives: one model trained on both ranks' batches together (gradients averaged)."""
    m = make_model()
    o = torch.optim.SGD(m.parameters(), lr=lr)
    for s in range(steps):
        loss = nn.functional.mse_loss(m(X[s * 16:(s + 1) * 16]), Y[s * 16:(s + 1) * 16])
        loss.backward(); o.step(); o.zero_grad()
    return full_params(m)

def train(steps, lr=0.1, **kw):
    global losses
    losses = []
    model = make_model()
    model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=lr), **kw)
    for s in range(steps):
        i = s * 16 + rank * 8          # this rank's half of the reference's batch
        loss = nn.functional.mse_loss(model(X[i:i + 8]), Y[i:i + 8])
        jdist.backward(loss); opt.step(); opt.zero_grad()
        jdist.log(loss=loss)
        losses.append(loss.item())
    return model, opt

def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))
'''


def pulled(k, name):
    """``name`` from every rank, in rank order."""
    k.run(f"%dist pull {name}")
    return k.value(name)


@pytest.fixture(scope="module")
def ds(kernel):
    out = kernel.run("%%distributed -n 2 --backend deepspeed --timeout 120\nimport jdist")
    assert "Ready: 2 rank(s), backend deepspeed (zero 2, offload none), device(s) cpu" in out.stdout, out.stdout
    status = kernel.run("%dist status").stdout
    assert "2 CPU rank(s), backend deepspeed (zero 2, offload none), precision fp32" in status, status  # as it started
    kernel.run(SETUP)
    yield kernel
    kernel.run("%dist stop", allow_error=True)


@pytest.mark.parametrize("line,fix", [
    ("--offload all", "--offload all moves parameters to host memory, which only ZeRO-3 partitions: give --zero 3"),
    ("--precision fp16", "--backend deepspeed runs fp16 (with its loss scaling) on GPU ranks only: on CPU ranks use "
                         "--precision bf16"),
    ("--zero 4", "argument --zero: invalid choice: 4"),
])
def test_settings_deepspeed_cannot_run_are_one_line_and_keep_the_cluster(ds, line, fix):
    out = ds.run(f"%%distributed {line}\npass", allow_error=True)
    assert out.error and fix in out.shown, out.shown
    assert "Traceback" not in out.shown
    assert ds.run("%%distributed\nprint(world_size)").stdout.strip() == "2"


def test_the_ranks_import_deepspeed_without_its_autotuners_mlflow_and_mlflow_stays_importable(ds):
    # jdist.rank.backends.deepspeed.import_deepspeed: DeepSpeed's autotuner imports MLflow when it is installed
    # (2.5 s of every rank's start); a cell can still import it (no None left in sys.modules)
    ds.run("%%distributed\nimport importlib.util, sys, deepspeed.autotuning.autotuner as tuner\n"
           "state = (tuner.has_mlflow, 'mlflow' in sys.modules, importlib.util.find_spec('mlflow') is not None)")
    from importlib.util import find_spec

    assert pulled(ds, "state") == [(False, False, find_spec("mlflow") is not None)] * 2


def test_zero_options_belong_to_deepspeed():
    from jdist.options import ClusterConfig
    from jdist.plugins import option_table

    with pytest.raises(ValueError, match="--zero is an option of --backend deepspeed, not of --backend ddp"):
        option_table().check(ClusterConfig(n=2, backend="ddp", plugin={"zero": 3}))
    option_table().check(ClusterConfig(n=2, backend="deepspeed", plugin={"zero": 3, "offload": "all"}))


def test_zero_1_2_3_match_ddp_and_zero_3_partitions_parameters(ds):
    for zero in (1, 2, 3):
        out = ds.run(f"%%distributed --zero {zero}\npass")
        assert f"ZeRO-{zero} for models prepared from now on" in out.stdout, out.stdout
        ds.run(r'''%%distributed
model, opt = train(5)
stage = model.zero_optimization_stage()
diff = max_diff(full_params(model), ddp_reference(5))
first = next(model.module.parameters())
shard = (first.ds_tensor.numel(), first.ds_numel, first.numel()) if hasattr(first, "ds_tensor") else None
''')
        assert pulled(ds, "stage") == [zero, zero]
        assert max(pulled(ds, "diff")) < 1e-5, zero  # clipping off: DDP's update
        if zero == 3:  # each rank holds half of each parameter; none outside a forward
            assert pulled(ds, "shard") == [(512, 1024, 0), (512, 1024, 0)]
    comm = ds.value("[r['comm_time_s'] for r in __import__('jdist').last_run().records]")
    assert len(comm) == 10 and all(c > 0 for c in comm), comm  # DeepSpeed's collectives, timed


def test_between_micro_steps_zero_1_holds_every_gradient_and_zero_2_its_partition(ds):
    held = []
    for zero in (1, 2):
        ds.run(f"%%distributed --zero {zero}\n" + r'''
big = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))
n = sum(p.numel() for p in big.parameters())
big, bopt = jdist.prepare(big, torch.optim.AdamW(big.parameters(), lr=1e-3), grad_accum=4)
jdist.backward(big(torch.randn(4, 512)).pow(2).mean()); bopt.step()    # micro-step 1 of 4
grads = jdist.rank.sources.state_bytes(jdist.rank.session()).grads / (4 * n)
del big, bopt
''')
        held.append(pulled(ds, "grads"))
    assert held[0] == [1.0, 1.0], held
    assert held[1] == [pytest.approx(0.5, abs=0.01)] * 2, held
    ds.run("%%distributed --zero 2\njdist.prepare(make_model(), grad_accum=1)")  # grad_accum holds until changed


def test_offload_of_optimizer_and_parameters_trains_as_without(ds):
    for zero, offload in ((2, "optimizer"), (3, "all")):
        ds.run(f"%%distributed --zero {zero} --offload {offload}\npass")
        ds.run(r'''%%distributed
model, opt = train(5)
where = (str(model.zero_offload_optimizer() and model.zero_offload_optimizer().device),
         str(model.zero_offload_param() and model.zero_offload_param().device))
diff = max_diff(full_params(model), ddp_reference(5))
''')
        where, diff = pulled(ds, "where")[0], max(pulled(ds, "diff"))
        assert where[0].endswith("cpu") and (where[1].endswith("cpu") if offload == "all" else where[1] == "None"), where
        assert diff < 1e-5, (zero, offload, diff)
    ds.run("%%distributed --zero 2 --offload none\npass")


def test_bf16_is_deepspeeds_own_with_fp32_outputs(ds):
    ds.run("%%distributed --precision bf16\npass")
    try:
        ds.run(r'''%%distributed
model = make_model()
model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
losses = []
for s in range(10):                           # the same batch: the loss goes down
    loss = nn.functional.mse_loss(model(X[:8]), Y[:8])
    jdist.backward(loss); opt.step(); opt.zero_grad(); losses.append(loss.item())
out = model(X[:4])
result = dict(param=str(next(model.module.parameters()).dtype), out=str(out.dtype), learned=losses[-1] < losses[0],
              master=str(opt.optimizer.inner.single_partition_of_fp32_groups[0].dtype))
''')
        for r in pulled(ds, "result"):
            assert r == {"param": "torch.bfloat16", "out": "torch.float32", "learned": True, "master": "torch.float32"}, r
    finally:
        ds.run("%%distributed --precision fp32\npass")


def test_clip_grad_norm_sets_the_engines_clipping(ds):
    ds.run(r'''%%distributed
model = make_model()
model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=1.0))
before = full_params(model)
norms = []
for s in range(2):
    jdist.backward(nn.functional.mse_loss(model(X[:8]), Y[:8] * 100))
    norm = jdist.clip_grad_norm_(model, 0.5)
    norms.append(None if norm != norm else norm)   # nan: no norm measured yet
    opt.step(); opt.zero_grad()
    if s == 0:
        step = torch.sqrt(sum((a - b).pow(2).sum() for a, b in zip(full_params(model), before))).item()
''')
    steps, norms = pulled(ds, "step"), pulled(ds, "norms")
    assert steps[0] == pytest.approx(0.5, rel=1e-3)  # lr 1 x the clipped norm
    n0 = norms[0]
    assert n0[0] is None  # before the engine's first step no norm was measured
    assert n0[1] > 0.5 and n0[1] == pytest.approx(norms[1][1])  # the last step's, the same on every rank


def test_preparing_again_ends_the_earlier_engine_and_frees_it(ds):
    # Plain DeepSpeed: an engine whose variable is rebound stays alive (its hooks hold it), so a re-run
    # cell keeps every earlier engine's state (deepspeedai/DeepSpeed#7204, #5674, #4856)
    ds.run(r'''%%distributed
def engines():
    gc.collect()
    return sum(type(o).__name__ == "DeepSpeedEngine" for o in gc.get_objects())
jdist.prepare(make_model(), grad_accum=1)   # one engine of jdist's to start from
base = engines()
m = make_model()
plain, _, _, _ = deepspeed.initialize(model=m, optimizer=torch.optim.Adam(m.parameters()),
                                      config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}})
ref = weakref.ref(plain); del plain, m
plain_kept = ref() is not None
ref().destroy(); del ref
''')
    assert pulled(ds, "plain_kept") == [True, True]
    out = ds.run(r'''%%distributed
big = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512))
model, opt = jdist.prepare(big, torch.optim.Adam(big.parameters()))
old = weakref.ref(model)
state_first = jdist.rank.sources.state_bytes(jdist.rank.session()).total
for run in range(3):                        # the same cell, run three more times
    big = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512))
    model, opt = jdist.prepare(big, torch.optim.Adam(big.parameters()))
del big
after = dict(live=engines() - base, old_gone=old() is None,
             state=jdist.rank.sources.state_bytes(jdist.rank.session()).total, state_first=state_first)
''')
    assert "jdist: ended 1 DeepSpeed engine(s) of an earlier jdist.prepare and freed their state" in out.stdout
    for a in pulled(ds, "after"):
        assert a["live"] <= 1 and a["old_gone"], a  # the last one only (the first one's was ended too)
        assert a["state"] <= a["state_first"], a  # nothing adds up


def test_users_own_deepspeed_initialize_runs_on_jdists_group(ds):
    ds.run(r'''%%distributed
m = make_model()
engine, optim, _, _ = deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), config={
    "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
    "zero_optimization": {"stage": 2}})
own_losses = []
for s in range(5):
    i = s * 16 + rank * 8
    loss = nn.functional.mse_loss(engine(X[i:i + 8]), Y[i:i + 8])
    engine.backward(loss); engine.step()
    own_losses.append(loss.item())
diff = max_diff(full_params(engine), ddp_reference(5))
backend = deepspeed.comm.get_backend() if hasattr(deepspeed.comm, "get_backend") else dist.get_backend()
engine.destroy()
''')
    assert max(pulled(ds, "diff")) < 1e-5
    # without jdist.log: a record per engine step on each rank (tests/test_auto_metrics.py), the loss the
    # script computed, DeepSpeed's collectives timed (ddp_reference's steps, after, are one rank's only)
    run = ds.value("[(r['rank'], r['step'], r['loss'], r['comm_time_s']) for r in jdist.last_run().records]")
    for rank, losses in enumerate(pulled(ds, "own_losses")):
        mine = sorted((s, loss, comm) for r, s, loss, comm in run if r == rank)[:5]
        assert [s for s, _, _ in mine] == list(range(5)), run
        assert [loss for _, loss, _ in mine] == pytest.approx(losses, rel=1e-6)
        assert all(comm > 0 for s, _, comm in mine if s > 0), mine


def test_hf_model_built_under_zero_3_is_sharded_as_it_loads(ds):
    ds.run(r'''%%distributed --zero 3
from transformers import AutoModelForCausalLM, GPT2Config
keep = jdist.hf_deepspeed_config()              # before the model is built
lm = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
wte = lm.transformer.wte.weight
sharded = (wte.ds_tensor.numel(), wte.ds_numel)
lm, lopt = jdist.prepare(lm, torch.optim.Adam(lm.parameters(), lr=1e-3))
ids = torch.arange(16).unsqueeze(0) % 64
jdist.backward(lm(input_ids=ids, labels=ids).loss); lopt.step()
''')
    assert pulled(ds, "sharded") == [(1024, 2048), (1024, 2048)]
    ds.run("%%distributed --zero 2\ndel keep, lm, lopt")


def test_hf_trainer_with_a_deepspeed_config_trains_with_zero_on_both_ranks(ds, tmp_path):
    # CPU ranks have ACCELERATE_USE_CPU=true (so Accelerate uses them), which Accelerate alone reads as
    # "no DeepSpeed": without jdist's adjustment this Trainer would train with DDP, silently.
    ds.run(r'''%%distributed
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
class Tokens(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}
config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}
args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=4, max_steps=4, logging_steps=2,
                         learning_rate=1e-3, report_to=[], save_strategy="no", disable_tqdm=True, deepspeed=config)
torch.manual_seed(0)
lm = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32))
trainer = Trainer(model=lm, args=args, train_dataset=Tokens(), callbacks=[jdist.HFCallback()])
trainer.train()
engine = trainer.model_wrapped
wte = engine.module.transformer.wte.weight
seen = dict(world=args.world_size, engine=type(engine).__name__, stage=engine.zero_optimization_stage(),
            shard=(wte.ds_tensor.numel(), wte.ds_numel), group=engine.dp_world_size)
del trainer, engine, wte, lm
'''.replace("OUT", repr(str(tmp_path))))
    assert pulled(ds, "seen") == [dict(world=2, engine="DeepSpeedEngine", stage=3, shard=(1600, 3200), group=2)] * 2
    run = ds.value("[(r['rank'], r['step'], r.get('loss')) for r in jdist.last_run().records]")
    for rank in (0, 1):
        assert [s for r, s, loss in run if r == rank and loss is not None] == [2, 4]
    assert ds.value("jdist.last_run().summary()").count("epoch: 0.5") == 1  # 4 steps x 4 x 2 ranks of 64 samples


def test_a_failing_rank_releases_the_other_from_a_zero_3_gather(ds):
    ds.run("%%distributed --zero 3\nmodel, opt = train(1)")
    out = ds.run("%%distributed\nif rank == 1:\n    raise ValueError('bad batch')\nloss = model(X[:8]).sum()",
                 allow_error=True, timeout=150)
    tb = out.traceback
    assert out.error["ename"] == "RankError" and "1 of 2 rank(s) failed (rank 1)" in tb, tb
    assert "raise ValueError('bad batch')" in tb
    assert "rank 0: released because rank 1 failed" in tb
    assert "Not kept: DeepSpeed engine(s) model hold the old group; prepare them again" in tb
    ds.run("%%distributed\nmodel, opt = train(3)\nok = len(full_params(model))")  # a new engine on the new group
    assert pulled(ds, "ok") == [6, 6]


def test_interrupt_stops_zero_3_training_and_a_new_engine_trains(ds):
    """Rank 1 waits in a collective on DeepSpeed's own group (its clone of the world group, as ZeRO's gradient
    reduction does) when the interrupt comes: its guard breaks that group too (before, the rank waited out
    the grace and the next cell found it still busy), and DeepSpeed forms its groups again for the next engine."""
    ds.run("%%distributed --zero 3\nmodel, opt = train(1)")
    out = ds.interrupted("%%distributed\nfor s in range(10**9):\n"
                         "    jdist.backward(nn.functional.mse_loss(model(X[:8]), Y[:8])); opt.step()\n"
                         "    if s == 20:\n"
                         "        if rank == 0:\n"
                         "            time.sleep(0.5); print('training', flush=True); time.sleep(600)\n"
                         "        dist.all_reduce(torch.ones(1), group=model.data_parallel_group)",
                         "training", wait=120)
    assert out.error["ename"] == "KeyboardInterrupt", out.shown
    assert "every rank received SIGINT and stopped; variables on the ranks are kept" in out.shown, out.shown
    ds.run("%%distributed\nmodel, opt = train(3)\nok = len(full_params(model))")
    assert pulled(ds, "ok") == [6, 6]
    ds.run("%%distributed --zero 2\npass")


def test_a_targets_cell_under_zero_3_fails_at_once_naming_the_gather(ds):
    ds.run("%%distributed --zero 3\nmodel, opt = train(1)")
    out = ds.run("%%distributed --targets 0 --watchdog 3\nmodel(X[:8])", allow_error=True, timeout=150)
    ds.run("%%distributed --watchdog 30 --zero 2\npass")
    # ZeRO-3's forward first fetches the parameters it does not hold, from rank 1, which does not run the cell:
    # refused at the call (jdist.rank.collectives), before --watchdog found it as a hang
    assert out.error["ename"] == "RankError", out.shown
    assert re.search(r"dist\.(broadcast|all_gather\w*) on the default group \(ranks 0, 1\) in a cell that runs on "
                     r"rank 0 only: rank 1 does not run it", out.shown), out.shown
    assert out.elapsed < 3, out.elapsed


def test_auto_restart_recreates_the_zero_3_engine_and_restores_its_checkpoint(ds, tmp_path):
    """Last in this module: a cluster of its own, whose set-up cell builds the engine that the
    restart rebuilds (the module's other cells are not replayed)."""
    ckpt, ref = str(tmp_path / "ckpt"), str(tmp_path / "at-10.pt")
    ds.run("%%distributed -n 2 --backend deepspeed --zero 3 --timeout 60 --auto-restart --restart\n"
           + SETUP.split("\n", 1)[1] + f"CKPT, REF = {ckpt!r}, {ref!r}\n" + r'''
model = make_model()
model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
jdist.checkpoint_every(5, CKPT, keep=2, model=model, optimizer=opt)
''', timeout=240)
    out = ds.run(r'''%%distributed
for step in range(jdist.restored_step() + 1, 16):
    i = (step % 10) * 16 + rank * 8
    loss = nn.functional.mse_loss(model(X[i:i + 8]), Y[i:i + 8])
    jdist.backward(loss); opt.step(); opt.zero_grad()
    jdist.log(step=step, loss=loss)
    if step == 10:
        at_10 = full_params(model)
        if rank == 0:
            torch.save(at_10, REF)
    if step == 12 and rank == 0:
        os._exit(3)
''', allow_error=True, timeout=240)
    tb = out.traceback
    assert "rank 0 died: the process exited with code 3" in tb, out.shown
    assert "Restarted 2 rank(s)" in tb and "(step 10)" in tb, tb
    ds.run(r'''%%distributed
restored = (jdist.restored_step(), type(model).__name__, model.zero_optimization_stage(),
            max_diff(full_params(model), torch.load(REF)))
jdist.backward(nn.functional.mse_loss(model(X[:8]), Y[:8])); opt.step()   # the new engine trains
''')
    assert pulled(ds, "restored") == [(10, "DeepSpeedEngine", 3, 0.0)] * 2
