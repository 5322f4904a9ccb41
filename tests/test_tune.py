"""``jdist.tune`` (jdist/kernel/tune/, jdist/rank/tune.py): a real Optuna study driven from a real
kernel, trials on slots of 2 of 4 real MPI ranks (gloo groups), one cluster for the module."""

from __future__ import annotations

import inspect
import json
import re
import time
from pathlib import Path

import pytest
from conftest import KernelSession, sigint_in_a_destructor, wait_for

optuna = pytest.importorskip("optuna", reason="jdist[tune] is installed by make test")

FATAL = """
def fatal(trial):
    import os, signal
    if trial.number == 2 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)        # a rank's process dies in the middle of the sweep
    time.sleep(0.3)
    return float(trial.number)
"""

OBJECTIVES = """%%distributed -n 4 --backend ddp --timeout 20
import os, time, optuna, torch, torch.nn as nn, torch.distributed as dist
from optuna_integration import TorchDistributedTrial   # before any sweep: its module has no __spec__ from here on
before = jdist.prepare(nn.Linear(4, 1))        # prepared in the world group, before any sweep
pruned_at = {}

def inside(trial):
    # no group= anywhere: the slot is the default group
    t = torch.tensor([float(trial.number + 1)])
    dist.all_reduce(t)
    model = jdist.prepare(nn.Linear(4, 1))
    model(torch.ones(2, 4)).sum().backward()   # DDP's gradient all-reduce, inside the slot
    return float(t) * 1000 + dist.get_world_size() * 10 + dist.get_rank() * 0

def prunable(trial):
    x = trial.suggest_float("x", 0.0, 10.0)
    for step in range(30):
        t = torch.ones(1); dist.all_reduce(t)
        jdist.log(step=step, val=x)
        time.sleep(0.02 * (dist.get_rank() + 1))   # the ranks of a slot run at different speeds
        if jdist.should_prune():
            pruned_at[trial.number] = step
            return x
    return x

def faulty(trial):
    x = trial.suggest_int("x", 0, 10)
    t = torch.ones(1)
    if x == 2 and dist.get_rank() == 1:
        raise ValueError("boom in trial two")
    if x == 3 and dist.get_rank() == 1:
        time.sleep(600)                           # a hang: rank 0 waits in the all_reduce below
    if x == 7:
        if dist.get_rank() == 0:
            dist.all_reduce(t)                    # its partner never calls it: a hang the watchdog proves
        return 7.0
    if x == 8:                                    # stopped outside any collective, each rank cleans up slowly:
        try:                                      # rank 0 then waits in an all_reduce that rank 1 never joins
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt:
            time.sleep(1 if dist.get_rank() == 0 else 2.5)
            if dist.get_rank() == 0:
                dist.all_reduce(t)
            raise
    dist.all_reduce(t)
    return float(x)

def wrapped(trial):
    # code written for optuna_integration: the trial on rank 0 only, broadcast over the default group
    from optuna_integration import TorchDistributedTrial
    t = TorchDistributedTrial(trial if dist.get_rank() == 0 else None)
    x = t.suggest_float("x", 0.0, 10.0)
    for step in range(20):
        t.report(x, step)
        if t.should_prune():
            pruned_at[t.number] = step
            raise optuna.TrialPruned()
    return x + dist.get_world_size() * 100

def stale(trial):
    # what reaches a rank late, meant for the trial before on its slot: a stop and a plain SIGINT
    import os, signal, jdist.rank.tune as rt
    rt.stop_trial(trial.number - 1, "stopped")
    os.kill(os.getpid(), signal.SIGINT)
    t = torch.ones(1)
    time.sleep(0.05)
    dist.all_reduce(t)                          # a collective right behind them
    return float(t)

def slow(trial):
    x = trial.suggest_float("x", 0.0, 1.0)
    for _ in range(10):
        time.sleep(0.05)
    return x

marks = None  # a folder: stubborn leaves a file there as it starts and as it is stopped

def stubborn(trial):
    # slow to stop: it takes the stop (KeyboardInterrupt) and goes on, as code that saves a checkpoint first
    def mark(what):
        if marks:
            open(os.path.join(marks, f"{trial.number}-{rank}-{what}"), "w").close()
    mark("started")
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        mark("stopped")
        time.sleep(60)
"""


@pytest.fixture(scope="module")
def tk(kernel: KernelSession) -> KernelSession:
    kernel.run(OBJECTIVES)
    kernel.run("import optuna")
    return kernel


def _states(tk: KernelSession, expr: str = "study") -> dict[int, str]:
    return {n: s for n, s in tk.value(f"[(t.number, t.state.name) for t in {expr}.trials]")}


def test_without_a_cluster_tune_says_how_to_start_one(kernel):
    # first in the module: its cluster starts with the next test
    out = kernel.run("jdist.tune('objective', trials=2)", allow_error=True)
    assert out.error["ename"] == "UsageError", out.shown
    assert out.shown == ("UsageError: jdist.tune runs trials on a running cluster: start one with a %%distributed "
                         "cell first (e.g. %%distributed -n 4 defining the objective).")


def test_each_slot_is_the_default_group_and_the_world_comes_back(tk):
    out = tk.run("study = jdist.tune('inside', trials=6, per_trial=2)")
    assert "Sweep done" in out.stdout and "6 complete" in out.stdout, out.stdout
    # the model prepared before the sweep is re-attached to the world group; the trials' own are not
    assert "DDP model(s) before now use the new group" in out.stdout, out.stdout
    # the live view: one display, updated in place; its last state (kept in a saved notebook) has every trial
    views = [d for d in out.displays if "jdist.tune" in d["data"].get("text/html", "")]
    assert views and views[0]["type"] == "display_data" and len({d["transient"]["display_id"] for d in views}) == 1
    last = views[-1]["data"]["text/html"]
    assert last.count(">complete</td>") == 6 and "slot 1" in last and "<svg" in last
    values = tk.value("[(t.number, t.value) for t in study.trials]")
    # all_reduce without group= summed the 2 ranks of the trial's slot only, world size 2
    assert {n: v for n, v in values} == {n: (n + 1) * 2 * 1000 + 20 for n, _ in values}
    # the world group after the sweep: 4 ranks, and the model prepared before it synchronises there
    out = tk.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t)\n"
                 "before(torch.ones(2, 4)).sum().backward()\nprint(dist.get_world_size(), float(t))")
    assert out.stdout.strip() == "4 4.0"
    # the documented columns, also when no trial failed or logged
    df = tk.value("jdist.last_sweep()[['number', 'state', 'slot', 'ranks', 'error', 'run']].values.tolist()")
    assert {slot for _, _, slot, *_ in df} == {0, 1}  # both slots ran trials
    assert {tuple(ranks) for *_, ranks, _, _ in df} == {(0, 1), (2, 3)}
    assert [error for *_, error, _ in df] == [None] * 6


def test_a_pruned_trial_stops_on_both_ranks_of_its_slot_at_the_same_step(tk):
    tk.run("pstudy = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=5.0, n_warmup_steps=3))\n"
           "for x in (9.0, 1.0, 8.0, 2.0):\n    pstudy.enqueue_trial({'x': x})")
    tk.run("%%distributed\npruned_at.clear()")
    out = tk.run("jdist.tune('prunable', trials=4, per_trial=2, metric='val', study=pstudy)")
    assert "2 complete, 2 pruned" in out.stdout, out.stdout
    states = _states(tk, "pstudy")
    xs = dict(tk.value("[(t.number, t.params['x']) for t in pstudy.trials]"))
    assert {n for n, s in states.items() if s == "PRUNED"} == {n for n, x in xs.items() if x > 5}
    tk.run("%dist pull pruned_at")
    per_rank = tk.value("pruned_at")  # one dict per rank: trial -> step it stopped at
    slots = dict(tk.value("[(t.number, t.user_attrs['jdist_slot']) for t in pstudy.trials]"))
    for n, s in states.items():
        if s != "PRUNED":
            continue
        ranks = [2 * slots[n], 2 * slots[n] + 1]
        steps = {per_rank[r].get(n) for r in ranks}
        assert len(steps) == 1 and None not in steps, (n, per_rank)
        assert steps.pop() >= 3  # not before the pruner's warm-up


def test_code_written_for_torch_distributed_trial_runs_unchanged(tk):
    tk.run("wstudy = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=5.0, n_warmup_steps=2))\n"
           "for x in (1.0, 9.0, 2.0, 8.0):\n    wstudy.enqueue_trial({'x': x})")
    tk.run("%%distributed\npruned_at.clear()")
    out = tk.run("jdist.tune('wrapped', trials=4, per_trial=2, study=wstudy)")
    assert "2 complete, 2 pruned" in out.stdout, out.stdout
    rows = tk.value("[(t.params['x'], t.state.name, t.value) for t in wstudy.trials]")
    assert sorted(rows, key=lambda r: r[0]) == [(1.0, "COMPLETE", 201.0), (2.0, "COMPLETE", 202.0),
                                                 (8.0, "PRUNED", 8.0), (9.0, "PRUNED", 9.0)]  # last reported
    tk.run("%dist pull pruned_at")
    per_rank = tk.value("pruned_at")
    slots = dict(tk.value("[(t.number, t.user_attrs['jdist_slot']) for t in wstudy.trials if t.state.name == 'PRUNED']"))
    for n, slot in slots.items():  # both ranks of its slot raised TrialPruned, at the warm-up's end
        assert [per_rank[r].get(n) for r in (2 * slot, 2 * slot + 1)] == [2, 2], (n, per_rank)


def test_a_signal_or_stop_meant_for_the_trial_before_does_not_reach_the_next(tk):
    out = tk.run("jdist.tune('stale', trials=6, per_trial=2, show=False)")
    assert "6 complete" in out.stdout, out.stdout
    assert tk.value("[t.value for t in jdist.kernel.tune.last().study.trials]") == [2.0] * 6


def test_a_failing_and_a_hanging_trial_fail_with_their_cause_and_the_sweep_goes_on(tk):
    tk.run("fstudy = optuna.create_study()\nfor x in range(1, 9):\n    fstudy.enqueue_trial({'x': x})")
    tk.run("%%distributed --watchdog 2\npass")  # the cells' hang watchdog runs inside each trial too
    t0 = time.monotonic()
    out = tk.run("jdist.tune('faulty', trials=8, per_trial=2, study=fstudy, trial_timeout=4)", timeout=120)
    tk.run("%%distributed --watchdog 30\npass")
    assert "4 complete, 4 fail" in out.stdout, out.stdout
    rows = {n: (s, e) for n, s, e in tk.value(
        "[(t.number, t.state.name, t.user_attrs.get('jdist_error')) for t in fstudy.trials]")}
    by_x = dict(tk.value("[(t.params['x'], t.number) for t in fstudy.trials]"))
    assert rows[by_x[2]][0] == "FAIL" and "ValueError: boom in trial two" in rows[by_x[2]][1]
    assert rows[by_x[2]][1].startswith("rank 1:") or rows[by_x[2]][1].startswith("rank 3:")
    state, error = rows[by_x[3]]
    assert state == "FAIL" and error.startswith("timed out after 4 s: "), error
    assert "waiting in all_reduce (cell line" in error and "running cell line" in error  # where each rank was
    state, error = rows[by_x[7]]  # rank 1 sleeping above is no hang; here every running rank waits: a hang
    assert state == "FAIL" and re.fullmatch(r"hung: no progress for 2 s and every rank of its slot waits in a "
                                            r"collective \(--watchdog\): rank [02] waiting in all_reduce \(cell line "
                                            r"\d+\)", error), error
    state, error = rows[by_x[8]]  # rank 0 was released again once rank 1 had stopped, not left for the grace
    assert state == "FAIL" and error.startswith("timed out after 4 s: "), error
    assert all(rows[by_x[x]][0] == "COMPLETE" for x in (1, 4, 5, 6))
    assert "boom in trial two" in tk.value(f"fstudy.trials[{by_x[2]}].user_attrs['jdist_traceback']")
    assert time.monotonic() - t0 < 60
    # the repaired slots work: a plain cell on the world group afterwards
    out = tk.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t); print(float(t))")
    assert out.stdout.strip() == "4.0"

    # a trial that ignores its stop: after --interrupt-grace (2 s here, not a fixed 15 s) its ranks are named and,
    # since its slot group cannot be given back, the ranks are restarted; the world group is back afterwards
    tk.run("%%distributed --interrupt-grace 2\nmarks = None")
    t0 = time.monotonic()
    msg = tk.start("jdist.tune('stubborn', trials=1, per_trial=2, trial_timeout=1, name='stuck')")
    out = tk.wait_for_stdout(msg, "so the ranks are restarted", timeout=60)
    assert time.monotonic() - t0 < 14, out.stdout  # 1 s, the grace, two stacks (<= 2 s each), the start: not 15 s
    assert re.search(r"jdist.tune: trial 0 on ranks 0, 1 \(rank 0 running cell line \d+; rank 1 running cell line "
                     r"\d+\) did not stop within 2 s \(--interrupt-grace\) of being stopped \(timed out after 1 s\): a "
                     "slot group that a trial still runs in cannot be given back, so the ranks are restarted",
                     out.stdout)
    out = tk.collect(msg, timeout=120)
    assert "Restarted 4 rank(s)" in out.stdout and "Sweep stopped: stuck, 1 fail" in out.stdout, out.stdout
    assert out.error["ename"] == "SweepStopped" and len(out.traceback.splitlines()) == 1, out.traceback
    assert "jdist.tune(..., resume=True)" in out.error["evalue"]
    [(state, error)] = tk.value("[(t.state.name, t.user_attrs['jdist_error']) "
                                "for t in jdist.kernel.tune.last().study.trials]")
    assert state == "FAIL" and error.startswith("timed out after 1 s, and it did not stop within 2 s: rank 0 running")
    sweep = json.loads((Path(tk.value("str(jdist.kernel.tune.last().folder)")) / "sweep.json").read_text())
    assert sweep["status"] == "stopped"
    out = tk.run("%%distributed --interrupt-grace 10\nt = torch.ones(1); dist.all_reduce(t)\n"
                 "print(dist.get_world_size(), float(t))")
    assert out.stdout.strip() == "4 4.0"  # every rank in the world group again, not in a 2-rank slot
    out = tk.run("jdist.tune('inside', trials=2, per_trial=2, show=False)")  # and a new sweep forms its slots
    assert "Sweep done" in out.stdout and "2 complete" in out.stdout, out.stdout


def _completed(journal: Path) -> int:
    if not journal.exists():
        return 0
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    try:
        study = optuna.load_study(study_name="resumable", storage=storage)
    except KeyError:
        return 0
    return sum(t.state.name == "COMPLETE" for t in study.trials)


# the sweep's loop, once `trigger` exists: a SIGINT that lands in a destructor, where Python drops it (as in
# pyzmq's Frame.__dealloc__, which the loop's polls free by the thousand; a clean clone's sweep ran on so)
DROP_AN_INTERRUPT = "import os\n" + inspect.getsource(sigint_in_a_destructor) + """
import jdist.kernel.tune.driver as _driver
_turn = _driver.Sweep._check_entered
def _check_entered(self):
    if os.path.exists({trigger!r}):
        os.remove({trigger!r})
        sigint_in_a_destructor()
    return _turn(self)
_driver.Sweep._check_entered = _check_entered
"""


def test_an_interrupt_stops_the_sweep_keeps_the_trials_and_resume_goes_on(tk, kernel_env, tmp_path):
    journal = Path(kernel_env["JDIST_RUN_DIR"]) / "sweeps" / "resumable" / "journal.log"
    trigger = tmp_path / "interrupt"
    tk.run(DROP_AN_INTERRUPT.format(trigger=str(trigger)))
    try:
        msg = tk.start("study = jdist.tune('slow', trials=40, per_trial=1, name='resumable')")
        wait_for(lambda: _completed(journal) >= 4, timeout=60, what="4 trials of the sweep completed")
        trigger.touch()  # the Ctrl-C, dropped by Python: the sweep's count of SIGINTs raises it again
        out = tk.collect(msg, timeout=60)
    finally:
        tk.run("_driver.Sweep._check_entered = _turn")
    assert not trigger.exists() and "Exception ignored" in out.stderr  # it was dropped where it landed
    assert "Sweep interrupted" in out.stdout and "resume=True" in out.stdout, out.stdout + out.traceback
    done = tk.value("sum(t.state.name == 'COMPLETE' for t in study.trials)")
    assert 4 <= done < 40
    interrupted = tk.value("sum(bool(t.user_attrs.get('jdist_interrupted')) for t in study.trials)")
    assert tk.value("[t.state.name for t in study.trials if t.user_attrs.get('jdist_interrupted')]") == ["FAIL"] * interrupted
    # a trial left RUNNING in the journal (as by a kernel that died mid-trial) counts as interrupted on resume
    tk.run("left = study.ask(); jdist.kernel.tune.last().journal.flush()")
    out = tk.run("study = jdist.tune('slow', trials=40, per_trial=1, name='resumable', resume=True)")
    assert "Sweep done" in out.stdout, out.stdout
    assert tk.value("sum(t.state.name == 'COMPLETE' for t in study.trials)") == 40
    assert tk.value("(study.trials[left.number].state.name, study.trials[left.number].user_attrs)") == (
        "FAIL", {"jdist_error": "interrupted (the sweep stopped)", "jdist_interrupted": True})
    assert tk.value("len(study.trials)") == 40 + interrupted + 1
    # the journal is Optuna's own: Optuna reads the same study back
    assert tk.value("len(optuna.load_study(study_name='resumable', storage=optuna.storages.JournalStorage("
                    "optuna.storages.journal.JournalFileBackend(str(jdist.kernel.tune.sweeps_dir() / "
                    "'resumable' / 'journal.log')))).trials)") == 40 + interrupted + 1

    # trials slow to stop: a second Ctrl-C stops waiting at once, names where their ranks are and, since their slot
    # groups cannot be given back, restarts the ranks; the sweep ends "interrupted" and the next cell runs at once
    tk.run(f"%%distributed\nmarks = {str(tmp_path)!r}")
    msg = tk.start("jdist.tune('stubborn', trials=2, per_trial=2, name='stubborn')")
    wait_for(lambda: len(list(tmp_path.glob("*-started"))) == 4, timeout=60, what="both trials running")
    tk.km.interrupt_kernel()
    wait_for(lambda: len(list(tmp_path.glob("*-stopped"))) == 4, timeout=30, what="both trials stopped, not ending")
    t0 = time.monotonic()
    tk.km.interrupt_kernel()
    out = tk.wait_for_stdout(msg, "so the ranks are restarted", timeout=30)
    assert time.monotonic() - t0 < 10, out.stdout  # not the trials' 60 s: their ranks' stacks (at most 2 s)
    line = next(line for line in out.stdout.splitlines() if "so the ranks are restarted" in line)
    for trial, ranks in re.findall(r"trial (\d) on ranks (\d, \d) \(", line):
        a, b = ranks.split(", ")
        assert f"trial {trial} on ranks {ranks} (rank {a} running cell line" in line and f"rank {b} running" in line
    assert sorted(re.findall(r"on ranks (\d, \d)", line)) == ["0, 1", "2, 3"], line
    assert line.startswith("jdist.tune: stopped waiting (a second interrupt) for trial "), line
    out = tk.collect(msg, timeout=120)
    assert out.error is None, out.traceback  # no traceback through jdist
    assert "Restarted 4 rank(s)" in out.stdout, out.stdout
    assert "Sweep interrupted: stubborn, 2 interrupted" in out.stdout, out.stdout
    sweep = json.loads((journal.parent.parent / "stubborn" / "sweep.json").read_text())
    assert sweep["status"] == "interrupted"
    out = tk.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t)\nprint(dist.get_world_size(), float(t))",
                 timeout=30)
    assert out.stdout.strip() == "4 4.0"


INTERRUPT_BETWEEN_ASK_AND_START = """
import jdist.kernel.tune.driver as _driver
_send_trial, _sent = _driver.Sweep._send, []
def _send(self, slot, name):
    _sent.append(slot)
    if len(_sent) == 4:  # the fourth trial: the Ctrl-C lands after the study's ask, before the ranks have it
        def interrupted(*args, **kwargs):
            del self.cluster.apply_async
            raise KeyboardInterrupt
        self.cluster.apply_async = interrupted
    return _send_trial(self, slot, name)
_driver.Sweep._send = _send
"""


def test_a_trial_asked_when_the_interrupt_came_is_not_left_running(tk):
    tk.run(INTERRUPT_BETWEEN_ASK_AND_START)
    try:
        out = tk.run("asked = jdist.tune('slow', trials=6, per_trial=1, name='asked')", timeout=60)
    finally:
        tk.run("_driver.Sweep._send = _send_trial")
    assert "Sweep interrupted" in out.stdout, out.stdout + out.traceback
    states = tk.value("[(t.number, t.state.name, t.user_attrs.get('jdist_interrupted'), t.user_attrs.get('jdist_error')) "
                      "for t in asked.trials]")
    assert len(states) == 4 and not [s for s in states if s[1] == "RUNNING"], states  # 3 started, the 4th asked
    assert states[3] == (3, "FAIL", True, "interrupted (the sweep stopped) before it started"), states


def test_an_objective_defined_in_the_notebook_runs_with_the_ranks_globals(tk):
    # the kernel has no `dist`: the function's global names are looked up on the ranks
    tk.run("def kobj(trial):\n    x = trial.suggest_int('x', 0, 3)\n    return x + dist.get_world_size() * 10")
    out = tk.run("kstudy = jdist.tune(kobj, trials=4, per_trial=2, show=False)")
    assert "4 complete" in out.stdout, out.stdout
    assert {int(v) // 10 for v in tk.value("[t.value for t in kstudy.trials]")} == {2}  # the slot's world size


def test_bad_input_says_the_fix(tk, kernel_env):
    sweeps = Path(kernel_env["JDIST_RUN_DIR"]) / "sweeps"
    before = sorted(p.name for p in sweeps.iterdir())

    def refused(code: str) -> str:
        # one UsageError line, as the magics' bad input: no traceback through jdist, nothing started
        out = tk.run(code, allow_error=True)
        assert out.error["ename"] == "UsageError" and out.shown == "UsageError: " + out.error["evalue"], out.shown
        return out.error["evalue"]

    assert "per_trial=3 does not divide the 4 ranks into slots: use one of 1, 2, 4." in refused(
        "jdist.tune('inside', trials=2, per_trial=3)")
    assert "no function 'nothing_here' on rank(s) [0, 1, 2, 3]" in refused("jdist.tune('nothing_here', trials=2)")
    assert "pruner='sometimes': use one of asha, median, hyperband, none" in refused(
        "jdist.tune('inside', trials=2, pruner='sometimes')")
    assert "pass resume=True" in refused("jdist.tune('inside', trials=2, name='resumable')")
    assert "no sweep called 'never-ran'" in refused("jdist.tune('inside', trials=2, resume=True, name='never-ran')")
    assert "trials=0: a sweep needs a whole number of trials, at least 1." in refused("jdist.tune('inside', trials=0)")
    assert "use 'minimize' or 'maximize'" in refused("jdist.tune('inside', direction='down')")
    assert "trial_timeout=0: pass positive seconds" in refused("jdist.tune('inside', trial_timeout=0)")
    assert sorted(p.name for p in sweeps.iterdir()) == before  # no sweep's folder was made


def test_a_rank_that_cannot_form_its_slot_stops_the_sweep_with_why_and_the_world_is_untouched(tk):
    # rank 1 says its slots are set up already (as after a sweep whose end was lost): every rank refuses
    # together before any group changes, the trials queued behind are stopped and not counted
    tk.run("%%distributed\nif rank == 1:\n    import jdist.rank.tune as _rt; _rt._slot = 'stale'")
    out = tk.run("jdist.tune('slow', trials=4, per_trial=2, name='refused')", allow_error=True, timeout=120)
    assert out.error and "the slots could not be formed" in out.error["evalue"], out.shown
    assert "rank 1: its slots are already set up" in out.error["evalue"] and "Sweep stopped" in out.stdout
    assert tk.value("[t.user_attrs.get('jdist_interrupted') for t in jdist.kernel.tune.last().study.trials]") \
        in ([], [True], [True, True])
    tk.run("%%distributed\nif rank == 1:\n    _rt._slot = None")
    out = tk.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t)\nprint(dist.get_world_size(), float(t))")
    assert out.stdout.strip() == "4 4.0"


def test_fsdp_trains_inside_the_slots(tk):
    tk.run("%%distributed --backend fsdp --restart\nimport time, torch, torch.nn as nn, torch.distributed as dist\n"
           "def sharded(trial):\n"
           "    lr = trial.suggest_float('lr', 0.01, 0.1)\n"
           "    torch.manual_seed(0)\n"
           "    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))\n"
           "    model, opt = jdist.prepare(model, torch.optim.SGD(model.parameters(), lr=lr))\n"
           "    for step in range(3):\n"
           "        loss = model(torch.ones(4, 8)).square().mean(); jdist.backward(loss); opt.step(); opt.zero_grad()\n"
           "    shard = sum(p.to_local().numel() for p in model.parameters())\n"
           "    return dist.get_world_size() * 1000 + shard\n" + FATAL)
    out = tk.run("study = jdist.tune('sharded', trials=2, per_trial=2)")
    assert "2 complete" in out.stdout, out.stdout
    # each trial's model is sharded over its slot's 2 ranks, not the world's 4: FSDP splits every
    # parameter along dim 0, so slot rank 0 holds 8 of the 16 rows of each 16-row tensor (8 x 8 + 8)
    # and the whole 1-row ones (16 + 1): 89 values; over 4 ranks it would hold 53
    assert {int(v) for v in tk.value("[t.value for t in study.trials]")} == {2000 + 89}


def test_a_rank_that_dies_stops_the_sweep_with_one_line_and_keeps_the_trials(tk):
    # last in the module, on the fsdp cluster of the test before: it ends the cluster
    out = tk.run("study = jdist.tune('fatal', trials=8, per_trial=2, name='fatal')", allow_error=True, timeout=120)
    assert out.error["ename"] == "RankLost", out.shown
    assert re.search(r"rank [13] died", out.error["evalue"]) and "jdist.tune(..., resume=True)" in out.error["evalue"]
    assert "killed by SIGKILL" in out.error["evalue"]
    rows = tk.value("[(t.number, t.state.name) for t in jdist.kernel.tune.last().study.trials]")
    assert (2, "FAIL") in rows and all(state in ("COMPLETE", "FAIL") for _, state in rows)
