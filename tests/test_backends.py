"""Unit tests for the backend interface and registry (the backends themselves run on real
clusters in test_training, test_runner and test_magics)."""

from __future__ import annotations

import pytest

from jdist.backends import CommTimer, available_backends, get_backend
from jdist.backends import horovod as horovod_backend
from jdist.backends.fsdp import default_shard_policy
from jdist.cluster import ClusterConfig


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


def test_registry_has_all_backends_and_names_choices_on_error():
    assert available_backends() == ["ddp", "fsdp", "horovod"]
    for name in available_backends():
        assert get_backend(name)().name == name
    with pytest.raises(ValueError, match=r"Unknown backend 'nope'.*--backend.*ddp, fsdp, horovod"):
        get_backend("nope")


def test_missing_horovod_is_reported_before_any_rank_starts_with_the_install_command(monkeypatch):
    # Horovod is installed here (make test builds it); its absence is simulated.
    monkeypatch.setattr(horovod_backend, "available", lambda: False)
    with pytest.raises(ValueError, match=r"Horovod is not installed.*make horovod.*tools/build_horovod.sh"):
        ClusterConfig(n=2, backend="horovod").validate()
    ClusterConfig(n=2, backend="ddp").validate()  # other backends unaffected


def test_fsdp_default_policy_shards_blocks_and_transformer_layers():
    import torch.nn as nn

    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False),
                          nn.ReLU(), nn.Linear(16, 2))
    picked = default_shard_policy(model)
    names = [type(m).__name__ for m in picked]
    # the Linear blocks and the TransformerEncoder (a Sequential child with parameters), then each
    # of its layers on its own; nothing inside a layer
    assert names == ["Linear", "TransformerEncoder", "TransformerEncoderLayer", "TransformerEncoderLayer", "Linear"]


def test_precision_is_validated():
    with pytest.raises(ValueError, match="--precision 'fp8': use one of fp32, bf16, fp16"):
        ClusterConfig(n=2, precision="fp8").validate()
