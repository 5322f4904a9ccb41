"""Records without ``jdist.log`` (jdist.rank.auto_metrics): unchanged training scripts, written as their
authors write them, on real 2-rank clusters: ``jdist run`` of a nanoGPT-style script, and on one notebook
kernel's cluster (``--backend horovod``, which also has a torch group; ddp without Horovod) a
pytorch/examples-style script under ``%run`` (its own DDP), an FSDP2 script, a script that logs itself,
``--auto-metrics off`` and a Horovod script. DeepSpeed's engine: tests/test_deepspeed.py's own-engine test
(its cluster is there). The unit tests at the top run in this process (torch's real hooks)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from jdist.metrics import list_runs, read_run
from jdist.plugins import backend_spec

HOROVOD = backend_spec("horovod").unavailable() is None
#: The kernel's cluster, started by the first of its tests and reused by the others (same options).
CLUSTER = f"-n 2 --backend {'horovod' if HOROVOD else 'ddp'}"

# -- the scripts, as their authors write them ------------------------------------------------------------

#: nanoGPT's train.py, cut down: module-level code, its DDP set-up and loop (GradScaler enabled on CUDA
#: only, loss / gradient_accumulation_steps, require_backward_grad_sync, clipping after unscale_).
NANOGPT = r'''
import os, time
from contextlib import nullcontext
import torch, torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group

gradient_accumulation_steps = 8
batch_size, block_size, vocab, max_iters = 4, 16, 64, 6
ddp = int(os.environ.get('RANK', -1)) != -1
cuda = torch.cuda.is_available() and os.environ.get('JDIST_TEST_GPU') == '1'
init_process_group(backend='nccl' if cuda else 'gloo')
ddp_rank, ddp_local_rank = int(os.environ['RANK']), int(os.environ['LOCAL_RANK'])
ddp_world_size = int(os.environ['WORLD_SIZE'])
device = f'cuda:{ddp_local_rank}' if cuda else 'cpu'
master_process = ddp_rank == 0
gradient_accumulation_steps //= ddp_world_size
torch.manual_seed(1337 + ddp_rank)
device_type = 'cuda' if 'cuda' in device else 'cpu'
dtype = 'float16' if device_type == 'cuda' else 'float32'
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=torch.float16)

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, 32)
        self.block = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.lm_head = nn.Linear(32, vocab)
    def forward(self, idx, targets=None):
        x = self.wte(idx)
        logits = self.lm_head(x + self.block(x))
        return logits, F.cross_entropy(logits.view(-1, vocab), targets.view(-1))

def get_batch():
    x = torch.randint(vocab, (batch_size, block_size))
    return x.to(device), torch.roll(x, -1, 1).to(device)

model = GPT().to(device)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
model = DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)
X, Y = get_batch()
iter_num = 0
while True:
    lossf = 0.0
    for micro_step in range(gradient_accumulation_steps):
        model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch()
        scaler.scale(loss).backward()
        lossf += loss.item()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"rank {ddp_rank} iter {iter_num}: loss {lossf!r}", flush=True)
    time.sleep(0.05)
    iter_num += 1
    if iter_num >= max_iters:
        break
destroy_process_group()
'''

#: pytorch/examples style: argparse, a main(), its own group, DDP and optimizer, accumulation over no_sync.
EXAMPLES = r'''
import argparse, os
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def train(args, model, optimizer, scaler, device, rank):
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        total = 0.0
        for micro in range(args.accum):
            x, y = torch.randn(8, 16, generator=g).to(device), torch.randn(8, 1, generator=g).to(device)
            with model.no_sync() if micro < args.accum - 1 else torch.enable_grad():
                loss = nn.functional.mse_loss(model(x), y) / args.accum
                (scaler.scale(loss) if scaler else loss).backward()
            total += loss.item()
        if scaler:
            scaler.step(optimizer); scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()
        print(f"rank {rank} step {step} loss {total!r}", flush=True)

def main():
    parser = argparse.ArgumentParser(description="examples-style DDP")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--accum", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() and os.environ.get("JDIST_TEST_GPU") == "1" else "gloo")
    rank = dist.get_rank()
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device))
    assert cuda or not model._comm_hooks  # CPU: timed by DDP's own reducer under jdist, no Python comm hook
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cuda") if cuda else None
    train(args, model, optimizer, scaler, device, rank)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
'''

#: FSDP2: the script shards its own model with fully_shard on a CPU mesh of its own.
FSDP2 = r'''
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        loss = model(torch.randn(8, 16, generator=g)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item()!r}", flush=True)

main()
'''

#: A script that logs itself every step: its loss is the only one.
LOGS_ITSELF = r'''
import torch, torch.nn as nn, torch.distributed as dist, jdist
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    jdist.log(step=step, loss=1000.0 + step)
'''

HOROVOD_SCRIPT = r'''
import torch, torch.nn as nn
import horovod.torch as hvd
hvd.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
g = torch.Generator().manual_seed(hvd.rank())
for step in range(4):
    loss = model(torch.randn(8, 16, generator=g)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print(f"rank {hvd.rank()} step {step} loss {loss.item()!r}", flush=True)
'''

PRINTED = re.compile(r"rank (\d) (?:step|iter) (\d+):? loss (\S+)")


def printed(text: str) -> dict[tuple[int, int], float]:
    """(rank, step) -> the loss the script printed."""
    return {(int(r), int(s)): float(v) for r, s, v in PRINTED.findall(text)}


def by_rank_step(records: list[dict]) -> dict[tuple[int, int], dict]:
    return {(r["rank"], r["step"]): r for r in records}


def assert_step_records(records: list[dict], losses: dict[tuple[int, int], float], comm: bool = True,
                        sent: int | None = None) -> None:
    """One record per optimizer step per rank, its loss the script's, with step/comm time and memory; ``sent``:
    the bytes every step's collectives carried (``comm_bytes``; 0: the same on every step and rank, not 0)."""
    assert losses, "the script printed no losses"
    got = by_rank_step(records)
    assert sorted(got) == sorted(losses) and len(records) == len(losses), (sorted(got), sorted(losses))
    for key, loss in losses.items():
        rec = got[key]
        assert rec["loss"] == pytest.approx(loss, rel=1e-6, abs=1e-9), (key, rec["loss"], loss)
        assert rec["step_time_s"] > 0 and rec["mem_bytes"] > 0 and rec["mem_peak_bytes"] > 0, rec
    if comm:
        assert all(r["comm_time_s"] > 0 for r in records if r["step"] > 0), [r["comm_time_s"] for r in records]
    if sent is not None:
        counts = {r["comm_bytes"] for r in records}
        assert counts == {sent} if sent else len(counts) == 1 and counts != {0}, counts


# -- in this process ------------------------------------------------------------------------------------

def test_the_reads_sampling_holds_through_the_steps_jitter_and_follows_a_real_change(monkeypatch):
    # DDP's reducer times every n-th iteration: each change of n shifts which ones, and the read after it finds
    # nothing. Steps alternating 1.2 and 1.5 ms (n = 8 or 6 from one interval alone) keep one n. The clock
    # stands still (a real one moved on between the test's reading and _pace's under load: 1.2 ms became 7)
    from types import SimpleNamespace

    from jdist.rank import auto_metrics
    from jdist.rank.auto_metrics import AutoSteps, _Reduced
    from jdist.rank.session import local_session

    time = SimpleNamespace(perf_counter=lambda: 1000.0, time=lambda: 1e9)
    monkeypatch.setattr(auto_metrics, "time", time)

    class Reducer:  # what _pace calls on a DistributedDataParallel
        def __init__(self) -> None:
            self.rates: list[int] = []

        def _set_ddp_runtime_logging_sample_rate(self, n: int) -> None:
            self.rates.append(n)

    ddp = Reducer()
    with local_session() as s:
        steps, r = AutoSteps(s), _Reduced(ddp)

        def reads(per_steps: list[float]) -> None:
            for per_step in per_steps:
                steps.steps += r.every
                r.read_at = time.perf_counter() - per_step * (steps.steps - r.read_step)  # (as if that long ago)
                steps._pace(r, ddp, steps.steps, now=False)

        reads([0.0012, 0.0015] * 20)
        assert ddp.rates == [8], ddp.rates
        reads([0.004] * 12)  # 4 ms steps: every 2nd (READ_EVERY_S 10 ms)
        assert ddp.rates[-1] == 2 and len(ddp.rates) <= 4, ddp.rates


def test_accumulation_is_one_step_a_scaled_loss_is_unscaled_and_an_explicit_log_wins():
    import torch

    from jdist.rank.auto_metrics import disable, enable
    from jdist.rank.session import local_session

    with local_session() as s:
        enable(s)
        w = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([w], lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        expected = []
        for step in range(3):
            total = 0.0
            for micro in range(4):
                loss = (w * (micro + 1)).sum() / 4
                scaler.scale(loss).backward()
                total += loss.item()
            scaler.step(opt); scaler.update(); opt.zero_grad()
            expected.append(total)
        records = s.end_cell()["records"]
        assert [r["step"] for r in records] == [0, 1, 2]
        assert [r["loss"] for r in records] == pytest.approx(expected)  # not x1024, not per micro-batch

        s.begin_cell()  # a cell that logs itself: its records only, none of them doubled
        for step in range(3):
            (w * 2).sum().backward(); opt.step(); opt.zero_grad()
            import jdist

            jdist.log(step=step, loss=7.0)
        assert [(r["step"], r["loss"]) for r in s.end_cell()["records"]] == [(0, 7.0), (1, 7.0), (2, 7.0)]
        disable(s)
        assert torch.autograd.backward.__module__ == "torch.autograd"


#: A DDP timed by its reducer, in a process of its own (a one-rank gloo group): each record's communication
#: intervals must lie inside its own step, through steps of one backward (read a step late), accumulation over
#: no_sync, accumulation that syncs every backward, and the cell's end. (A step of one backward right before one
#: that syncs every backward is left without: the DDP overwrote its interval before the next step could read it.)
REDUCER_STEPS = r"""
import json, socket, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from jdist.rank.auto_metrics import enable
from jdist.rank.session import local_session
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
ends, queued = [], []
with local_session() as s:
    add = s.add_entry
    s.add_entry = lambda rec, now, intervals, *rest: (queued.append((rec["step"], intervals or [])),
                                                       add(rec, now, intervals, *rest))
    enable(s)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    def loss():
        return model(torch.randn(4, 8)).pow(2).mean()
    for step, kind in enumerate(["one"] * 3 + ["no_sync", "one", "no_sync", "sync_each", "sync_each", "one"]):
        ends.append(time.perf_counter())  # the step begins
        if kind == "one":
            loss().backward()
        for micro in range(3 if kind != "one" else 0):
            if kind == "no_sync" and micro < 2:
                with model.no_sync():
                    loss().backward()
            else:
                loss().backward()
        opt.step(); opt.zero_grad()
        time.sleep(0.012)  # (longer than READ_EVERY_S: every step timed)
    ends.append(time.perf_counter())
    records = s.end_cell()["records"]
    s.begin_cell()  # short steps: timed on a sample, the others without comm time
    for step in range(100):
        loss().backward(); opt.step(); opt.zero_grad()
    short = s.end_cell()["records"]
    s.begin_cell()  # two DDPs taking turns, 30 short steps each: each one's steps are timed in its turns
    other = DDP(torch.nn.Linear(8, 1))
    opt2 = torch.optim.SGD(other.parameters(), lr=0.01)
    turn_bounds = []
    for turn in range(4):
        m, o = (model, opt) if turn % 2 == 0 else (other, opt2)
        for step in range(30):
            turn_bounds.append(time.perf_counter())
            m(torch.randn(4, 8)).pow(2).mean().backward(); o.step(); o.zero_grad()
    turn_bounds.append(time.perf_counter())
    turns = s.end_cell()["records"]
print(json.dumps({"bounds": ends, "queued": queued, "comm": [r.get("comm_time_s") for r in records],
                  "short": [(r.get("comm_time_s"), r.get("compute_time_s"), r["step_time_s"]) for r in short],
                  "turns": [r.get("comm_time_s") for r in turns], "turn_bounds": turn_bounds}))
"""


def test_a_ddp_timed_by_its_reducer_gives_each_step_its_own_communication(tmp_path):
    import json

    out = subprocess.run([sys.executable, "-c", REDUCER_STEPS], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    bounds, queued = got["bounds"], got["queued"][:9]  # (the first cell's)
    assert [step for step, _ in queued] == list(range(9))
    for step, intervals in queued:
        syncs = 3 if step in (6, 7) else 1  # accumulation that syncs every backward: DDP notes the last two
        assert 1 <= len(intervals) <= syncs, (step, intervals)
        for start, end in intervals:
            assert bounds[step] < start <= end < bounds[step + 1], (step, start, end, bounds)
    assert all(c and c > 0 for c in got["comm"]), got["comm"]
    short = got["short"]
    timed = [i for i, (comm, compute, step) in enumerate(short) if comm is not None]
    assert len(short) == 100 and all(step > 0 for _, _, step in short)
    assert all(short[i][0] > 0 and short[i][1] is not None for i in timed)  # the others have neither
    assert all(compute is None for comm, compute, _ in short if comm is None)
    assert 10 <= len(timed) < 90 and max(b - a for a, b in zip(timed, timed[1:])) <= 11, timed
    turns = got["turns"]
    assert len(turns) == 120
    for turn in range(4):  # each turn's DDP is read again from its turn's start (not only after the other's sample)
        timed = [i for i, comm in enumerate(turns[30 * turn:30 * turn + 30]) if comm is not None]
        points = [0, *timed, 29]
        assert timed and max(b - a for a, b in zip(points, points[1:])) <= 11, (turn, timed)
    bounds = got["turn_bounds"]
    for step, intervals in got["queued"][-120:]:  # each interval in its own step, the turns' first steps too
        assert all(bounds[step] < start <= end < bounds[step + 1] for start, end in intervals), (step, intervals)


def test_auto_metrics_is_honoured_by_jdist_run_and_the_notebook_and_refused_by_ray_fit():
    from jdist.cli import SCRIPT
    from jdist.kernel.raytrain import RAY
    from jdist.options import NOTEBOOK
    from jdist.plugins import option_table

    table = option_table()
    assert table.refusal(SCRIPT, "auto_metrics") is None and table.refusal(NOTEBOOK, "auto_metrics") is None
    assert "ray.train.report" in table.refusal(RAY, "auto_metrics")
    from jdist.cli import parser

    args = parser().parse_args(["run", "-n", "2", "--auto-metrics", "off", "train.py"])
    assert args.auto_metrics is False and table.requested(args)["auto_metrics"] is False


# -- jdist run --------------------------------------------------------------------------------------------

@pytest.mark.cluster
def test_an_unchanged_nanogpt_style_script_under_jdist_run_has_a_record_per_step(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(NANOGPT)
    monkeypatch.setenv("JDIST_RUN_DIR", str(tmp_path / "runs"))
    out = subprocess.run([sys.executable, "-m", "jdist", "run", "-n", "2", "--output", "all", "--every", "0.1",
                          str(tmp_path / "train.py")], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         check=False)
    assert out.returncode == 0, out.stderr
    run = read_run(list_runs(tmp_path / "runs")[0])
    assert_step_records(run.records, printed(out.stdout))
    assert len(printed(out.stdout)) == 12  # 6 optimizer steps (of 4 micro-batches) x 2 ranks
    lines = [line for line in out.stdout.splitlines() if line.startswith("[jdist] step ")]  # the plain view's rows
    assert lines and "loss " in lines[-1] and "ms/step" in lines[-1] and "comm " in lines[-1], out.stdout
    assert "step time per rank: r0 " in out.stdout and "loss: " in out.stdout  # the summary at the end
    shown = subprocess.run([sys.executable, "-m", "jdist", "show"], capture_output=True, text=True, timeout=60,
                           check=False)
    assert "step time per rank: r0 " in shown.stdout and "(comm " in shown.stdout, shown.stdout


#: The same DDP trained twice on each rank, with jdist's timing comm hook and with DDP's own all-reduce.
SAME_BITS = r'''
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from jdist.rank import auto_metrics
from jdist.rank.session import current
rank, weights = dist.get_rank(), {}
auto_metrics.disable(current())
for timed in (True, False):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    if timed:  # jdist's timing comm hook (prepared models; GPU ranks' automatic metrics); else DDP's own (C++)
        auto_metrics.time_ddp(model, current().timer, "cpu")
    assert bool(model._comm_hooks) == timed
    opt, g = torch.optim.SGD(model.parameters(), lr=0.1), torch.Generator().manual_seed(rank)
    for _ in range(5):
        loss = model(torch.randn(4, 8, generator=g)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    weights[timed] = [p.detach().clone() for p in model.parameters()]
print(f"rank {rank} same bits: {all(torch.equal(a, b) for a, b in zip(weights[True], weights[False]))}")
'''


@pytest.mark.cluster
def test_the_timing_comm_hook_gives_ddps_gradients_to_the_bit_on_3_ranks(tmp_path, monkeypatch):
    # 3 ranks: scaling by 1/3 before the sum and dividing by 3 round differently (2 ranks cannot tell)
    (tmp_path / "same.py").write_text(SAME_BITS)
    monkeypatch.setenv("JDIST_RUN_DIR", str(tmp_path / "runs"))
    out = subprocess.run([sys.executable, "-m", "jdist", "run", "-n", "3", "--output", "all", "--no-live",
                          str(tmp_path / "same.py")], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert sorted(re.findall(r"rank (\d) same bits: (\w+)", out.stdout)) == [(str(r), "True") for r in range(3)], \
        out.stdout


# -- one kernel: %run, FSDP2, a script logging itself, --auto-metrics off, Horovod, DeepSpeed ----------------------

HOOKS = ("import torch, torch.distributed as dist\n"
         "from torch.optim.optimizer import _global_optimizer_post_hooks as post\n"
         "from torch.nn.parallel import DistributedDataParallel\n"
         "from torch.amp.grad_scaler import GradScaler\n"
         "hooked = [len(post), *(f.__module__.startswith('jdist') for f in (torch.autograd.backward, "
         "dist.all_reduce, dist.all_gather_single, DistributedDataParallel.__init__, DistributedDataParallel.forward, "
         "GradScaler.step)), "
         "jdist.rank.session().auto is not None]\n")


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scripts")
    for name, text in (("examples.py", EXAMPLES), ("nanogpt.py", NANOGPT), ("fsdp2.py", FSDP2),
                       ("logs.py", LOGS_ITSELF), ("hvd.py", HOROVOD_SCRIPT)):
        (folder / name).write_text(text)
    return folder


def records_of_last_run(kernel) -> list[dict]:
    return kernel.value("[dict(r) for r in jdist.last_run().records]")


@pytest.mark.cluster
def test_run_of_examples_and_nanogpt_style_scripts_in_a_cell_shows_the_dashboard_and_fsdp2_is_timed(kernel, scripts):
    # one cluster for this file's cells: Horovod's ranks also have a torch group, for the DDP and FSDP2 scripts
    out = kernel.run(f"%%distributed {CLUSTER} --output all\n%run {scripts / 'examples.py'} --steps 5")
    assert [d for d in out.displays if "image/svg+xml" in d.get("data", {})], out.displays  # the dashboard's summary
    assert [d for d in out.displays if "application/vnd.jupyter.widget-view+json" in d.get("data", {})]
    # comm_bytes: one synced backward a step (the others under no_sync), 577 float32 gradients
    assert_step_records(records_of_last_run(kernel), printed(out.stdout), sent=577 * 4)
    out = kernel.run(f"%%distributed --output all\n%run {scripts / 'nanogpt.py'}")  # (jdist run's, above)
    assert_step_records(records_of_last_run(kernel), printed(out.stdout))
    out = kernel.run(f"%%distributed --output all\n%run {scripts / 'fsdp2.py'}")
    assert_step_records(records_of_last_run(kernel), printed(out.stdout), sent=0)  # all-gathers, reduce-scatters


@pytest.mark.cluster
def test_a_script_logging_itself_has_one_loss_series_and_auto_metrics_off_installs_nothing(kernel, scripts):
    kernel.run(f"%%distributed {CLUSTER}\n%run {scripts / 'logs.py'}")
    records = records_of_last_run(kernel)
    assert sorted((r["rank"], r["step"], r["loss"]) for r in records) == \
        [(rank, s, 1000.0 + s) for rank in (0, 1) for s in range(4)]  # the explicit ones, nothing doubled
    assert all(r["comm_time_s"] > 0 for r in records if r["step"] > 0)  # the script's DDP, timed
    kernel.run("%%distributed\n" + HOOKS)
    kernel.run("%dist pull hooked")
    assert kernel.value("hooked") == [[1, True, True, True, True, True, True, True]] * 2
    before = kernel.value("jdist.last_run().run_id")
    kernel.run(f"%%distributed --auto-metrics off\n%run {scripts / 'examples.py'} --steps 2\n" + HOOKS)
    assert kernel.value("jdist.last_run().run_id") == before  # no records: no run
    kernel.run("%dist pull hooked")
    assert kernel.value("hooked") == [[0, False, False, False, False, False, False, False]] * 2  # no hook at all
    kernel.run("%%distributed --auto-metrics on\npass")


@pytest.mark.cluster
def test_a_ddp_whose_backward_a_cell_stopped_trains_in_the_next_cell(kernel):
    # the code's own DDP, two buckets; an exception in the backward (as an interrupt landing in its Python would)
    # leaves torch's reducer waiting for the buckets it did not reduce: the next backward failed with torch's
    # internal assert (!unmarked_param_indices.empty())
    out = kernel.run(f"%%distributed {CLUSTER}\n"
                     "import torch, torch.distributed as dist\n"
                     "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                     "stopped = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)), bucket_cap_mb=0.01)\n"
                     "calls = []\n"
                     "def second_bucket_fails(state, bucket):\n"
                     "    calls.append(1)\n"
                     "    if len(calls) == 2: raise ValueError('stopped between two buckets')\n"
                     "    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])\n"
                     "stopped.register_comm_hook(None, second_bucket_fails)\n"
                     "for i in range(2):  # one bucket in the first backward; then DDP rebuilds them, two\n"
                     "    stopped(torch.randn(4, 64)).sum().backward()", allow_error=True)
    assert "stopped between two buckets" in out.error["evalue"], out.shown
    out = kernel.run("%%distributed --output all\n"
                     "opt = torch.optim.SGD(stopped.parameters(), lr=0.1)\n"
                     "for i in range(3):\n"
                     "    loss = stopped(torch.randn(4, 64)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()\n"
                     "print('trained on', dist.get_world_size())")
    assert out.error is None and out.stdout.count("trained on 2") == 2, out.shown


@pytest.mark.cluster
@pytest.mark.skipif(not HOROVOD, reason="Horovod is not installed: make horovod")
def test_a_horovod_script_has_its_steps_and_allreduce_time(kernel, scripts):
    out = kernel.run(f"%%distributed {CLUSTER} --output all\n%run {scripts / 'hvd.py'}")
    assert_step_records(records_of_last_run(kernel), printed(out.stdout))
