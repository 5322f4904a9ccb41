"""The live dashboard's incremental data (jdist.metrics.live): what the browser receives adds up
to the full panels, each update costs the new records only, and changes of metric restart a line."""

from __future__ import annotations

import math
import random

import pytest

import jdist.metrics.live as live_mod
from jdist.metrics import Run
from jdist.metrics.live import LinePoints, LivePanels
from jdist.metrics.panels import panels


class Browser:
    """What the front-end does with the updates (labextension/src/notebook.ts: applyPoints)."""

    def __init__(self) -> None:
        self.lines: dict[str, dict[str, list[float]]] = {}
        self.layout: list = []
        self.whole: list = []
        self.appended = self.replaced = 0

    def apply(self, update) -> None:
        if update.layout is not None:
            self.layout = update.layout
        if update.whole is not None:
            self.whole = update.whole
        for p in update.lines:
            self.apply_points(p)

    def first_series(self, panel: str) -> str | None:
        return next((q["series"][0]["name"] for q in self.layout if q["key"] == panel), None)

    def apply_points(self, p: LinePoints) -> None:
        cols = self.lines.setdefault(p.panel if p.series == self.first_series(p.panel) else f"{p.panel}/{p.series}",
                                     {"x": [], "y": [], "low": [], "high": []})
        if p.reset:
            for c in cols.values():
                c.clear()
        elif p.replace_from is not None:
            keep = sum(1 for x in cols["x"] if x < p.replace_from)
            for c in cols.values():
                del c[keep:]
            self.replaced += 1
        self.appended += len(p.x)
        cols["x"] += p.x
        cols["y"] += p.y
        cols["low"] += p.low or [math.nan] * len(p.x)
        cols["high"] += p.high or [math.nan] * len(p.x)


def none(values):
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values]


def assert_same_as_full(run: Run, browser: Browser) -> None:
    for panel in panels(run):
        if panel["kind"] != "line":
            assert panel in browser.whole
            continue
        s = panel["series"][0]
        got = browser.lines.get(panel["key"], {"x": [], "y": [], "low": [], "high": []})
        assert got["x"] == s["x"], panel["key"]
        assert none(got["y"]) == pytest.approx(s["y"]), panel["key"]
        if s["low"] is not None:
            assert none(got["low"]) == pytest.approx(s["low"]) and none(got["high"]) == pytest.approx(s["high"])
    assert [p["title"] for p in browser.layout] == [p["title"] for p in panels(run)]


def record(rank: int, seq: int, step: int, rng: random.Random, **extra) -> dict:
    return {"rank": rank, "seq": seq, "step": step, "time": 1000.0 + step, "loss": rng.random(),
            "step_time_s": 0.01 + rng.random() / 100, "comm_time_s": 0.001, "mem_bytes": 1e6 * (rank + 1), **extra}


@pytest.mark.parametrize("ranks,every,batch", [(2, 1, 7), (4, 3, 5), (3, 1, 1), (20, 1, 9)])
def test_updates_add_up_to_the_full_panels_and_send_each_point_once(ranks, every, batch):
    """Each rank's first batch, then batches in random order (ranks at their own pace); an update after each.
    (A rank whose first records come after others' later steps makes a resend: the next test.)"""
    rng = random.Random(ranks * 100 + every)
    run, browser = Run("r", ranks), Browser()
    live = LivePanels(run)
    steps = list(range(0, 300, every))
    queues = {r: [record(r, i, s, rng) for i, s in enumerate(steps)] for r in range(ranks)}
    order = list(range(ranks))
    while any(queues.values()):
        r = order.pop(0) if order else rng.choice([r for r in queues if queues[r]])
        chunk, queues[r] = queues[r][:batch], queues[r][batch:]
        live.feed(run.add(chunk), now=0.0)
        browser.apply(live.update(now=0.1))  # the ranks' first batches come within the hold
    assert_same_as_full(run, browser)
    assert browser.replaced == 0
    # every loss point and every throughput point (all but the first step) was sent exactly once
    # every point of the loss and throughput lines (all but the first step), beyond 16 ranks of the
    # time panel's step time and communication lines too, was sent exactly once
    assert browser.appended == len(steps) + len(steps) - 1 + (0 if ranks <= 16 else 2 * len(steps))


def test_a_rank_that_starts_late_makes_the_series_resend_from_its_first_step():
    rng = random.Random(1)
    run, browser = Run("r", 2), Browser()
    live = LivePanels(run)
    live.feed(run.add([record(0, s, s, rng) for s in range(10)]), now=0.0)
    held = live.update(now=0.5)
    assert not held.lines  # held back: rank 1 may come
    browser.apply(held)
    browser.apply(live.update(now=1.5))
    assert browser.lines["loss"]["x"] == list(range(10))  # rank 1 not heard of after the hold: rank 0 alone
    live.feed(run.add([record(1, s, s, rng) for s in range(12)]))
    browser.apply(live.update())
    assert browser.replaced >= 1
    live.feed(run.add([record(0, s, s, rng) for s in range(10, 12)]))
    browser.apply(live.update())
    assert_same_as_full(run, browser)


def test_only_rank_zero_logging_the_loss_is_not_held_back_by_the_others():
    rng = random.Random(2)
    run, browser = Run("r", 2), Browser()
    live = LivePanels(run)
    live.feed(run.add([record(0, s, s, rng) for s in range(5)]), now=0.0)
    browser.apply(live.update(now=0.1))
    assert not browser.lines.get("loss")  # held back until rank 1's first records or 1 s
    live.feed(run.add([{"rank": 1, "seq": s, "step": s, "step_time_s": 0.02} for s in range(5)]), now=0.2)
    browser.apply(live.update(now=0.2))
    assert browser.lines["loss"]["x"] == list(range(5))
    assert_same_as_full(run, browser)


def test_a_change_of_metric_restarts_the_line_and_the_layout():
    run, browser = Run("r", 1), Browser()
    live = LivePanels(run)
    live.feed(run.add([{"rank": 0, "seq": s, "step": s, "acc": 0.5, "step_time_s": 0.1} for s in range(3)]))
    browser.apply(live.update())
    assert browser.layout[0]["title"] == "acc" and browser.lines["loss"]["y"] == [0.5] * 3
    assert browser.layout[3]["title"] == "throughput, steps/s"
    live.feed(run.add([{"rank": 0, "seq": s, "step": s, "loss": 2.0, "step_time_s": 0.1, "samples_per_s": 64.0}
                       for s in range(3, 6)]))
    update = live.update()
    assert update.layout is not None and [p.reset for p in update.lines] == [True, True]
    browser.apply(update)
    assert browser.layout[0]["title"] == "loss" and browser.lines["loss"]["x"] == [3, 4, 5]
    assert browser.layout[3]["title"] == "throughput, samples/s (all ranks)"
    assert_same_as_full(run, browser)


def test_nothing_new_is_an_empty_update():
    rng = random.Random(3)
    run = Run("r", 1)
    live = LivePanels(run)
    live.feed(run.add([record(0, s, s, rng) for s in range(3)]))
    assert live.update()
    assert not live.update()


def test_each_update_computes_the_new_steps_only(monkeypatch):
    """The cost of an update does not grow with the run: line points are computed for new steps only."""
    rng = random.Random(4)
    computed: list[int] = []
    real = live_mod.line_points

    def spy(run, line, steps, prev=None):
        computed.append(len(steps))
        return real(run, line, steps, prev)

    monkeypatch.setattr(live_mod, "line_points", spy)
    run = Run("r", 2)
    live = LivePanels(run)
    for start in range(0, 5000, 10):
        live.feed(run.add([record(r, s, s, rng) for s in range(start, start + 10) for r in (0, 1)]))
        computed.clear()
        live.update()
        assert sum(computed) <= 2 * 10, computed  # two line panels, 10 new steps each
