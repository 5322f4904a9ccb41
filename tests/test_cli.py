"""``jdist run``, ``jdist runs`` and ``jdist show`` as a user runs them: real CLI processes starting
real 2-rank MPI clusters, a real pseudo-terminal for the live view and Ctrl-C (the terminal's
SIGINT to the foreground process group), the run folders read back with jdist's reader.
The exit codes are docs/cli.md's table; how fast each path is: benchmarks/bench_cli.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for

from jdist.cli import main, parser
from jdist.cli.runs import title_of
from jdist.common.procs import pid_alive
from jdist.kernel.launch.ipcontroller import OWNER_POLL_S
from jdist.metrics import list_runs, read_run

pytestmark = pytest.mark.cluster

JDIST = [sys.executable, "-m", "jdist"]

TRAIN = """import argparse, os, resource, sys, time
import torch, torch.distributed as dist
import jdist
p = argparse.ArgumentParser(description="a torchrun-style training script")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--fail-at", type=int, default=-1)
p.add_argument("--abort-at", type=int, default=-1)
p.add_argument("--exit", type=int, default=None)
def train(args, rank):
    model = jdist.prepare(torch.nn.Linear(8, 1))
    opt = jdist.prepare(torch.optim.SGD(model.parameters(), lr=0.05))
    jdist.progress(total_steps=args.steps)
    for step in range(args.steps):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        jdist.backward(loss); opt.step(); opt.zero_grad()
        jdist.log(step=step, loss=loss.item())
        if rank == 1 and step == args.fail_at:
            raise ValueError(f"loss went bad at step {step}")
        if rank == 1 and step == args.abort_at:  # as a C++ library would (no core file)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); os.write(2, b"fatal: CXX last words\\n"); os.abort()
        time.sleep(args.sleep)
def main():
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train(args, rank)
    print(f"rank {rank} done, argv {sys.argv[1:]}, name {__name__}, threads {torch.get_num_threads()}", flush=True)
    if args.exit is not None:
        sys.exit(args.exit)
    dist.destroy_process_group()
if __name__ == "__main__":
    main()
"""


@pytest.fixture
def work(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.setenv("JDIST_RUN_DIR", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def jdist(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*JDIST, *args], capture_output=True, text=True, timeout=timeout)


def only_run(work: Path) -> Path:
    runs = list_runs(work / "runs")
    assert len(runs) == 1, runs
    return runs[0]


def gone(pids: list[int]) -> bool:
    return not any(pid_alive(p) for p in pids)


def test_a_script_runs_on_every_rank_and_its_run_is_in_the_run_log(work, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's: kept on the ranks as torchrun keeps it (else 2 cores / 2)
    # the options from a profile, as in a cell: --cluster NAME
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(work / "config"))
    (work / "config" / "jdist").mkdir(parents=True)
    (work / "config" / "jdist" / "clusters.toml").write_text('[pair]\nn = 2\nwatchdog = 30\n')
    args = ("--cluster", "pair", "--every", "0.3", "train.py", "--steps", "20", "--sleep", "0.05", "--exit", "0")
    out = jdist("run", *args)
    assert out.returncode == 0, out.stderr  # sys.exit(0) is a normal end, as for python itself
    assert "Ready: 2 rank(s)" in out.stderr
    # rank 0's output (the default), the script as __main__ with its own arguments, untouched
    assert "rank 0 done, argv ['--steps', '20', '--sleep', '0.05', '--exit', '0'], name __main__, threads 3" in out.stdout
    assert "rank 1 done" not in out.stdout
    # stdout is not a terminal: the plain view's status lines, every --every seconds
    lines = [line for line in out.stdout.splitlines() if line.startswith("[jdist] step ")]
    assert lines, out.stdout
    assert "/20 (" in lines[0] and "loss " in lines[0] and "ms/step" in lines[0]
    assert "finished after" in out.stdout and "loss:" in out.stdout  # the run's summary at the end
    assert "jdist run train.py: finished on 2 rank(s)" in out.stderr
    run = read_run(only_run(work))
    assert run.status == "finished" and run.world_size == 2 and run.count() == 40
    assert run.code.startswith("# $ jdist run --cluster pair --every 0.3 train.py --steps 20") and "import argparse" in run.code
    assert not (run.path / "errors.json").exists()
    listed = jdist("runs", "--json")
    row = json.loads(listed.stdout.splitlines()[0])
    assert row["run_id"] == run.run_id and row["status"] == "finished" and row["steps"] == 20
    assert row["title"] == "jdist run " + " ".join(args)
    shown = jdist("show", run.run_id[:15])
    assert shown.returncode == 0 and f"jdist run {run.run_id}: finished" in shown.stdout
    history = jdist("show", "--history")
    assert history.stdout.splitlines()[0].startswith("rank,") and len(history.stdout.splitlines()) == 41


def test_a_rank_exception_exits_1_with_the_root_cause_and_the_bystander_released(work):
    out = jdist("run", "-n", "2", "train.py", "--steps", "50", "--fail-at", "3", "--sleep", "0.02")
    assert out.returncode == 1, out.stderr
    err = out.stderr
    assert "first failure on rank 1: ValueError: loss went bad at step 3" in err
    assert err.count("raise ValueError(f\"loss went bad at step {step}\")") == 1  # its traceback, once
    # where it waited: the line in train(), not the script's main() call (the common main() layout)
    assert re.search(r"rank 0: released because rank 1 failed \(it was waiting in .* \(train\.py:(1[6-9]|2[0-3]) "
                     r"in train\)\)", err), err
    assert "%dist" not in err and "\x1b[" not in err  # no notebook advice, no colour codes in a pipe
    assert "FAILED after" in err and "(exit 1)" in err
    path = only_run(work)
    entries = json.loads((path / "errors.json").read_text())
    assert [(e["rank"], e["kind"]) for e in entries] == [(1, "exception"), (0, "released")]
    assert entries[0]["type"] == "ValueError" and any("fail-at" in line or "raise ValueError" in line
                                                      for line in entries[0]["traceback"])
    assert read_run(path).status == "failed"
    assert gone([e["pid"] for e in entries])
    shown = jdist("show")
    assert "rank 1 on" in shown.stdout and ": exception: loss went bad at step 3" in shown.stdout


def test_exits_killed_ranks_and_hangs_have_their_own_codes(work):
    # (sys.exit(0): test_a_script_runs_on_every_rank_and_its_run_is_in_the_run_log)
    out = jdist("run", "-n", "2", "train.py", "--steps", "3", "--exit", "3")
    assert out.returncode == 1 and "exited with code 3" in out.stderr and "Traceback" not in out.stderr
    out = jdist("run", "-n", "2", "train.py", "--steps", "50", "--abort-at", "2", "--sleep", "0.02")
    assert out.returncode == 128 + 6, out.stderr
    assert "rank 1 died: killed by SIGABRT" in out.stderr, out.stderr
    assert ("Rank 1's last output on stderr, not shown before it died:\n  fatal: CXX last words\n"
            "Rank 1 crashed (Fatal Python error: Aborted)") in out.stderr, out.stderr
    crash = out.stderr.split("Rank 1 crashed (Fatal Python error: Aborted) here, innermost call last:\n")[-1]
    assert [line.rsplit("/", 1)[-1] for line in crash.splitlines()[:3]] == [  # the script's frames, outermost first
        'train.py", line 33, in <module>', 'train.py", line 27, in main', 'train.py", line 21, in train'], out.stderr
    (work / "hang.py").write_text("import torch, torch.distributed as dist\n"
                                  "if dist.get_rank() == 0:\n    dist.all_reduce(torch.ones(1))\n")
    out = jdist("run", "-n", "2", "--watchdog", "2", "hang.py")
    assert out.returncode == 4, out.stderr
    # (rank 1 ended without the collective: the Flight Recorder proves the hang at once, before the watchdog)
    assert "collective left alone: rank 0 waits in all_reduce #" in out.stderr, out.stderr
    assert "rank 0: waiting in all_reduce" in out.stderr
    entries = json.loads((list_runs(work / "runs")[0] / "errors.json").read_text())
    assert entries[0]["kind"] == "hang" and entries[0]["rank"] == 0
    out = jdist("run", "-n", "2", "--start-timeout", "0.1", "train.py")
    assert out.returncode == 3 and "the launch failed: Only " in out.stderr and "registered within 0.1 s" in out.stderr


@pytest.mark.parametrize("argv,fix", [
    (["run", "-n", "2", "missing.py"], "no script 'missing.py'"),
    (["run", "-n", "2", "--backend", "nope", "train.py"], "Unknown backend 'nope'. Use --backend with one of"),
    (["run", "train.py"], "-n"),
    (["show", "nosuchrun"], "no run"),
])
def test_bad_input_is_one_line_and_exit_2(work, argv, fix):
    out = jdist(*argv)
    assert out.returncode == 2 and fix in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not list_runs(work / "runs")


class Terminal:
    """``jdist run`` on a pseudo-terminal: Ctrl-C is the terminal's SIGINT to its process group."""

    def __init__(self, *argv: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal's foreground process
            os.execv(sys.executable, [sys.executable, "-m", "jdist", *argv])
        self.output = b""

    def read_until(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.output:
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.text}"
            if select.select([self.fd], [], [], 0.1)[0]:
                try:
                    self.output += os.read(self.fd, 65536)
                except OSError:
                    break

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def wait(self, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while True:
            if select.select([self.fd], [], [], 0.1)[0]:
                try:
                    self.output += os.read(self.fd, 65536)
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                raise AssertionError(f"jdist run did not exit:\n{self.text}")

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")


LOOP = """import os, time, torch, torch.distributed as dist, jdist
rank = int(os.environ["RANK"])
try:
    for step in range(10**9):
        if rank == 0 or step < 30:
            dist.all_reduce(torch.ones(1))   # from step 30 on, rank 0 waits here for rank 1, which never comes
        else:
            time.sleep(0.01)
        jdist.log(step=step, loss=1.0 / (step + 1))
        if step == 40:
            print("rank 1 is looping", flush=True)
finally:
    open(f"finally-{rank}", "w").close()
"""
STUBBORN = """import time
n = 0
while True:
    try:
        time.sleep(0.01); n += 1
        if n == 50: print("looping on", __import__("os").environ["RANK"], flush=True)
    except KeyboardInterrupt:
        print("ignoring Ctrl-C", flush=True)
"""


def test_ctrl_c_in_a_terminal_reaches_every_rank_and_a_second_one_ends_them(work):
    (work / "loop.py").write_text(LOOP)
    term = Terminal("run", "-n", "2", "--output", "all", "--watchdog", "0", "loop.py")
    term.read_until("rank 1 is looping")
    assert "ms/step" in term.text and "memory" in term.text  # the live panel on a terminal
    term.ctrl_c()
    assert term.wait() == 130, term.text
    assert (work / "finally-0").exists() and (work / "finally-1").exists()  # rank 0 too: it was in all_reduce
    assert "Interrupted: every rank received SIGINT and every rank stopped." in term.text
    entries = json.loads((list_runs(work / "runs")[0] / "errors.json").read_text())
    assert {e["kind"] for e in entries} == {"interrupted"} and gone([e["pid"] for e in entries])
    assert read_run(list_runs(work / "runs")[0]).status == "interrupted"

    # ranks that catch KeyboardInterrupt and go on: named with where they are after the grace period
    (work / "stubborn.py").write_text(STUBBORN)
    term = Terminal("run", "-n", "2", "--output", "all", "--no-live", "--interrupt-grace", "2", "stubborn.py")
    term.read_until("looping on 1")
    term.ctrl_c()
    assert term.wait() == 130, term.text
    assert "rank(s) 0, 1 did not stop within 2 s:" in term.text and "stubborn.py" in term.text, term.text
    entries = json.loads((list_runs(work / "runs")[0] / "errors.json").read_text())
    assert {e["kind"] for e in entries} == {"stuck"} and gone([e["pid"] for e in entries])
    # ... or ended at once by a second Ctrl-C
    term = Terminal("run", "-n", "2", "--output", "all", "stubborn.py")
    term.read_until("looping on 1")
    term.ctrl_c()
    term.read_until("ignoring Ctrl-C")
    term.ctrl_c()
    assert term.wait() == 130, term.text
    assert "SIGINT: ending the ranks" in term.text
    run = read_run(list_runs(work / "runs")[0])
    assert run.status == "interrupted" and run.error == "terminated by SIGINT"
    wait_for(lambda: not _engines_of(term.pid), timeout=30, what="the ranks of the stopped run to end")


def _engines_of(pid: int) -> list[int]:
    """Processes left from the jdist run with this PID (its cluster id names it)."""
    import psutil

    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if f"jdist-{pid}-" in cmd:
            left.append(proc.info["pid"])
    return left


def test_the_parser_is_the_option_tables():
    """Every %%distributed option jdist run honours, with the same flags (the others: tests/test_options.py)."""
    from jdist.cli import SCRIPT
    from jdist.plugins import option_table

    run = parser()._subparsers._group_actions[0].choices["run"]
    flags = {f for action in run._actions for f in action.option_strings}
    for opt in option_table().honoured(SCRIPT):
        assert set(opt.flags) <= flags, opt.name
    assert title_of("# $ jdist run -n 2 t.py\nx") == "jdist run -n 2 t.py"
    assert main(["runs", "--run-dir", "/nonexistent/runs"]) == 0


SLOW = """import time, jdist
for step in range(100000):
    jdist.log(step=step, loss=1.0 / (step + 1))
    time.sleep(0.05)
"""


def test_clusters_watch_and_stop_from_another_terminal(work, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(work / "runtime"))
    (work / "slow.py").write_text(SLOW)
    run = subprocess.Popen([*JDIST, "run", "-n", "2", "slow.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        def listed() -> dict | None:
            out = jdist("clusters", "--json").stdout.splitlines()
            return json.loads(out[0]) if out else None

        cluster = wait_for(listed, timeout=120, what="the run's cluster in jdist clusters")
        assert cluster["owner"] == f"jdist run (pid {run.pid})" and cluster["ranks"] == 2
        wait_for(lambda: list_runs(work / "runs") and read_run(list_runs(work / "runs")[0]).count() > 10,
                 what="records in the run log")
        # the JupyterLab sidebar's view of it (the server extension's manager, on the same files)
        from jdist.server.manager import JdistManager

        manager = JdistManager([work / "runtime"], run_dir=work / "runs")
        try:
            runs = asyncio.run(manager.runs())  # (the sidebar polls both; a cluster's run is one it follows)
            (model,) = asyncio.run(manager.clusters())
        finally:
            manager.close()
        assert model["cluster_id"] == cluster["cluster_id"] and model["kernel_id"] is None
        assert model["status"] == "running" and {r["state"] for r in model["ranks"]} == {"busy"}
        assert model["current_run"] == runs[0]["run_id"] and runs[0]["status"] == "running"
        watch = subprocess.Popen([*JDIST, "watch", "--no-live", "--every", "0.2"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        lines: list[str] = []

        def a_status_line() -> bool:  # the watcher follows the run while it goes on (it flushes each line)
            if select.select([watch.stdout], [], [], 0.1)[0]:
                lines.append(watch.stdout.readline())
            return any(line.startswith("[jdist] step ") for line in lines)

        wait_for(a_status_line, timeout=60, what="a status line of jdist watch")
        stopped = jdist("stop", cluster["cluster_id"][:12])
        assert stopped.returncode == 0 and f"Stopped {cluster['cluster_id']}" in stopped.stdout, stopped.stderr
        assert run.wait(30) == 128 + signal.SIGTERM
        out, _ = watch.communicate(timeout=30)
        assert watch.returncode == 1 and "interrupted" in out, "".join(lines) + out
        (path,) = list_runs(work / "runs")
        done = read_run(path)
        assert done.status == "interrupted" and done.error == "terminated by SIGTERM"
        assert jdist("clusters").stdout.strip() == "No jdist clusters are running."
        wait_for(lambda: not _engines_of(run.pid), timeout=30, what="no process of the stopped run left")
    finally:
        run.kill()


KEEP = """import os, torch, jdist
model = torch.nn.Linear(4, 1)
steps_done = 0
for step in range(5):
    jdist.log(step=step, loss=1.0)
    steps_done += 1
secret = int(os.environ["RANK"]) * 10 + 7
"""


def test_keep_leaves_the_ranks_for_a_notebook_to_attach(work, kernel, kernel_env):
    """jdist run --keep, then %dist attach from a real kernel: the script's globals on the same ranks,
    a working process group, and the ranks the kernel's from then on (they end with %dist stop)."""
    (work / "keep.py").write_text(KEEP)
    runs = Path(kernel_env["JDIST_RUN_DIR"])
    env = dict(os.environ, JDIST_RUN_DIR=str(runs))
    assert "No run 'nosuchrun' offers its ranks" in kernel.run("%dist attach nosuchrun", allow_error=True).shown
    proc = subprocess.Popen([*JDIST, "run", "-n", "2", "--keep", "5", "keep.py"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        offered = wait_for(lambda: next((p for p in list_runs(runs) if (p / "attach.json").exists()), None),
                           timeout=120, what="the run's offer")
        out = kernel.run(f"%dist attach {offered.name[:15]}")
        assert "Attached 2 rank(s), backend ddp" in out.stdout
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and f"%dist attach {offered.name}" in err and "attached by the kernel" in err
        assert not (offered / "attach.json").exists()
        # the controller watches its owner (the CLI, gone now): it must have taken the kernel as its owner
        time.sleep(2 * OWNER_POLL_S)
        out = kernel.run("%%distributed --output all\nprint(secret, steps_done)")
        assert sorted(out.stdout.splitlines()) == ["[rank 0] 7 5", "[rank 1] 17 5"]
        out = kernel.run("%%distributed\nimport torch.distributed as dist\nx = torch.ones(1)\ndist.all_reduce(x)\n"
                         "print(int(x.item()))")
        assert out.stdout.strip() == "2"
        status = kernel.run("%dist status").stdout
        pids = [int(line.split()[2]) for line in status.splitlines()[2:]]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)  # the CLI is gone, the ranks stay
        kernel.run("%dist stop")
        wait_for(lambda: gone(pids), timeout=30, what="the attached ranks to end with %dist stop")
    finally:
        proc.kill()


def test_keep_without_attach_stops_the_ranks_after_its_time(work):
    out = jdist("run", "-n", "2", "--keep", "0.02", "train.py", "--steps", "2")
    assert out.returncode == 0, out.stderr
    assert "%dist attach" in out.stderr and "not attached within 0.02 min: stopping the ranks" in out.stderr
    assert not (only_run(work) / "attach.json").exists()


def test_a_run_that_ended_exits_even_when_its_clean_up_does_not():
    # the guard of jdist run's end (a stop that does not return: stop_within's doctest); here, a thread
    # that is not a daemon keeps the interpreter from exiting: the process still ends, with its code and a line
    code = ("import threading, time\nfrom jdist.cli.run import exit_within\n"
            "threading.Thread(target=time.sleep, args=(600,)).start()\nexit_within(0.5, 137, print)\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 137 and time.monotonic() - t0 < 30, out
    assert out.stdout == "exiting took over 0.5 s (a clean-up did not end): exiting now\n", out.stdout


ELASTIC = """import os, signal, torch, torch.distributed as dist, jdist
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "-1"))
rank, world = dist.get_rank(), dist.get_world_size()
ckpt = "state.pt"
step = torch.load(ckpt)["step"] if os.path.exists(ckpt) else 0   # the script's own checkpoint
print(f"attempt {attempt} rank {rank} world {world} from step {step}", flush=True)
while step < 12:
    t = torch.ones(1); dist.all_reduce(t); step += 1
    jdist.log(step=step, loss=float(t))
    if rank == 0:
        torch.save({"step": step}, ckpt + ".tmp"); os.replace(ckpt + ".tmp", ckpt)
    dist.barrier()
    if attempt == 0 and step == 5 and rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
print(f"done rank {rank} world {world} step {step} sum {float(t)}", flush=True)
"""


def test_jdist_run_elastic_restarts_the_script_on_the_ranks_left_as_torchrun_does(work):
    (work / "elastic.py").write_text(ELASTIC)
    out = jdist("run", "-n", "3", "--elastic", "2:3", "--no-live", "elastic.py")
    assert out.returncode == 0, out.stderr
    assert "attempt 0 rank 0 world 3 from step 0" in out.stdout, out.stdout  # (rank 0's output, as by default)
    assert ("rank 2 is lost: restarting the script on 2 rank(s) (--elastic 2:3, restart 1 of at most 3; "
            "TORCHELASTIC_RESTART_COUNT=1)") in out.stderr, out.stderr
    assert "rank 2 died: killed by SIGKILL" in out.stderr, out.stderr  # (the attempt's error, said first)
    assert "attempt 1 rank 0 world 2 from step 5" in out.stdout, out.stdout  # its own checkpoint
    assert "done rank 0 world 2 step 12 sum 2.0" in out.stdout, out.stdout  # (the all-reduce of 2 ranks)
    # (fewer than MIN left ends the run with the death's code: after_loss's None, tests/test_elastic.py)
