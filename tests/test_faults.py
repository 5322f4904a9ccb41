"""Fault handling on real 2-rank MPI clusters (docs/reliability.md), beyond the fault matrix
(tests/test_fault_matrix.py: each fault through each driver and backend): the rebuild of models after a
release, groups of the user's, the watchdog's false alarms, exits, bad input, checkpoints and restarts.
The process-group timeout is 120 s, so a release or a hang report that arrives is jdist's doing (the
messages say which mechanism acted); how fast each is handled is measured by
benchmarks/bench_faults.py, not asserted here.
"""

from __future__ import annotations

import socket

import pytest
from conftest import strip_ansi

SETUP = (
    "%%distributed\n"
    "import os, signal, time, torch, torch.nn as nn, torch.distributed as dist\n"
    "torch.manual_seed(0)\n"
    "model = jdist.prepare(nn.Linear(4, 1))\n"
    "opt = jdist.prepare(torch.optim.SGD(model.parameters(), lr=0.1))\n"
    "kept = rank + 100\n"
)
STEP = "loss = model(torch.ones(8, 4)).pow(2).mean(); jdist.backward(loss); opt.step(); opt.zero_grad()"


@pytest.fixture(scope="module")
def faults(kernel):
    # --timeout 120: any release faster than that is jdist's doing, not the process-group timeout
    kernel.run("%%distributed -n 2 --backend ddp --timeout 120\nimport torch")
    kernel.run(SETUP)
    return kernel


def _group_works(k) -> None:
    out = k.run(f"%%distributed\nx = torch.ones(1); dist.all_reduce(x); {STEP}\nprint(int(x.item()), kept)")
    assert out.stdout.splitlines()[0] == "2 100", out.stdout  # then the step's run summary (--auto-metrics)
    assert "2 records" in out.stdout


def _no_logging_errors(*outs) -> None:
    """No rank's engine failed to write its own log: mpiexec.gforker closes a rank's output pipe at its
    first non-ASCII byte, and the released rank's engine logs gloo's error, which ends in an emoji."""
    for out in outs:
        text = out.stdout + out.stderr + out.traceback
        assert not [line for line in text.splitlines() if "Logging error" in line or "BrokenPipeError" in line], text


def test_exception_on_one_rank_releases_the_others(faults):
    out = faults.run(
        "%%distributed --output all\nif rank == 1:\n    raise ValueError('bad shard')\ndist.all_reduce(torch.ones(1))",
        allow_error=True, timeout=100,
    )
    tb = out.traceback
    assert out.error["ename"] == "RankError" and "1 of 2 rank(s) failed (rank 1)" in tb
    assert "raise ValueError('bad shard')" in tb
    assert "rank 0: released because rank 1 failed (it was waiting in all_reduce (cell line 3))" in tb
    assert "process group was re-created on all ranks; variables on the ranks are kept" in tb
    assert "DDP model(s) model now use the new group" in tb
    _group_works(faults)  # the next cell works without any restart
    later = [faults.run("%%distributed --output all\nprint(kept)") for _ in range(2)]
    _no_logging_errors(out, *later)


def test_failure_outside_a_collective_stops_the_others_too(faults):
    out = faults.run("%%distributed\nif rank == 1:\n    raise ValueError('early')\nwhile True:\n    time.sleep(0.01)",
                     allow_error=True, timeout=100)
    assert "rank 0: released because rank 1 failed (stopped with KeyboardInterrupt)" in out.traceback
    assert "re-created" not in out.traceback  # nothing was broken, nothing to repair
    _group_works(faults)


def test_an_interrupt_after_a_collective_only_one_rank_started_re_creates_the_group(faults):
    """An asynchronous collective that rank 0 started and rank 1 never will (as DDP's bucket reductions or
    DeepSpeed's prefetch can be when the interrupt comes): no rank waits in it, yet the next collective
    would pair with it and the one after hang. The ranks' counts of started collectives differ, so the
    group is re-created."""
    out = faults.interrupted("%%distributed\nif rank == 0:\n    pending = dist.all_reduce(torch.ones(1), async_op=True)\n"
                             "print('started', flush=True)\nwhile True:\n    time.sleep(0.01)", "started", timeout=60)
    assert out.error["ename"] == "KeyboardInterrupt", out.shown
    assert "process group was re-created on all ranks; variables on the ranks are kept" in out.shown, out.shown
    _group_works(faults)


def test_a_rank_that_handles_the_interrupt_and_then_waits_in_a_collective_is_released(faults):
    """Rank 1 catches the KeyboardInterrupt and goes on into an all_reduce that rank 0, stopped, never
    joins (as a rank can when the interrupt comes just before it enters a collective): its guard had
    nothing to release when the SIGINT came, so the kernel sends it another one, and the group is
    re-created instead of the ranks waiting out the grace and needing a restart. Rank 1 enters the
    all_reduce 1 s after the SIGINT (every copy of it has come by then) and rank 0 takes 2.5 s to stop, so
    at the grace's first look (2 s) no rank has stopped yet and the kernel must look again (CI once saw
    a loaded rank stop only after that first look)."""
    out = faults.interrupted("%%distributed\ntry:\n    print('looping', flush=True)\n    while True:\n"
                             "        time.sleep(0.01)\nexcept KeyboardInterrupt:\n    if rank == 1:\n"
                             "        time.sleep(1)\n        dist.all_reduce(torch.ones(1))\n"
                             "    else:\n        time.sleep(2.5)\n"
                             "    raise", "looping", timeout=60)
    assert out.error["ename"] == "KeyboardInterrupt", out.shown
    assert "did not stop" not in out.shown, out.shown
    assert "process group was re-created on all ranks; variables on the ranks are kept" in out.shown, out.shown
    _group_works(faults)


def test_a_hang_in_a_group_made_with_new_group_is_released_too(faults):
    # DeepSpeed's groups, new_subgroups, the user's own: their sockets are the guard's too
    out = faults.run("%%distributed --watchdog 3\npair = dist.new_group([0, 1])\nx = torch.ones(1)\n"
                     "if rank == 0:\n    dist.all_reduce(x, group=pair)", allow_error=True, timeout=100)
    faults.run("%%distributed --watchdog 30\npass")
    assert out.error["ename"] == "HangError", out.shown
    tb = out.traceback
    assert "rank 0: waiting in all_reduce (cell line 4)" in tb, tb
    assert "did not stop" not in tb and "stuck" not in tb, tb  # released at once, not after the group's timeout
    _group_works(faults)


def test_watchdog_leaves_long_computations_alone(faults):
    # rank 1 computes (no collective) for longer than the watchdog while rank 0 waits: not a hang
    out = faults.run("%%distributed --watchdog 1\nif rank == 1:\n    time.sleep(3)\ndist.barrier()\nprint('done')",
                     timeout=60)
    faults.run("%%distributed --watchdog 30\npass")
    assert out.stdout.strip() == "done"


EXIT_SCRIPT = """import argparse, sys, torch, torch.distributed as dist
p = argparse.ArgumentParser(description="a torchrun-style script")
p.add_argument("--code", type=int, default=0)
p.add_argument("--fail", action="store_true")
args = p.parse_args()
if int(__import__("os").environ["RANK"]) == 1:
    if args.fail:
        raise ValueError("bad shard in a script")
    exit(args.code)
dist.all_reduce(torch.ones(1))
"""


def test_scripts_and_cells_end_as_under_torchrun(faults, tmp_path):
    """sys.exit/exit()/quit in cells and %run scripts: code 0 ends the cell there (the ranks and their
    variables stay), another code is an error naming it; a script's error releases the others."""
    for code in ("import sys; sys.exit(0)", "exit()", "quit", "raise SystemExit"):
        out = faults.run(f"%%distributed\n{code}")
        assert "ranks 0-1 exited with code 0" in out.stdout and "To exit" not in out.stderr, code
    assert faults.run("%%distributed\nprint(kept)").stdout.split() == ["100"]  # same ranks, same variables
    script = tmp_path / "train.py"
    script.write_text(EXIT_SCRIPT)
    out = faults.run(f"%%distributed\n%run {script} --help")  # argparse prints its help and exits 0
    assert "a torchrun-style script" in out.stdout and out.error is None
    out = faults.run(f"%%distributed\n%run {script} --code 3", allow_error=True, timeout=100)
    tb = out.traceback
    assert "1 of 2 rank(s) failed (rank 1); first failure on rank 1: exited with code 3" in tb
    assert "Traceback" not in tb and "rank 0: released because rank 1 failed" in tb
    out = faults.run(f"%%distributed\n%run {script} --fail", allow_error=True, timeout=100)
    assert "first failure on rank 1: ValueError: bad shard in a script" in out.traceback
    assert "rank 0: released because rank 1 failed (it was waiting in all_reduce" in out.traceback
    _group_works(faults)


def test_dist_stacks_on_idle_ranks(faults):
    out = faults.run("%dist stacks")
    assert out.stdout.count("idle (no cell running)") == 2


def test_port_in_use_is_named_and_leaves_the_cluster_usable(faults):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = faults.run(f"%%distributed --restart --port {port}\npass", allow_error=True)
    assert f"--port {port} is in use on this machine" in out.shown and "Choose another --port" in out.shown
    assert "Traceback" not in out.shown and len(out.shown.splitlines()) == 1
    _group_works(faults)


@pytest.mark.parametrize("line,fix", [
    ("--restart -n 0", "at least 1"),
    ("--restart -n 1000", "-n 64 or fewer"),
    ("--restart --backend nope", "Unknown backend"),
    ("--restart --gpus 64", "--gpus 64 asks for 64 GPUs"),
    ("--targets 5", "ranks are 0..1"),
    ("--targets x", "--targets 0,2"),
    ("-n 3", "Add --restart"),
    ("--restart --watchdog -1", "--watchdog must be"),
    ("--restart --port 80", "1024 to 65535"),
])
def test_bad_input_names_the_fix_and_keeps_the_cluster(faults, line, fix):
    out = faults.run(f"%%distributed {line}\npass", allow_error=True)
    assert fix in out.shown, out.shown
    assert len(out.shown.splitlines()) <= 2, "one line, no traceback"
    assert faults.run("%%distributed\nprint(kept)").stdout.strip() == "100"


def test_syntax_error_once_and_pull_errors(faults):
    out = faults.run("%%distributed\nfor x in :\n    pass", allow_error=True)
    assert out.traceback.count("SyntaxError") == 1 and "not sent to the ranks" in out.traceback
    out = faults.run("%dist pull no_such_name", allow_error=True)
    assert "Define it in a %%distributed cell first" in out.shown
    faults.run("%%distributed\nimport threading\nlock = threading.Lock()")
    out = faults.run("%dist pull lock", allow_error=True)
    assert "could not be sent back" in out.shown and "picklable" in out.shown
    _group_works(faults)


def test_a_dead_rank_is_named_and_auto_restart_restores_the_checkpoint(faults, tmp_path):
    """A rank that dies under --auto-restart: named, the ranks restarted, the set-up cells replayed and the newest
    checkpoint restored without being asked. ``%dist restart`` by hand runs the same recovery
    (jdist/kernel/recovery.py); a death and then ``%dist restart``: test_fault_matrix.py's cell-ddp-death."""
    # the stream's checkpoint_every message is lost, as when a short cell's messages all arrive before the
    # kernel listens (ipyparallel then keeps only the last, the cell's end): the end message repeats it
    faults.run(f"%%distributed\nckpt_dir = {str(tmp_path / 'ckpt')!r}\n"
               "_s = jdist.rank.session(); _send = type(_s.channel).publish.__get__(_s.channel)\n"
               "_s.channel.publish = lambda m: None if m['kind'] == 'checkpoint_every' else _send(m)\n"
               "jdist.checkpoint_every(5, ckpt_dir, keep=2, model=model, optimizer=opt)\n"
               "_s.channel.publish = _send")
    # rank 1 aborts at step 12, as a C++ library would (no core file); checkpoints exist for 5 and 10
    out = faults.run(
        "%%distributed --auto-restart\nimport resource\nfor step in range(1, 1000):\n"
        f"    {STEP}\n    jdist.log(step=step, loss=loss.item())\n"
        "    if step == 12 and rank == 1:\n        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        "        os.write(2, b'terminate called after throwing an instance of c10::Error\\n'); os.abort()\n"
        "    time.sleep(0.02)",
        allow_error=True, timeout=200,
    )
    tb = out.traceback
    assert "rank 1 died: killed by SIGABRT (Aborted)" in tb, tb
    # what it wrote to fd 2 just before (it died with ipykernel's pipe before), and where it crashed: its
    # faulthandler report, from the rank's crash file (an exit code alone: test_deepspeed.py)
    assert ("Rank 1's last output on stderr, not shown before it died:\n"
            "  terminate called after throwing an instance of c10::Error\n"
            "Rank 1 crashed (Fatal Python error: Aborted) here, innermost call last:\n  cell line 7, in <module>\n"
            ) in strip_ansi(tb), tb
    assert "Restarted 2 rank(s)" in tb and "set-up cell(s); restored" in tb and "(step 10) into model, opt" in tb, tb
    out = faults.run("%%distributed\nprint(jdist.restored_step(), kept)\nw = model.module.weight.detach().clone()")
    assert out.stdout.strip() == "10 100"
    faults.run("%dist pull w")
    same = faults.run(f"import torch\nsaved = torch.load({str(tmp_path / 'ckpt' / 'step-00000010')!r}, "
                      "weights_only=False)['model']['weight']\nprint(all(torch.equal(x, saved) for x in w))")
    assert same.stdout.strip() == "True"
    _group_works(faults)
