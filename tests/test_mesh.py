"""Model parallelism on one real MPI cluster of CPU ranks (gloo, 4 ranks),
nothing mocked (docs/model-parallel.md): ``--mesh`` as ``mesh`` in the cells (at start, changed live, bad
values); FSDP + TP on a 2-D ``("dp", "tp")`` mesh (the cell's own ``fully_shard`` and ``parallelize_module``)
with the communication time of each dimension, its sharding table and checkpoints (``%dist restart`` too);
real ``torch.distributed.pipelining`` schedules with their records, bubble and timeline, stage checkpoints and
the stages that wait named; a script with its own mesh against torchrun; the fault promise on meshes: after a
release the 2-D model, the mesh's groups, a ``new_group`` of the cell's and a model ``jdist.prepare``
sharded (``--backend fsdp``) work in the next cell. Unit tests of the parts: tests/test_meshspec.py, the
docstrings of jdist/rank/mesh/; the panels: tests/test_dashboard.py, tests/test_browser.py; the 3-D model on 8 ranks
(its dimensions timed, trained after a rank's failure): notebooks/14-model-parallelism.ipynb under nbval.
"""

from __future__ import annotations

import json
import os

import pytest

MODEL = """
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
from torch.distributed.fsdp import fully_shard
torch.manual_seed(0)
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)
    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
model = MLP()
parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
def train(steps):
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + mesh.get_local_rank("dp"))  # same batch within a tp group
        x = torch.randn(16, 64, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item())
    return losses
"""


@pytest.fixture(scope="module")
def meshed(kernel):
    out = kernel.run("%%distributed -n 4 --backend fsdp --timeout 60 --mesh dp=-1,tp=2\n"
                     "print(tuple(mesh.mesh.shape), mesh.mesh_dim_names)")
    assert out.error is None, out.shown
    return kernel


def test_dist_restart_restores_an_fsdp_plus_tp_model_bit_for_bit(meshed, tmp_path):
    """jdist.checkpoint_every in a set-up cell, a training cell that logs its steps, then %dist restart: new
    ranks, the set-up cells replayed (the model built again on the mesh), the newest checkpoint (DTensor
    shards) restored into the same names: every parameter's every bit, and the next step's loss, are the
    first ranks'. (First in the module: a restart replays every set-up cell so far.)"""
    ckpt = tmp_path / "auto"
    setup = meshed.run("%%distributed\n" + MODEL + f"jdist.checkpoint_every(2, {str(ckpt)!r}, model=model, optimizer=opt)\n"
                       "import hashlib\n"  # every parameter's every bit
                       "def bits(m):\n    return hashlib.sha1(b''.join(p.full_tensor().detach().numpy().tobytes() for p in "
                       "m.parameters())).hexdigest()")
    assert setup.error is None, setup.shown
    before = meshed.run("%%distributed --output all\nfor step in range(1, 5):\n    jdist.log(step=step, loss=train(1)[0])\n"
                        "print(bits(model), train(1))").stdout
    before = "\n".join(line for line in before.splitlines() if line.startswith("[rank"))  # (not the run's summary)
    out = meshed.run("%dist restart", timeout=300)
    assert "restored" in out.stdout and "step-00000004 (step 4)" in out.stdout, out.stdout + out.stderr
    after = meshed.run("%%distributed --output all\n"
                       "print(bits(model), train(1))").stdout
    after = "\n".join(line for line in after.splitlines() if line.startswith("[rank"))
    assert len(before.splitlines()) == 4 and sorted(after.splitlines()) == sorted(before.splitlines()), (before, after)


def test_mesh_is_defined_changed_live_and_refused_in_one_line(meshed):
    out = meshed.run("%%distributed --output all\nprint(mesh.get_local_rank('dp'), mesh.get_local_rank('tp'))")
    assert sorted(out.stdout.split("\n")[:-1]) == ["[rank 0] 0 0", "[rank 1] 0 1", "[rank 2] 1 0", "[rank 3] 1 1"], \
        out.stdout
    live = meshed.run("%%distributed --mesh tp=4\nprint(tuple(mesh.mesh.shape), mesh.mesh_dim_names, jdist.mesh() is mesh)")
    assert "`mesh` is now a tp=4 device mesh on every rank." in live.stdout, live.shown
    assert "(4,) ('tp',) True" in live.stdout, live.stdout
    for bad, line in [("dp=3", "--mesh dp=3 is 3 ranks, but the cluster has 4: e.g. --mesh dp=4 (or dp=-1)."),
                      ("dp=2,dp=2", "--mesh dp=2,dp=2 names dp twice: give each dimension once, e.g. --mesh dp=2,tp=2"),
                      ("dp=-1,tp=-1", "--mesh dp=-1,tp=-1: only one size may be -1 (the rest of the 4 ranks), e.g. "
                                      "--mesh dp=-1,tp=2.")]:
        out = meshed.run(f"%%distributed --mesh {bad}\npass", allow_error=True)
        assert out.error is not None and line in out.shown, (bad, out.shown)
    back = meshed.run("%%distributed --mesh dp=-1,tp=2\nprint(tuple(mesh.mesh.shape))")
    assert "(2, 2)" in back.stdout, back.shown


def test_fsdp_plus_tp_times_each_dimension_and_survives_a_release(meshed, tmp_path):
    """The 2-D model: comm_time_dp_s (FSDP's all-gathers and reduce-scatters) and comm_time_tp_s (DTensor's
    functional collectives) in every record, within comm_time_s; jdist.sharding shows each parameter's
    placements; a checkpoint restores model and optimizer bit for bit; then one rank raises while the others
    wait in an all-reduce, and the next cell trains the same model on the re-made groups."""
    out = meshed.run("%%distributed\n" + MODEL + "before = train(4)\npair = dist.new_group([0, 1])\n"
                     "small = jdist.prepare(nn.Linear(4, 1))  # FSDP on jdist's world group")
    assert out.error is None, out.shown
    records = meshed.value("[(r['rank'], r['comm_time_s'], r.get('comm_time_dp_s'), r.get('comm_time_tp_s')) "
                           "for r in jdist.last_run().records]")
    assert len(records) == 16, records
    for rank, comm, dp, tp in records[4:]:  # (the first step of each rank: its set-up)
        assert comm is None or (dp > 0 and tp > 0 and dp + tp <= comm * 1.001 + 1e-6), records
    assert meshed.value("jdist.last_run().comm_dims") == ["dp", "tp"]
    ckpt = tmp_path / "fsdp-tp"  # a folder of DTensor shards (torch.distributed.checkpoint), under --backend fsdp
    same = meshed.run(f"%%distributed --output all\njdist.save_checkpoint({str(ckpt)!r}, model=model, optimizer=opt, "
                      f"step=4)\nahead = train(2)\njdist.load_checkpoint({str(ckpt)!r}, model=model, optimizer=opt)\n"
                      "print(train(2) == ahead)")
    assert same.stdout.count("True") == 4 and (ckpt / "jdist.pt").is_file(), same.shown  # model and momentum back
    table = meshed.run("%%distributed --targets 0\nprint(jdist.sharding(model).to_json(orient='records'))").stdout
    rows = {row["parameter"]: row for row in json.loads(table.strip().split("\n")[-1].split("] ", 1)[-1])}
    assert rows["up.weight"]["global shape"] == [256, 64] and rows["up.weight"]["local shape"] == [64, 64]
    assert (rows["up.weight"]["dp"], rows["up.weight"]["tp"]) == ("Shard(0)", "Shard(0)")  # FSDP on dp, colwise
    assert (rows["down.weight"]["dp"], rows["down.weight"]["tp"]) == ("Shard(0)", "Shard(1)")  # rowwise
    assert rows["down.weight"]["local shape"] == [32, 128] and rows["total"]["bytes"] == sum(
        r["bytes"] for name, r in rows.items() if name != "total")
    failed = meshed.run("%%distributed\nif rank == 1:\n    raise ValueError('bad shard')\n"
                        "dist.all_reduce(torch.ones(1))", allow_error=True, timeout=120)
    tb = failed.traceback
    assert "ValueError: bad shard" in tb and "variables on the ranks are kept" in tb, tb
    assert "other process groups (device meshes, new_group) were made again under their names" in tb, tb
    assert "FSDP model(s) small now use the new group" in tb, tb
    after = meshed.run("%%distributed --output all\nlosses = train(2)\nprint(all(l == l for l in losses))\n"
                       "x = torch.ones(1)\nif rank < 2:\n    dist.all_reduce(x, group=pair)\n"
                       "t = torch.ones(1); dist.all_reduce(t, group=mesh.get_group('tp'))\nprint(int(x.item()), int(t.item()))\n"
                       "small(torch.ones(2, 4)).sum().backward()")
    assert after.error is None, after.shown
    lines = sorted(line.split("] ", 1)[-1] for line in after.stdout.split("\n") if line.startswith("[rank"))
    assert lines == ["1 2", "1 2", "2 2", "2 2", "True", "True", "True", "True"], after.stdout + after.stderr


PIPELINE = """
import time, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B
COST = 0.02  # seconds of each forward and each backward of a micro-batch on every stage: equal-cost stages
class Work(torch.autograd.Function):  # (sleeps: the same cost on a loaded 2-core machine)
    @staticmethod
    def forward(ctx, x):
        time.sleep(COST); return x * 1.0
    @staticmethod
    def backward(ctx, g):
        time.sleep(COST); return g
class Block(nn.Module):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(8, 8)
    def forward(self, x):
        return Work.apply(self.lin(x))
def pipeline(kind, m, steps=3):
    torch.manual_seed(0)
    per_rank = 2 if kind is ScheduleInterleaved1F1B else 1
    n = world_size * per_rank
    ids = [rank + i * world_size for i in range(per_rank)]
    stages = [PipelineStage(Block(), i, n, torch.device("cpu")) for i in ids]
    params = [p for st in stages for p in st.submod.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    loss_fn = lambda out, y: (out - y).pow(2).mean()
    schedule = kind(stages if per_rank > 1 else stages[0], n_microbatches=m, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4 * m, 8, generator=g), torch.randn(4 * m, 8, generator=g)
    means = []
    for step in range(steps):
        losses = []
        if rank == 0:
            schedule.step(x, target=y, losses=losses)
        else:
            schedule.step(target=y, losses=losses)
        opt.step(); opt.zero_grad()
        means.append(sum(l.item() for l in losses) / m if losses else None)
    return means
"""


@pytest.mark.parametrize("schedule,m", [("ScheduleGPipe", 4), ("ScheduleGPipe", 8), ("Schedule1F1B", 8),
                                        ("ScheduleInterleaved1F1B", 8)])
def test_a_pipeline_schedule_gives_each_stage_its_records_bubble_and_timeline(meshed, schedule, m):
    """A real torch.distributed.pipelining schedule on 4 ranks (gloo): each optimizer step of a stage is a
    record with pp_stage, bubble_frac and, on the last stage, the mean of the schedule's losses as loss; the
    run's timeline has m forwards and m backwards per stage per step; GPipe's measured bubble is within 0.1
    of (p - 1) / (m + p - 1); the sends and receives are comm_time_pp_s."""
    if not meshed.value("'pipeline' in dir()"):
        meshed.run("%%distributed\n" + PIPELINE)
    out = meshed.run(f"%%distributed\nmeans = pipeline({schedule}, {m})")
    assert out.error is None, out.shown
    records = meshed.value("[(r['rank'], r['step'], r.get('pp_stage'), r.get('bubble_frac'), r.get('loss'), "
                           "r.get('comm_time_pp_s')) for r in jdist.last_run().records]")
    means = meshed.run("%%distributed --targets 3\nprint(means)").stdout
    assert len(records) == 12, records
    stages = 8 if schedule == "ScheduleInterleaved1F1B" else 4
    for rank, step, stage, bubble, loss, pp in records:
        assert stage == rank and 0 <= bubble < 1 and pp > 0, records
        if rank == 3 and stages == 4:
            assert loss == pytest.approx(eval(means.split("] ", 1)[-1])[step], rel=1e-6), (records, means)
    timeline = meshed.value("jdist.last_run().pipeline.groupby(['step', 'stage', 'action']).size().to_dict()")
    assert set(timeline.values()) == {m} and len(timeline) == 3 * stages * 2, timeline
    if schedule == "ScheduleGPipe":  # the steady state: every stage's step after the first
        p = 4
        measured = [bubble for _, step, _, bubble, _, _ in records if step > 0]
        theory = (p - 1) / (m + p - 1)
        assert all(abs(b - theory) < 0.1 for b in measured), (theory, measured)


def test_a_pipeline_stage_checkpoint_keeps_every_stage(meshed, tmp_path):
    """jdist.save_checkpoint of each rank's stage module (each stage names its parameters alike): every
    stage's state under its own key; loading it back gives each rank its own stage, bit for bit."""
    if not meshed.value("'pipeline' in dir()"):
        meshed.run("%%distributed\n" + PIPELINE)
    ckpt = tmp_path / "stages"
    out = meshed.run(
        "%%distributed --output all\nimport hashlib\ntorch.manual_seed(rank)  # a different stage on each rank\n"
        "stage = PipelineStage(Block(), rank, world_size, torch.device('cpu'))\n"
        "opt = torch.optim.SGD(stage.submod.parameters(), lr=0.1, momentum=0.9)\n"
        "sched = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, y: (out - y).pow(2).mean())\n"
        "x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))\n"
        "def one():\n    sched.step(x, target=x) if rank == 0 else sched.step(target=x)\n    opt.step(); opt.zero_grad()\n"
        "def bits():\n    return hashlib.sha1(b''.join(p.detach().numpy().tobytes() for p in stage.submod.parameters()))"
        ".hexdigest()\n"
        f"one(); jdist.save_checkpoint({str(ckpt)!r}, model=stage.submod, optimizer=opt)\nsaved = bits()\n"
        f"one(); one()\njdist.load_checkpoint({str(ckpt)!r}, model=stage.submod, optimizer=opt)\n"
        "print(bits() == saved)")
    assert out.error is None and out.stdout.count("True") == 4, out.shown  # (each rank's stage differs)
    assert sorted(p.name for p in ckpt.iterdir() if p.suffix == ".distcp") == [f"__{r}_0.distcp" for r in range(4)]


def test_a_stage_that_does_not_send_is_named_by_the_stages_that_wait_for_it(meshed):
    """Rank 1 (stage 1) never runs its schedule step: the hang report says what each stage waits for
    (to send activations to stage 1, to receive them from it...); then it raises instead, and the others are released
    with the same words. The next cell trains the pipeline again."""
    if not meshed.value("'pipeline' in dir()"):
        meshed.run("%%distributed\n" + PIPELINE)
    meshed.run("%%distributed\nx = torch.randn(8, 8)\n"
               "stage = PipelineStage(Block(), rank, world_size, torch.device('cpu'))\n"
               "schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, y: (out - y).pow(2).mean())\n"
               "def run_stage():\n"
               "    if rank == 0:\n        schedule.step(x, target=x)\n    else:\n        schedule.step(target=x)\n"
               "run_stage()  # (a new stage's first step also agrees on shapes with dist.send/recv)")
    hung = meshed.run("%%distributed --watchdog 3\nif rank != 1:\n    run_stage()", allow_error=True, timeout=120)
    meshed.run("%%distributed --watchdog 30\npass")
    assert hung.error is not None and hung.error["ename"] == "HangError", hung.shown
    tb = hung.traceback
    assert "rank 2: waiting to receive activations from stage 1 (rank 1) (" in tb, tb
    assert "rank 0: waiting to send activations to stage 1 (rank 1) (" in tb, tb
    assert "rank 1: finished the cell" in tb, tb
    failed = meshed.run("%%distributed\nif rank == 1:\n    raise ValueError('stage 1 broke')\nrun_stage()",
                        allow_error=True, timeout=120)
    tb = failed.traceback
    assert "ValueError: stage 1 broke" in tb, tb
    assert "rank 2: released because rank 1 failed (it was waiting to receive activations from stage 1 (rank 1) (" \
        in tb, tb
    assert meshed.run("%%distributed\nrun_stage(); print('trained')").stdout.count("trained") == 1


SCRIPT = """import json, sys, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
from torch.distributed.fsdp import fully_shard
import jdist
dist.init_process_group("gloo")
given = jdist.mesh()  # --mesh under jdist run; None under torchrun
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(mesh.get_local_rank("dp"))
losses = []
for step in range(6):
    x = torch.randn(8, 16, generator=g)
    loss = (model(x) - x).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    losses.append(loss.item())
if dist.get_rank() in (0, 2):  # one rank of each dp group
    dims = None if given is None else list(given.mesh_dim_names)
    line = f"LOSSES {dist.get_rank()} {json.dumps(losses, separators=(',', ':'))} {json.dumps(dims)}\\n"
    sys.stdout.write(line); sys.stdout.flush()  # (one write: the ranks share the pipe)
dist.destroy_process_group()
"""


def _losses(text: str) -> dict[int, tuple[list[float], object]]:
    out = {}
    for line in text.splitlines():
        if "LOSSES " in line:
            rank, losses, dims = line.split("LOSSES ", 1)[1].split(" ", 2)  # (dims: JSON, null or a list)
            out[int(rank)] = (json.loads(losses), json.loads(dims))
    return out


def test_a_script_with_its_own_mesh_gives_torchruns_losses_under_jdist_run_and_run(meshed, tmp_path):
    """The same FSDP + TP script (its own init_process_group and init_device_mesh) under torchrun, under
    jdist run --mesh (which also gives it jdist.mesh()) and with %run in a cell: the same losses, step for step."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train2d.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "JDIST_RUN_DIR": str(tmp_path / "runs")}
    bin_dir = Path(sys.executable).parent
    plain = subprocess.run([str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node", "4", str(script)],
                           capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    run = subprocess.run([sys.executable, "-m", "jdist", "run", "-n", "4", "--no-live", "--output", "all", "--mesh",
                          "dp=2,tp=2", str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    cell = meshed.run(f"%%distributed --output all\n%run {script}")
    assert cell.error is None, cell.shown
    torchrun, jdist_run, in_cell = _losses(plain.stdout), _losses(run.stdout), _losses(cell.stdout)
    assert set(torchrun) == {0, 2} and torchrun[0][1] is None, plain.stdout
    assert jdist_run[0][1] == ["dp", "tp"], run.stdout  # jdist.mesh() is --mesh's
    for rank in (0, 2):
        assert jdist_run[rank][0] == pytest.approx(torchrun[rank][0], rel=1e-6, abs=1e-7), (rank, run.stdout)
        assert in_cell[rank][0] == pytest.approx(torchrun[rank][0], rel=1e-6, abs=1e-7), (rank, cell.stdout)
