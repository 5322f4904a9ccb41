"""The hang watchdog's decisions (jdist.kernel.supervise.detectors.HangWatchdog) on synthetic
samples and a synthetic clock: pure unit tests. The same detector on real clusters: test_faults
(a real hang is reported) and test_training (healthy training under every backend is not)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from jdist.common.stacks import Progress, Sample
from jdist.kernel.supervise.detectors import HangWatchdog, Release

CELL = ("/tmp/ipykernel_7/1.py", 3, "<module>")
IN_ALL_REDUCE = [("/x/torch/distributed/distributed_c10d.py", 2800, "all_reduce"), CELL]
IN_BACKWARD = [("/x/torch/autograd/graph.py", 8, "_engine_run_backward"), CELL]
IN_SYNCHRONIZE = [("/x/horovod/torch/mpi_ops.py", 1285, "synchronize"), CELL]


@dataclass
class FakeCluster:
    """Answers ``samples`` from ``rank -> f(t)``; ``t`` is set by the test before each poll."""

    backend: str
    behaviour: dict[int, object]
    t: float = 0.0
    asked: list[float] = field(default_factory=list)

    @property
    def config(self) -> SimpleNamespace:
        return SimpleNamespace(backend=self.backend)

    def samples(self, ranks, timeout=1.0):
        self.asked.append(self.t)
        return {r: self.behaviour[r](self.t) for r in ranks}


def blocked_in(frames, seq="t5"):
    return lambda t: Sample(frames, Progress(t=t, cpu=3.0 + 0.005 * t, main=1.0, seq=seq))


def training(frames, busy_main=True):
    """Healthy training: collectives start all the time and the CPU is busy."""
    return lambda t: Sample(frames, Progress(t=t, cpu=1.5 * t, main=(0.9 * t if busy_main else 1.0), seq=f"t{int(t * 40)}"))


def long_transfer(frames):
    """One long collective moving data: no new collective, main thread idle, the process busy."""
    return lambda t: Sample(frames, Progress(t=t, cpu=0.5 * t, main=1.0, seq="t5"))


def run(watchdog: HangWatchdog, cluster: FakeCluster, until: float, running=(0, 1), progress_at=()):
    """Poll every 50 ms from t=0 (the last progress) to ``until``; the first action and its time."""
    sup = SimpleNamespace(releasing=False, last_progress=0.0, cluster=cluster,
                          view=SimpleNamespace(running=lambda: list(running)))
    steps = int(round(until / 0.05))
    for i in range(1, steps + 1):
        t = i * 0.05
        if any(abs(t - p) < 1e-9 for p in progress_at):
            sup.last_progress = t
        cluster.t = t
        action = watchdog.poll(t, sup)
        if action is not None:
            return action, t
    return None, until


@pytest.mark.parametrize("backend,frames", [("ddp", IN_BACKWARD), ("ddp", IN_ALL_REDUCE), ("fsdp", IN_ALL_REDUCE),
                                            ("horovod", IN_SYNCHRONIZE)])
def test_healthy_training_inside_collectives_is_never_a_hang(backend, frames):
    # every sample lies inside a collective (the old watchdog's false hang), for 20 periods
    cluster = FakeCluster(backend, {0: training(frames), 1: training(frames, busy_main=False)})
    wd = HangWatchdog(1.0)
    action, _ = run(wd, cluster, until=20.0)
    assert action is None and wd.samples_taken >= 70  # it looked, every spacing, all along


def test_a_long_collective_that_moves_data_is_not_a_hang():
    cluster = FakeCluster("ddp", {0: long_transfer(IN_ALL_REDUCE), 1: long_transfer(IN_ALL_REDUCE)})
    assert run(HangWatchdog(2.0), cluster, until=20.0)[0] is None


@pytest.mark.parametrize("backend,frames", [("ddp", IN_ALL_REDUCE), ("ddp", IN_BACKWARD), ("horovod", IN_SYNCHRONIZE)])
def test_blocked_ranks_are_a_hang_after_the_period(backend, frames):
    cluster = FakeCluster(backend, {0: blocked_in(frames), 1: blocked_in(IN_ALL_REDUCE, seq="t4")})
    action, at = run(HangWatchdog(2.0), cluster, until=10.0)
    assert isinstance(action, Release) and action.reason == "hang"
    assert set(action.hang) == {0, 1} and action.hang[1] == "all_reduce (cell line 3)"
    assert 2.0 <= at <= 2.1  # the first poll once the cell has been quiet for the period
    assert cluster.asked[0] == pytest.approx(1.0)  # sampling began at half the period


def test_horovod_ranks_spinning_while_blocked_are_a_hang_but_not_on_ddp():
    spinning = lambda t: Sample(IN_SYNCHRONIZE, Progress(t=t, cpu=1.0 * t, main=1.0 * t, seq="t0,h1"))  # noqa: E731
    action, _ = run(HangWatchdog(2.0), FakeCluster("horovod", {0: spinning, 1: spinning}), until=5.0)
    assert isinstance(action, Release)
    assert run(HangWatchdog(2.0), FakeCluster("ddp", {0: spinning, 1: spinning}), until=5.0)[0] is None


def test_a_hang_late_in_a_quiet_stretch_is_reported_within_the_period():
    # healthy and quiet for 30 s, then blocked from t=30: reported by t=30 + period
    def then_blocked(t):
        return training(IN_BACKWARD)(t) if t < 30 else blocked_in(IN_ALL_REDUCE, seq="t9999")(t)

    cluster = FakeCluster("ddp", {0: then_blocked, 1: then_blocked})
    action, at = run(HangWatchdog(2.0), cluster, until=40.0)
    assert isinstance(action, Release) and 30.0 < at <= 32.0


def test_one_rank_still_working_is_not_a_hang():
    cluster = FakeCluster("ddp", {0: blocked_in(IN_ALL_REDUCE), 1: training([CELL])})
    assert run(HangWatchdog(1.0), cluster, until=10.0)[0] is None


def test_progress_starts_the_evidence_over():
    # blocked samples, but output arrives every 1.5 s: never quiet for the 2 s period
    cluster = FakeCluster("ddp", {0: blocked_in(IN_ALL_REDUCE), 1: blocked_in(IN_ALL_REDUCE)})
    action, _ = run(HangWatchdog(2.0), cluster, until=9.0, progress_at=[1.5 * k for k in range(1, 7)])
    assert action is None


def test_ranks_that_do_not_answer_are_no_evidence():
    cluster = FakeCluster("ddp", {0: lambda t: Sample(), 1: blocked_in(IN_ALL_REDUCE)})
    assert run(HangWatchdog(1.0), cluster, until=10.0)[0] is None


def test_off_at_zero():
    cluster = FakeCluster("ddp", {0: blocked_in(IN_ALL_REDUCE), 1: blocked_in(IN_ALL_REDUCE)})
    assert run(HangWatchdog(0), cluster, until=10.0)[0] is None and cluster.asked == []


@pytest.mark.parametrize("names, after", [(["ValueError"], 0.25), (["EngineError"], 10.0)])
def test_a_failure_releases_the_others_at_once_but_a_dead_engine_waits_for_the_launchers_death_report(names, after):
    # ipyparallel's EngineError: the rank's nanny told the controller that its engine died; the launcher's report
    # of the death (with its cause) is on its way, and the DeathDetector then stops the cell: no release before it
    from jdist.kernel.supervise.detectors import PartialFailureDetector

    view = SimpleNamespace(failed_while_others_run=lambda: True, early_failures=lambda: list(names))
    sup = SimpleNamespace(releasing=False, view=view)
    detector = PartialFailureDetector()
    assert detector.poll(100.0, sup) is None
    assert detector.poll(100.0 + after - 0.01, sup) is None
    assert detector.poll(100.0 + after, sup) == Release("failure")


def test_ranks_left_in_a_collective_after_others_stopped_are_released_again_every_two_seconds():
    from jdist.kernel.supervise.detectors import LeftInCollective, ReleaseAgain

    running = [0, 1]
    cluster = FakeCluster("ddp", {0: blocked_in(IN_ALL_REDUCE), 1: training([CELL])})
    sup = SimpleNamespace(releasing=False, ranks=[0, 1], cluster=cluster, view=SimpleNamespace(running=lambda: running))
    left = LeftInCollective()
    assert left.poll(10.0, sup) is None  # no grace: nothing to look at
    sup.releasing = True
    assert left.poll(10.0, sup) is None and left.poll(11.9, sup) is None and cluster.asked == []
    assert left.poll(12.0, sup) is None and cluster.asked == []  # every rank still running: none stopped yet
    running.remove(1)  # rank 1 stopped; rank 0 waits for it in all_reduce
    assert left.poll(13.0, sup) is None  # the next look is 2 s after the last
    assert left.poll(14.0, sup) == ReleaseAgain([0])
    assert left.poll(15.0, sup) is None and left.poll(16.0, sup) == ReleaseAgain([0])  # and again, while it waits
    cluster.behaviour[0] = training([CELL])  # released: back in the cell's own code, stopping
    assert left.poll(18.0, sup) is None
    tf = FakeCluster("tf", {0: blocked_in(IN_ALL_REDUCE)})  # TF's collectives cannot be released: no look
    sup.cluster, left = tf, LeftInCollective()
    assert left.poll(20.0, sup) is None and left.poll(22.0, sup) is None and tf.asked == []
