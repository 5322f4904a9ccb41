"""Resizing a live session (jdist.kernel.resize, jdist.rank.elastic): real ranks and process groups, the state
compared across each resize; a DistributedSampler loader's epoch going on with each sample once."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster

DDP_SETUP = """
import torch, torch.nn as nn, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
class Numbered(Dataset):
    def __len__(self): return 94
    def __getitem__(self, i): return torch.tensor([float(i)]), torch.tensor([i])
data = Numbered()
loader = jdist.prepare(DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=True, seed=3)))
torch.manual_seed(0)
model = jdist.prepare(nn.Linear(1, 1))
opt = jdist.prepare(torch.optim.SGD(model.parameters(), lr=jdist.scale_lr(0.01), momentum=0.9))
seen, steps = [], 0
"""

DDP_TRAIN = """
mine = []
for i, (x, idx) in enumerate(loader):
    loss = (model(x / 100) ** 2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    mine += idx.flatten().tolist(); steps += 1
    if i + 1 == BATCHES:
        break
everyone = [None] * world_size
dist.all_gather_object(everyone, mine)
seen = seen + sorted(i for part in everyone for i in part)
"""

STATE = """
w = [model.module.weight.item(), model.module.bias.item()]
buf = [opt.state[p]["momentum_buffer"].flatten().tolist() for p in model.parameters()]
lr = opt.param_groups[0]["lr"]
"""


def state(k):
    k.run("%%distributed\n" + STATE)
    return {name: _pull(k, name) for name in ("w", "buf", "lr", "steps", "seen")}


def _pull(k, name):
    k.run(f"%dist pull {name} --rank 0")
    return k.value(name)


def test_ddp_resized_2_3_2_keeps_parameters_optimizer_learning_rate_and_each_sample_once(kernel):
    k = kernel
    k.run("%%distributed -n 2 --backend ddp\n" + DDP_SETUP)
    k.run("%%distributed\nBATCHES = 5\n" + DDP_TRAIN)
    before = state(k)
    assert before["lr"] == pytest.approx(0.02) and before["steps"] == 5 and len(before["seen"]) == 40
    out = k.run("%dist resize -n 3 --keep-global-batch", allow_error=True)  # refused before anything stops
    assert "--keep-global-batch: 2 rank(s) x grad_accum 1 is 2 micro-batches a step, which 3 ranks cannot share " \
           "evenly; resize to a number of ranks that divides 2 (1, 2)" in out.shown, out.shown
    out = k.run("%dist resize -n 3", timeout=180)
    assert "Resized 2 -> 3 ranks in " in out.stdout and "(snapshot " in out.stdout, out.stdout
    assert "carried: model with opt (replicated on 3 ranks); learning rates x 1.5 (jdist.scale_lr, 2 -> 3 ranks); " \
           "loader: epoch 0 goes on from sample 40 of 94: the 54 left split over 3 ranks, 5 batch(es) each" \
           in out.stdout, out.stdout
    assert "variables " in out.stdout and "seen" in out.stdout and "steps" in out.stdout, out.stdout
    assert "not carried: " in out.stdout and "mine (differs per rank)" in out.stdout, out.stdout  # (each rank's)
    assert "Global batch: 1.5x (micro-batch x 1 x 3 ranks); the learning rate is scaled with it (jdist.scale_lr: " \
           "x 1.5)." in out.stdout, out.stdout
    assert "Set-up cell 2 ('w = [model.module.weight.item(), model.module.bias.item()]'...) failed in the replay " \
           "('momentum_buffer') and was skipped" in out.stdout, out.stdout  # (it reads the state: loaded after it)
    k.run("%%distributed --output all\nprint('world', world_size)")
    after = state(k)
    assert after["w"] == before["w"] and after["buf"] == before["buf"], (before, after)
    assert after["lr"] == pytest.approx(0.03) and after["steps"] == 5 and after["seen"] == before["seen"]
    k.run("%%distributed\nBATCHES = 10 ** 6\n" + DDP_TRAIN)  # the rest of the epoch on 3 ranks
    epoch = _pull(k, "seen")  # 40 samples on 2 ranks, then 54 on 3: each of the 94 once
    assert sorted(epoch) == list(range(94)), (len(epoch), sorted(set(range(94)) - set(epoch)))
    out = k.run("%dist resize -n 2", timeout=180)
    assert "Resized 3 -> 2 ranks in " in out.stdout and "epoch 0 was done: it goes on with epoch 1" in out.stdout, \
        out.stdout
    k.run("%%distributed\n" + STATE)
    assert _pull(k, "lr") == pytest.approx(0.02)
    # 2 ranks x 1 micro-batch a step, kept on 1 rank with 2; the learning rate stays (the batch did not change)
    out = k.run("%dist resize -n 1 --keep-global-batch", timeout=180)
    assert "Global batch kept: grad_accum 1 -> 2 (micro-batch x 2 x 1 ranks, as micro-batch x 1 x 2 before)." \
        in out.stdout and "learning rates x" not in out.stdout, out.stdout
    k.run("%%distributed\nfrom jdist.rank.session import session\naccum = session().train.grad_accum\n" + STATE)
    assert _pull(k, "accum") == 2 and _pull(k, "lr") == pytest.approx(0.02)
    out = k.run("%%distributed --output all\nprint('world', world_size, loader.sampler.epoch)")
    assert out.stdout.count("world 1 1") == 1, out.stdout


def test_resize_bad_input_is_one_line_each(kernel):
    k = kernel
    out = k.run("%dist resize -n 0", allow_error=True)
    assert "%dist resize -n 0: a cluster needs at least 1 rank, e.g. %dist resize -n 2." in out.shown, out.shown
    out = k.run("%dist resize", allow_error=True)
    assert "needs the new number of ranks: %dist resize -n 4" in out.shown, out.shown
    out = k.run("%dist resize --gpus 2", allow_error=True)
    assert "this cluster runs CPU ranks; resize it with -n 2" in out.shown, out.shown
    out = k.run("%dist resize -n 1", allow_error=False)
    assert "The cluster has 1 rank(s) already: nothing to resize." in out.stdout, out.stdout
    k.run("%dist stop")
    out = k.run("%dist resize -n 2", allow_error=True)
    assert "No jdist cluster is running, so there is nothing to resize" in out.shown, out.shown


FSDP_SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
X = torch.randn(64, 8); Y = X.sum(1, keepdim=True) / 3
model = jdist.prepare(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = jdist.prepare(torch.optim.AdamW(model.parameters(), lr=1e-2))
losses = []
"""

FSDP_TRAIN = """
for _ in range(STEPS):   # the full batch on every rank: the same gradient on any number of ranks
    loss = ((model(X) - Y) ** 2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
"""

FULL = """
from torch.distributed.tensor import DTensor
full = {k: (v.full_tensor() if isinstance(v, DTensor) else v).tolist() for k, v in model.state_dict().items()}
def whole(t): return (t.full_tensor() if isinstance(t, DTensor) else t).tolist()
moments = [(float(opt.state[p]["step"]), whole(opt.state[p]["exp_avg"])) for p in model.parameters()]
"""


def test_fsdp2_resized_4_2_4_then_tp_and_fsdp_plus_tp_4_2_keep_their_full_state(kernel):
    import torch

    k = kernel
    torch.manual_seed(0)  # the unresized run, in one process: the same model, data and optimizer, 9 steps
    X = torch.randn(64, 8)
    Y = X.sum(1, keepdim=True) / 3
    ref = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 1))
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    expected = []
    for _ in range(9):
        loss = ((ref(X) - Y) ** 2).mean()
        ropt.zero_grad()
        loss.backward()
        ropt.step()
        expected.append(loss.item())

    def full_state():
        k.run("%%distributed\n" + FULL)
        return _pull(k, "full"), _pull(k, "moments")

    k.run("%%distributed -n 4 --backend fsdp\n" + FSDP_SETUP)
    k.run("%%distributed\nSTEPS = 3\n" + FSDP_TRAIN)
    before = full_state()
    out = k.run("%dist resize -n 2", timeout=240)
    assert "Resized 4 -> 2 ranks in " in out.stdout and "model with opt (resharded to 2 ranks)" in out.stdout, \
        out.stdout
    middle = full_state()
    assert middle == before  # the full parameters, and AdamW's step and exp_avg of every parameter
    assert before[1][0][0] == 3.0
    k.run("%%distributed\nSTEPS = 3\n" + FSDP_TRAIN)
    out = k.run("%dist resize -n 4", timeout=240)
    assert "Resized 2 -> 4 ranks in " in out.stdout, out.stdout
    k.run("%%distributed\nSTEPS = 3\n" + FSDP_TRAIN)
    losses = _pull(k, "losses")
    assert len(losses) == 9
    assert losses == pytest.approx(expected, rel=1e-4), (losses, expected)
    tp_and_fsdp_tp(k)


TP_SETUP = """
import torch, torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
from torch.distributed.fsdp import fully_shard
torch.manual_seed(0)
X = torch.randn(32, 16); Y = X.flip(1)
def build():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    parallelize_module(m, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return m
tp = build()                       # tensor parallel on tp
tp_opt = torch.optim.AdamW(tp.parameters(), lr=1e-2)
both = build()
fully_shard(both, mesh=mesh["dp"])  # FSDP + TP: sharded on dp too
both_opt = torch.optim.AdamW(both.parameters(), lr=1e-2)
def full(m):
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).tolist() for k, v in m.state_dict().items()}
"""

TP_TRAIN = """
for _ in range(3):   # the same full batch everywhere
    for m, o in ((tp, tp_opt), (both, both_opt)):
        loss = ((m(X) - Y) ** 2).mean(); o.zero_grad(); loss.backward(); o.step()
fulls = [full(tp), full(both)]
"""


def tp_and_fsdp_tp(k):
    """Models the cell parallelized itself (not jdist.prepare'd) on --mesh dp=-1,tp=2, on the FSDP test's 4 ranks
    (dp=2) -> 2 (dp=1): DCP reshards both; a mesh that does not fit the new size is refused first, in one line."""
    k.run("%%distributed --mesh dp=2,tp=2\nprint(1)")  # (--mesh changes without a restart)
    out = k.run("%dist resize -n 2", allow_error=True)
    assert ("%dist resize -n 2: --mesh dp=2,tp=2 is 4 ranks, but the cluster has 2: e.g. --mesh dp=1,tp=2 (or "
            "dp=-1,tp=2). Give the cluster a mesh that fits first") in out.shown, out.shown
    k.run("%%distributed --mesh dp=-1,tp=2\n" + TP_SETUP)
    k.run("%%distributed\n" + TP_TRAIN)
    before = _pull(k, "fulls")
    out = k.run("%dist resize -n 2", timeout=240)
    assert "tp with tp_opt (resharded to 2 ranks); both with both_opt (resharded to 2 ranks)" in out.stdout, \
        out.stdout
    k.run("%%distributed\nfulls = [full(tp), full(both)]\nshape = tuple(mesh.mesh.shape)")
    assert _pull(k, "fulls") == before and _pull(k, "shape") == (1, 2)
    k.run("%%distributed\n" + TP_TRAIN)  # and they train on the new mesh
    assert _pull(k, "fulls") != before
    k.run("%dist stop")


def test_elastic_bad_input_is_one_line_before_anything_starts(kernel):
    """(What --elastic does after a loss is notebooks/15-elastic.ipynb's, under nbval, and the two-node bed's.)"""
    from types import SimpleNamespace

    from jdist.kernel.resize import after_loss, check
    from jdist.options import ClusterConfig

    out = kernel.run("%%distributed -n 3 --elastic 3:2\npass", allow_error=True)
    assert "--elastic 3:2: MIN must not be more than MAX, e.g. --elastic 2:3." in out.shown, out.shown
    out = kernel.run("%%distributed -n 5 --elastic 2:4\npass", allow_error=True)
    assert "--elastic 2:4 with -n 5: the ranks to start must be within MIN:MAX, e.g. --elastic 2:5." in out.shown
    cluster = SimpleNamespace(config=ClusterConfig(n=3, elastic="2:3"))  # (check() reads the configuration only)
    with pytest.raises(ValueError, match="this cluster runs with --elastic 2:3; resize within it"):
        check(cluster, 4)
    with pytest.raises(ValueError, match="--backend deepspeed is not resized: DeepSpeed's checkpoints load only on "
                                         "the world size that saved them"):
        check(SimpleNamespace(config=ClusterConfig(n=2, backend="deepspeed")), 4)
    # after a loss (after_loss reads the configuration and the ranks' hosts): fewer than MIN left starts nothing;
    # on --hosts, the host that lost a rank goes with all its ranks
    ranks = [{"rank": r, "host": h} for r, h in enumerate(("a", "a", "b", "b"))]
    cluster = SimpleNamespace(config=ClusterConfig(n=3, elastic="3:3"), ranks=ranks[:3])
    assert after_loss(cluster, SimpleNamespace(rank=2)) == (None, "rank 2 is lost",
                                                           "2 rank(s) left, fewer than --elastic 3:3 allows")
    cluster = SimpleNamespace(config=ClusterConfig(n=4, elastic="2:4", launcher="ssh", plugin={"hosts": "a:2,b:2"}),
                              ranks=ranks)
    config, what, _ = after_loss(cluster, SimpleNamespace(rank=3))
    assert (config.n, config.get("hosts"), what) == (2, "a:2", "b went away (rank(s) 2, 3 with it)")
