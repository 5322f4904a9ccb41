"""The rank runtime without a cluster: one process's session (jdist.rank.session.local_session),
its record stream, metric sources and input checks. The runtime on real ranks: test_runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import jdist
from jdist.metrics import AUTO_METRICS, RECORD_KEYS
from jdist.rank import api
from jdist.rank.channel import ListChannel
from jdist.rank.session import local_session
from jdist.rank.sources import Memory, default_sources


def test_log_outside_a_cluster_says_where_to_call_it():
    with pytest.raises(RuntimeError, match=r"%%distributed"):
        jdist.log(loss=1.0)


def test_prepare_outside_a_cluster_says_where_to_call_it():
    with pytest.raises(RuntimeError, match=r"%%distributed"):
        jdist.prepare(torch.nn.Linear(2, 1))


@pytest.mark.parametrize("value,expected", [(1, 1), (2.5, 2.5), (torch.tensor(3.0), 3.0), (np.float32(0.5), 0.5)])
def test_number_accepts_scalars_and_one_element_tensors(value, expected):
    assert api._number("loss", value) == expected


def test_number_rejects_vectors_with_the_fix():
    with pytest.raises(TypeError, match=r"loss=loss.mean\(\).item\(\)"):
        api._number("loss", torch.ones(3))


@pytest.mark.parametrize("value", ["high", [1.0], True, None])
def test_number_rejects_non_numbers(value):
    with pytest.raises(TypeError, match="must be a number"):
        api._number("loss", value)


def test_memory_on_cpu_reports_rss_and_peak():
    with local_session() as s:
        mem, peak = Memory().read(s)
    assert 10 * 2**20 < mem <= peak


def test_sources_produce_exactly_the_automatic_metrics():
    names = [n for source in default_sources() for n in source.names]
    assert names == list(AUTO_METRICS)  # one source per metric, in the documented order
    ch = ListChannel()
    with local_session(ch) as s:
        jdist.log(step=3, loss=0.5)
        s.end_cell()
    (rec,) = ch.messages[-1]["records"]
    assert set(rec) == set(RECORD_KEYS) | set(AUTO_METRICS) | {"loss"}
    assert rec["step"] == 3 and rec["compute_time_s"] == pytest.approx(rec["step_time_s"] - rec["comm_time_s"])
    assert rec["samples_per_s"] is None and rec["state_bytes"] is None  # no batch size, nothing prepared


def test_records_are_numbered_batched_and_counted_at_the_cell_end():
    ch = ListChannel()
    with local_session(ch) as s:
        s.stream.flush_interval = 3600  # nothing is published before the cell ends
        for step in range(5):
            jdist.log(step=step, x=float(step))
        assert ch.messages == []
        end = s.end_cell()
        assert [r["seq"] for r in end["records"]] == list(range(5)) and end["count"] == 5
        assert [r["seq"] for r in s.stream.records(s.stream.cell, [1, 3])] == [1, 3]  # what repair fetches
        assert s.stream.records(s.stream.cell - 1, [1]) == []  # an earlier cell's are gone


def test_reserved_names_and_batch_size_give_samples_per_s():
    with local_session() as s:
        with pytest.raises(ValueError, match="reserved metric name"):
            jdist.log(step_time_s=1.0)
        jdist.progress(total_steps=10, batch_size=32)
        jdist.log(loss=1.0)
        rec = s.stream.pending[-1]
        assert rec["samples_per_s"] == pytest.approx(32 / rec["step_time_s"])
        assert s.stream.total_steps == 10


def test_log_hooks_see_every_record():
    seen = []
    with local_session() as s:
        s.log_hooks["test"] = lambda rec: seen.append(rec["step"])
        for step in (5, 6):
            jdist.log(step=step)
    assert seen == [5, 6]
