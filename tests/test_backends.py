"""The backend interface and jdist's backends, their parts that need no other rank
(jdist.rank.backends): the comm timer, the hooks' defaults, FSDP's shard policy. On real ranks:
tests/test_training.py (every backend), tests/test_extending.py (a backend of one's own)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from jdist.rank.backends import CommTimer, TorchBackend
from jdist.rank.backends.base import Preparation, tensor_state
from jdist.rank.backends.ddp import DDPBackend
from jdist.rank.backends.fsdp import FSDPBackend, default_shard_policy


def test_comm_timer_merges_overlapping_intervals():
    t = CommTimer()
    t.record(0.0, 1.0)
    t.record(0.5, 1.5)  # overlaps the first
    t.record(3.0, 3.25)
    assert t.take() == pytest.approx(1.75)
    assert t.take() == 0.0  # reset after take


def test_comm_timer_contained_interval():
    t = CommTimer()
    t.record(0.0, 2.0)
    t.record(0.5, 1.0)
    assert t.take() == pytest.approx(2.0)


def test_the_state_a_rank_holds_counts_each_tensor_once():
    model = nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    tensors = list(tensor_state([model, model], [opt]))  # the same model twice: counted once
    assert sorted(k for k, _ in tensors) == ["grads"] * 2 + ["optimizer"] * 6 + ["params"] * 2  # 2 moments, step
    held = DDPBackend().local_state_bytes([model], [opt])
    by_kind = {k: sum(t.numel() * t.element_size() for kind, t in tensors if kind == k) for k in ("params", "grads")}
    assert (held.params, held.grads) == (by_kind["params"], by_kind["grads"]) == (40, 40)
    assert held.optimizer == 2 * 40 + 2 * 4 and held.total == 40 + 40 + 88  # two moments, a step count per tensor


def test_an_optimizer_is_matched_to_its_model_by_the_backends_parameter_identity():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    backend = DDPBackend()
    assert backend.param_ids(a) == {id(p) for p in a.parameters()}
    assert not backend.param_ids(a) & backend.param_ids(b)
    assert FSDPBackend().param_ids(a) == backend.param_ids(a)  # not sharded (yet): its own parameters


def test_the_default_prepare_prepares_each_model_then_its_optimizer():
    calls = []

    class Recording(TorchBackend):
        name = "rec"

        def prepare_model(self, model, **options):
            calls.append(("model", options))
            return nn.Sequential(model)  # a wrapper, as DDP is

        def prepare_optimizer(self, optimizer, model=None, **options):
            calls.append(("optimizer", type(model).__name__, options))
            return optimizer

    m = nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    models, opts = Recording().prepare(Preparation([m], [(opt, m)], {"bucket": 1}, {"compression": "fp16"}, 4))
    assert isinstance(models[0], nn.Sequential) and opts == [opt]
    assert calls == [("model", {"bucket": 1}), ("optimizer", "Sequential", {"grad_accum": 4, "compression": "fp16"})]


def test_what_is_said_after_a_rebuild_comes_from_the_backend():
    assert DDPBackend().describe_rebuild(["model"], []) == ("DDP model(s) model now use the new group", None)
    kept, lost = FSDPBackend().describe_rebuild([], ["big"])
    assert kept is None and lost.startswith("FSDP model(s) big hold the old group; prepare them again")


def test_fsdp_default_policy_shards_blocks_and_transformer_layers():
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False),
                          nn.ReLU(), nn.Linear(16, 2))
    picked = default_shard_policy(model)
    names = [type(m).__name__ for m in picked]
    # the Linear blocks and the TransformerEncoder (a Sequential child with parameters), then each
    # of its layers on its own; nothing inside a layer
    assert names == ["Linear", "TransformerEncoder", "TransformerEncoderLayer", "TransformerEncoderLayer", "Linear"]


def test_a_library_that_keeps_process_groups_drops_them_when_jdist_destroys_the_default_group(
        monkeypatch, tmp_path, capfd):
    """A backend spec's ``forget_groups`` runs whichever backend is on, where its library is imported (a
    one-rank gloo group in this process; the specs are made up here). DeepSpeed's on real ranks:
    tests/test_deepspeed.py, the interrupt test."""
    import torch.distributed as dist

    import jdist.plugins
    from jdist.plugins import BackendSpec
    from jdist.rank.backends.torch_group import destroy_process_group

    (tmp_path / "keeper_lib.py").write_text("dropped = []\ndef forget():\n    dropped.append(1)\n"
                                            "def broken():\n    raise RuntimeError('no such group')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import keeper_lib

    monkeypatch.setattr(jdist.plugins, "backend_specs", lambda: {
        "keeper": BackendSpec("keeper", "m:C", requires=("keeper_lib",), forget_groups="keeper_lib:forget"),
        "absent": BackendSpec("absent", "m:C", requires=("no_such_lib",), forget_groups="no_such_lib:forget"),
        "broken": BackendSpec("broken", "m:C", requires=("keeper_lib",), forget_groups="keeper_lib:broken")})
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        dist.new_group([0])  # a group the library would keep
    finally:
        destroy_process_group()
    assert not dist.is_initialized() and keeper_lib.dropped == [1]
    err = capfd.readouterr().err
    assert "jdist: broken's own process groups could not be dropped" in err and "no such group" in err, err
    assert "absent" not in err


@pytest.mark.parametrize("backend,options,fix", [
    (FSDPBackend, {"compression": "fp16"}, "FSDP reduces gradients in reduce_dtype: jdist.prepare(model, reduce_dtype="),
    (DDPBackend, {"compression": "int8"}, "--backend ddp compresses gradients with 'fp16', 'bf16' or 'powersgd'"),
    (DDPBackend, {"powersgd_rank": 2}, "PowerSGD's options; add compression='powersgd'"),
    (DDPBackend, {"compression": "powersgd", "powersgd_start_iter": 1}, "the first compressed step >= 2"),
])
def test_gradient_compression_that_a_backend_cannot_do_is_one_line_with_the_fix(backend, options, fix):
    with pytest.raises(ValueError, match="^.*$") as err:  # before the model is wrapped: no cluster needed
        backend().prepare_model(nn.Linear(2, 1), **options)
    assert fix in str(err.value) and "\n" not in str(err.value)


def test_a_powersgd_checkpoint_of_another_world_size_keeps_the_shared_state_and_says_so(capsys):
    # (the same world size, resumed to the bit: tests/test_supervisor.py; here a plain model, no process group)
    import types

    from jdist.rank.backends.ddp import compression_hook, counted, restore_powersgd

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    hook = compression_hook("powersgd", {"powersgd_start_iter": 2})
    wrapped = counted(hook, CommTimer(), list(model.parameters()))
    piece = {"error": torch.ones(128), "p": torch.ones(16), "q": torch.ones(8)}
    saved = [[{"iter": 7, "per_param": {0: piece}}]] * 2  # saved by 2 ranks
    ctx = types.SimpleNamespace(rank=0, world_size=3, device=torch.device("cpu"))
    restore_powersgd([(wrapped, hook[0])], saved, ctx, "ckpt")
    assert hook[0].iter == 7 and sorted(wrapped.pending[0]) == ["p", "q"]  # no error feedback of another world
    assert "saved by 2 ranks, this cluster has 3: PowerSGD goes on from the saved step and P/Q, its error feedback" \
        in capsys.readouterr().out
    restore_powersgd([(wrapped, hook[0])], None, ctx, "ckpt")
    assert "ckpt holds 0 PowerSGD state(s), the model has 1: PowerSGD starts over" in capsys.readouterr().out
