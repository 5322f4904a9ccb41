"""What a cell's outcome is, from what the supervisor observed (jdist.kernel.supervise.outcome):
pure unit tests with synthetic observations. The same rules on real clusters: test_faults, test_runner."""

from __future__ import annotations

import pytest

from jdist.errors import RankFailure
from jdist.kernel.launch import RankDeath
from jdist.kernel.supervise.outcome import CellStatus, Observations, classify


def fail(rank: int, ename: str = "ValueError", evalue: str = "bad shard", at: float | None = None) -> RankFailure:
    return RankFailure(rank, ename, evalue, completed=at)


def interrupted(rank: int) -> RankFailure:
    return fail(rank, "KeyboardInterrupt", "")


def test_a_cell_that_ran_everywhere_finished():
    out = classify(Observations(ranks=[0, 1]))
    assert (out.status, out.failed, out.first_failed, out.error) == (CellStatus.FINISHED, {}, None, None)
    assert out.status.run_status == "finished"


def test_a_failure_is_reported_with_its_rank():
    out = classify(Observations(ranks=[0, 1], failures={1: fail(1)}))
    assert out.status is CellStatus.FAILED and list(out.failed) == [1] and out.first_failed == 1
    assert out.error == "rank 1: ValueError: bad shard"


def test_ranks_released_because_of_a_failure_are_not_failures_themselves():
    obs = Observations(ranks=[0, 1, 2], failures={2: fail(2), 0: interrupted(0), 1: fail(1, "RuntimeError", "peer")},
                       released=[0, 1])
    out = classify(obs)
    assert out.status is CellStatus.FAILED and list(out.failed) == [2] and out.first_failed == 2


def test_the_first_failure_by_completion_time_is_the_origin():
    obs = Observations(ranks=[0, 1], failures={0: fail(0, at=20.0), 1: fail(1, "RuntimeError", "connection closed", at=10.0)})
    assert classify(obs).first_failed == 1
    no_times = Observations(ranks=[0, 1], failures={1: fail(1), 0: fail(0)})
    assert classify(no_times).first_failed == 0  # then by rank


def test_the_users_interrupt_is_an_interrupt_not_a_failure():
    obs = Observations(ranks=[0, 1], failures={0: interrupted(0), 1: interrupted(1)}, interrupted=True)
    out = classify(obs)
    assert out.status is CellStatus.INTERRUPTED and out.interrupted and out.failed == {}
    assert out.status.run_status == "interrupted"


def test_every_rank_interrupted_on_its_own_is_an_interrupt():
    """SIGINT sent to the ranks from the sidebar while the kernel waits: every rank raised
    KeyboardInterrupt, jdist released none."""
    out = classify(Observations(ranks=[0, 1], failures={0: interrupted(0), 1: interrupted(1)}))
    assert out.status is CellStatus.INTERRUPTED


def test_one_rank_interrupted_by_its_own_code_is_a_failure():
    out = classify(Observations(ranks=[0, 1], failures={0: interrupted(0), 1: fail(1)}))
    assert out.status is CellStatus.FAILED and set(out.failed) == {0, 1}


def test_a_hang_with_released_ranks_is_a_hang():
    obs = Observations(ranks=[0, 1], failures={0: fail(0, "RuntimeError", "connection closed by peer")}, released=[0],
                       hang={0: "all_reduce (cell line 3)"})
    out = classify(obs)
    assert out.status is CellStatus.HUNG and out.failed == {} and out.first_failed is None
    assert out.error == "hang: rank 0: all_reduce (cell line 3)" and out.status.run_status == "failed"


def test_a_real_failure_during_a_hang_is_reported_as_the_failure():
    obs = Observations(ranks=[0, 1], failures={0: interrupted(0), 1: fail(1)}, released=[0], hang={0: "barrier (x)"})
    out = classify(obs)
    assert out.status is CellStatus.FAILED and list(out.failed) == [1]


def test_a_death_outranks_the_failures_it_causes():
    death = RankDeath(1, "killed by SIGKILL (kill -9, or the out-of-memory killer)")
    failures = {r: fail(r, "RankDied", "ended") for r in (0, 1)}
    out = classify(Observations(ranks=[0, 1], failures=failures, death=death))
    assert out.status is CellStatus.DIED and set(out.failed) == {0, 1}
    assert out.error == "rank 1 died: killed by SIGKILL (kill -9, or the out-of-memory killer)"
    assert out.status.run_status == "failed"


@pytest.mark.parametrize("status,run_status", [(s, s.run_status) for s in CellStatus])
def test_run_statuses_are_the_three_the_run_log_knows(status, run_status):
    assert run_status in ("finished", "failed", "interrupted")


def test_an_exit_with_code_0_is_a_finish_and_another_code_a_failure():
    clean = classify(Observations(ranks=[0, 1], failures={1: fail(1, "SystemExit", "None")}))
    assert clean.status is CellStatus.FINISHED and clean.exited == {1: 0} and not clean.failed
    out = classify(Observations(ranks=[0, 1], failures={1: fail(1, "SystemExit", "3", at=1.0),
                                                          0: interrupted(0)}, released=[0]))
    assert out.status is CellStatus.FAILED and list(out.failed) == [1] and out.exited == {1: 3}
    assert out.error == "rank 1: exited with code 3"


def test_at_32_ranks_a_bug_two_ranks_reached_first_is_not_reported_as_theirs_alone():
    """Every rank would raise, but 30 were released from the collective before they got there: the headline
    says so, and the released ranks are one line per place they waited, not 30 lines."""
    from jdist.errors import RankError
    from jdist.kernel.supervise.report import CellResult, raise_for_result

    failures = {r: fail(r, at=1.0 + r) for r in (0, 5)}
    failures.update({r: interrupted(r) for r in range(32) if r not in (0, 5)})
    obs = Observations(ranks=list(range(32)), failures=failures, released=[r for r in range(32) if r not in (0, 5)])
    where = {r: "all_reduce (cell line 3)" for r in obs.released}
    result = CellResult(obs, classify(obs), rebuilt={"released_from": where, "reattached": [], "stale": [],
                                                     "kept": None, "lost": None})
    with pytest.raises(RankError) as err:
        raise_for_result(result, 32)
    assert err.value.headline == ("2 of 32 rank(s) failed (ranks 0, 5); first failure on rank 0: ValueError: bad shard; "
                                  "the other 30 were released before they got that far")
    shown = err.value._render_traceback_()
    assert ("ranks 1-4, 6-31: released because rank 0 failed (they were waiting in all_reduce (cell line 3))."
            in shown), shown
    assert sum("released because" in line for line in shown) == 1
