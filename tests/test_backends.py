"""Unit tests for the backend interface (the DDP backend itself runs in test_runner/test_magics)."""

from __future__ import annotations

import pytest

from jdist.backends import CommTimer, available_backends, get_backend


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


def test_registry_has_ddp_and_names_choices_on_error():
    assert "ddp" in available_backends()
    assert get_backend("ddp")().name == "ddp"
    with pytest.raises(ValueError, match=r"Unknown backend 'nope'.*--backend.*ddp"):
        get_backend("nope")
