"""Unit tests for the rank runtime's input handling (the runtime on real ranks: test_runner)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jdist import rank


def test_log_outside_a_cluster_says_where_to_call_it():
    with pytest.raises(RuntimeError, match=r"%%distributed"):
        rank.log(loss=1.0)


def test_prepare_outside_a_cluster_says_where_to_call_it():
    with pytest.raises(RuntimeError, match=r"%%distributed"):
        rank.prepare(torch.nn.Linear(2, 1))


@pytest.mark.parametrize("value,expected", [(1, 1), (2.5, 2.5), (torch.tensor(3.0), 3.0), (np.float32(0.5), 0.5)])
def test_number_accepts_scalars_and_one_element_tensors(value, expected):
    assert rank._number("loss", value) == expected


def test_number_rejects_vectors_with_the_fix():
    with pytest.raises(TypeError, match=r"loss=loss.mean\(\).item\(\)"):
        rank._number("loss", torch.ones(3))


@pytest.mark.parametrize("value", ["high", [1.0], True, None])
def test_number_rejects_non_numbers(value):
    with pytest.raises(TypeError, match="must be a number"):
        rank._number("loss", value)


def test_memory_on_cpu_reports_rss_and_peak():
    from jdist.backends import RankContext

    ctx = RankContext(0, 1, 0, 1, "h", torch.device("cpu"), "127.0.0.1", 5.0)
    mem, peak = rank._memory(ctx)
    assert 10 * 2**20 < mem <= peak
