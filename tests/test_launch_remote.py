"""The remote launchers' parts that need no second host (jdist.kernel.launch.remote): the shell
around each engine, deaths read from the launcher's output, and the checks before anything starts.
The launchers themselves, on two hosts with real ssh and Slurm: tests/test_multinode.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from jdist.common.last_words import from_output, split_report
from jdist.common.stacks import crash_lines
from jdist.errors import ClusterError
from jdist.kernel.launch.remote import REMOTE_WRAPPER, SlurmLauncher, SSHLauncher
from jdist.plugins import option_table


def config(**values):
    return option_table().config(values)


def wrapped(tmp_path: Path, code: str, rank: int = 3) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PMI_RANK": str(rank), "TMPDIR": str(tmp_path)}
    return subprocess.run(["/bin/sh", "-c", REMOTE_WRAPPER, "jdist-rank", sys.executable, "-c", code],
                          capture_output=True, text=True, env=env, timeout=30)


def test_the_shell_reports_the_exit_status_and_removes_the_noted_segments_after_a_sigkill(tmp_path):
    segment = tmp_path / "mpich_shm_test_0"
    segment.write_text("x")
    code = ("import os, signal; open(os.environ['JDIST_SHM_NOTE'], 'w').write(%r + '\\n'); "
            "os.kill(os.getpid(), signal.SIGKILL)" % str(segment))
    out = wrapped(tmp_path, code)
    assert out.returncode == 137
    assert out.stdout.strip().splitlines()[-1] == "jdist-rank-exit 3 137"
    assert not segment.exists() and not list(tmp_path.glob("jdist-shm-*"))


def rank_in_shell(tmp_path: Path, segment: Path, files: str) -> subprocess.Popen:
    """A stand-in rank in the remote shell, in a session of its own: it notes ``segment`` for the shell, runs
    ``files`` (code that writes its stderr files), says "noted" and waits."""
    segment.write_text("x")
    code = (f"import os, time; open(os.environ['JDIST_SHM_NOTE'], 'w').write({str(segment)!r} + '\\n')\n{files}\n"
            "print('noted', flush=True); time.sleep(60)")
    env = {"PATH": "/usr/bin:/bin", "PMI_RANK": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(["/bin/sh", "-c", REMOTE_WRAPPER, "jdist-rank", sys.executable, "-c", code],
                            stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    assert proc.stdout.readline().strip() == "noted"
    return proc


def test_what_a_step_killed_with_its_watcher_left_is_removed_by_the_next_rank_on_the_host(tmp_path):
    # Slurm ends a step whole with SIGKILL (scancel --signal=KILL, past KillWait at a time limit): every process of
    # the step, the watcher too, so the killed rank's segment and stderr files stay until a rank starts here again
    import os
    import platform
    import signal

    segment = tmp_path / "mpich_shm_test_2"
    proc = rank_in_shell(tmp_path, segment, "e = os.environ['JDIST_STDERR_FILE']\n"
                                            "for suffix in ('', '.pos'):\n    open(e + suffix, 'w').write('0')")
    shell = psutil.Process(proc.pid)
    step = [shell, *shell.children(recursive=True)]
    for sig in (signal.SIGSTOP, signal.SIGKILL):  # the whole step at once (stopped first: none sees another end)
        for p in step:
            p.send_signal(sig)
    proc.wait(5)
    host = platform.node()
    left = sorted(p.name for p in tmp_path.glob("jdist-*"))
    assert left == [f"jdist-shm-{host}-{proc.pid}", f"jdist-stderr-{host}-{proc.pid}",
                    f"jdist-stderr-{host}-{proc.pid}.pos"] and segment.exists(), left
    # not touched: a running shell's files (this process stands in for it), another host's, another program's
    alive = tmp_path / f"jdist-shm-{host}-{os.getpid()}"
    kept = [alive, tmp_path / f"jdist-stderr-{host}-x-{proc.pid}", tmp_path / f"jdist-shm-other{host}-{proc.pid}",
            tmp_path / "jdist-stderr-other"]
    held = tmp_path / "mpich_shm_held_0"
    held.write_text("x")
    alive.write_text(f"{held}\n")
    for path in kept[1:]:
        path.write_text(f"{held}\n")
    out = wrapped(tmp_path, "pass")
    assert out.returncode == 0 and out.stdout.strip() == "jdist-rank-exit 3 0", out
    assert not segment.exists() and held.exists()
    assert sorted(tmp_path.glob("jdist-*")) == sorted(kept)


def test_the_shell_prints_what_the_rank_had_not_forwarded_before_the_exit_line_and_removes_its_file(tmp_path):
    # the rank's fd 2 goes to a file of its host (jdist/rank/stderr.py); what was not forwarded when it died
    # comes back in the launcher's output, each line marked with the rank
    code = ("import os, types; from jdist.rank import stderr; got = []\n"
            "s = types.SimpleNamespace(_should_watch=True, write=got.append, flush=lambda: None)\n"
            "assert stderr.capture(stream=s); os.write(2, b'sent\\n'); s.flush(); assert got == ['sent\\n']\n"
            "import faulthandler; faulthandler.enable(file=2)  # as the guard does when fd 2 is the file\n"
            "os.write(2, b'terminate called after throwing an instance of X\\n  what():  boom\\n'); os.abort()")
    out = wrapped(tmp_path, code)
    assert out.returncode == 134, out
    lines = out.stdout.splitlines()
    assert lines[-1] == "jdist-rank-exit 3 134" and all(line.startswith("jdist-rank-stderr 3") for line in lines[:-1])
    assert lines[:3] == ["jdist-rank-stderr 3 terminate called after throwing an instance of X",
                         "jdist-rank-stderr 3   what():  boom", "jdist-rank-stderr 3 Fatal Python error: Aborted"], out
    words, report = split_report(from_output(out.stdout)[3])
    assert words == "terminate called after throwing an instance of X\n  what():  boom"
    assert crash_lines(3, report)[0] == "Rank 3 crashed (Fatal Python error: Aborted) here, innermost call last:"
    assert not list(tmp_path.glob("jdist-stderr-*"))


def test_each_remote_rank_has_its_own_last_words_and_crash_report(tmp_path):
    # two ranks crashed (each shell printed its rank's lines); before, their reports shared the output
    report = "Fatal Python error: Segmentation fault\n\nStack (most recent call first):\n  File \"/x/{f}.py\", line 1 in f\n"
    text = "".join(f"jdist-rank-stderr {rank} {line}\n" for rank, words in ((1, "one"), (0, "zero"))
                   for line in [f"{words} said", *report.format(f=words).splitlines()])
    launcher, proc = launcher_with_output(tmp_path, (text + "jdist-rank-exit 1 139\njdist-rank-exit 0 139\n").encode())
    try:
        reports = launcher.crash_reports()
        assert sorted(reports) == [0, 1] and "/x/one.py" in reports[1] and "/x/zero.py" in reports[0]
        assert launcher.last_words(1) == "one said" and launcher.last_words(0) == "zero said"
        death = launcher.death([1], wait=0.2)
        assert death.last_words == "one said" and "/x/one.py" in death.crash and "zero" not in death.crash
    finally:
        proc.kill()
        proc.wait()


def test_the_shell_reports_a_normal_exit(tmp_path):
    out = wrapped(tmp_path, "raise SystemExit(3)", rank=0)
    assert out.returncode == 3 and "jdist-rank-exit 0 3" in out.stdout


def launcher_with_output(tmp_path: Path, text: bytes, slurm: bool = False) -> tuple[SSHLauncher, subprocess.Popen]:
    if slurm:
        launcher = SlurmLauncher(config(n=2, slurm="", launcher="slurm"), tmp_path)
    else:
        launcher = SSHLauncher(config(n=2, hosts="a:1,b:1", launcher="ssh"), tmp_path)
    out = tmp_path / "launcher.out"
    out.write_bytes(text)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine_set = SimpleNamespace(output_file=str(out), process=psutil.Process(proc.pid), state="running",
                                 signal=lambda sig: proc.send_signal(sig))
    launcher.ipp = SimpleNamespace(engines={"x": engine_set})
    launcher.watch([{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}])  # type: ignore[list-item]
    return launcher, proc


CANCELLED = "slurmstepd-a: error: *** STEP 7.0 ON a CANCELLED AT 2026-11-29T02:39:01{why} ***\n"


@pytest.mark.parametrize("output,cause", [
    # the time limit: slurmstepd's line, then the ranks' SIGTERM
    (CANCELLED.format(why=" DUE TO TIME LIMIT") + "jdist-rank-exit 0 143\njdist-rank-exit 1 143\n",
     "killed by SIGTERM (Terminated): Slurm ended the job step (STEP 7.0 ON a CANCELLED AT 2026-11-29T02:39:01 DUE TO "
     'TIME LIMIT; ask for more time: --slurm "-t MINUTES", or a longer allocation)'),
    # a rank died: srun (--kill-on-bad-exit) cancels its step after, and slurmstepd says CANCELLED then too
    ("jdist-rank-exit 1 137\nsrun: error: b: task 1: Exited with exit code 137\n" + CANCELLED.format(why="")
     + "jdist-rank-exit 0 143\n", "killed by SIGKILL (kill -9, or the out-of-memory killer) on host b"),
    # scancel --signal=KILL: every process of the step, the shells too (no exit line), slurmstepd's line not relayed
    ("srun: error: a: tasks 0-1: Killed\nsrun: Force Terminated StepId=7.0\n",
     'Slurm ended the job step 7.0 (srun: "Force Terminated": it was cancelled, reached its time limit or lost a node)'),
])
def test_a_slurm_death_says_what_slurm_said_when_slurm_ended_the_step(tmp_path, output, cause):
    launcher, proc = launcher_with_output(tmp_path, output.encode(), slurm=True)
    proc.kill()
    proc.wait()
    dead = launcher.deaths()
    assert launcher.death(dead, wait=0.2).cause == cause


def test_deaths_come_from_exit_lines_then_from_the_launcher_ending(tmp_path):
    launcher, proc = launcher_with_output(tmp_path, b"hello from rank 0\njdist-rank-exit 1 137\njdist-rank-exit 0 1")
    try:
        assert launcher.deaths() == [1]  # rank 0's line is not complete yet
        with open(tmp_path / "launcher.out", "ab") as f:
            f.write(b"43\n")
        assert launcher.deaths() == [1, 0]
        report = launcher.death([1], wait=0.2)  # the launcher still runs: it is told to end the job
        assert report.rank == 1 and report.cause == "killed by SIGKILL (kill -9, or the out-of-memory killer) on host b"
        proc.wait(5)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("lines, crashed", [(b"jdist-rank-exit 1 139\njdist-rank-exit 0 137\n", True),
                                             (b"jdist-rank-exit 1 3\njdist-rank-exit 0 139\n", False),
                                             (b"no exit line yet\n", False)])
def test_a_crash_is_the_first_exit_line_with_a_crash_signal(tmp_path, lines, crashed):
    """A rank whose exit line says SIGSEGV (139) first crashed (the start tries once more); the others were ended
    after it (hydra, srun), and a rank that exited with a code did not crash."""
    launcher, proc = launcher_with_output(tmp_path, lines)
    try:
        assert launcher.crashed() is crashed
    finally:
        proc.kill()
        proc.wait()


def test_a_launch_that_ended_early_names_the_first_rank_that_ended_and_how(tmp_path):
    launcher, proc = launcher_with_output(tmp_path, b"Fatal Python error: Segmentation fault\n"
                                                    b"jdist-rank-exit 1 139\njdist-rank-exit 0 143\n")
    assert launcher.exited_early("during its set-up") is None  # hydra still runs
    proc.kill()
    proc.wait()
    text = launcher.exited_early("during its set-up")
    assert text.splitlines()[:2] == ["rank 1 was killed by SIGSEGV (Segmentation fault) during its set-up",
                                     "Fatal Python error: Segmentation fault"], text


def test_a_launcher_that_ended_means_every_rank_ended(tmp_path):
    launcher, proc = launcher_with_output(tmp_path, b"")
    proc.kill()
    proc.wait()
    assert launcher.deaths() == [0, 1]
    assert "went away" in launcher.death([0], wait=0.1).cause


def test_no_slurm_is_one_line_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    launcher = SlurmLauncher(config(n=2, slurm="", launcher="slurm"), tmp_path)
    with pytest.raises(ClusterError, match=r"--slurm: srun is not on PATH here; run the kernel on a Slurm login node"):
        launcher.probe()


@pytest.mark.parametrize("extra, says", [
    (dict(ip="198.18.99.99"), "--ip 198.18.99.99 is not an address of this machine"),
    (dict(iface="nosuch0"), "--iface nosuch0: no such interface"),
])
def test_the_address_options_are_checked_against_this_machine(tmp_path, extra, says):
    launcher = SSHLauncher(config(n=2, hosts="a:1,b:1", launcher="ssh", **extra), tmp_path)
    with pytest.raises(ClusterError, match=says):
        launcher.choose_address()


def test_a_host_on_this_machine_needs_no_ssh(tmp_path):
    launcher = SSHLauncher(config(n=2, hosts="localhost:2", launcher="ssh"), tmp_path)
    assert launcher.choose_address() == "127.0.0.1" and not launcher.spans_other_hosts()


def answers(**hosts: str):
    """What each host's check prints (the hosts and their GPUs cannot exist here: stand-ins)."""
    def run(host: str, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 0, stdout=hosts[host], stderr="")
    return run


def test_host_checks_name_each_problem_in_one_line(tmp_path):
    launcher = SSHLauncher(config(n=4, gpus=True, hosts="a:2,b:2", launcher="ssh"), tmp_path)
    ok = "missing=\nshared=True\ngpus=2\n"
    launcher.check_hosts(["a", "b"], answers(a=ok, b=ok), {"a": 2, "b": 2})
    with pytest.raises(ClusterError) as err:
        launcher.check_hosts(["a", "b"], answers(a="missing=\nshared=True\ngpus=1\n",
                                                 b="missing=mpi4py\nshared=True\n"), {"a": 2, "b": 2})
    text = str(err.value)
    assert "host a has 1 visible CUDA GPU(s) for its 2 rank(s) of --gpus" in text
    assert "host b: " in text and "lacks mpi4py" in text and "\n" not in text
    with pytest.raises(ClusterError, match="host b does not see .*: the hosts must share the home"):
        launcher.check_hosts(["b"], answers(b="missing=\nshared=False\ngpus=2\n"), {"b": 2})


def test_a_host_without_this_python_is_named_with_the_fix(tmp_path):
    launcher = SSHLauncher(config(n=2, hosts="a:1,b:1", launcher="ssh"), tmp_path)

    def run(host: str, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 127, stdout="", stderr=f"sh: 1: {argv[0]}: not found\n")

    with pytest.raises(ClusterError, match=rf"host a has no {sys.executable}: install the same environment at the "
                                           r"same path on every host"):
        launcher.check_hosts(["a"], run)


def test_segments_are_removed_when_the_launcher_kills_the_whole_process_group(tmp_path):
    # hydra ends the survivors of a dead rank with SIGKILL to their process group, shell included
    import os
    import signal
    import time

    segment = tmp_path / "mpich_shm_test_1"
    proc = rank_in_shell(tmp_path, segment, "open(os.environ['JDIST_STDERR_FILE'], 'w').close()")
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        deadline = time.monotonic() + 5
        while (segment.exists() or list(tmp_path.glob("jdist-stderr-*"))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not segment.exists() and not list(tmp_path.glob("jdist-stderr-*"))  # the rank's stderr file too
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_shell_around_a_rank_says_oom_when_its_hosts_oom_kill_count_rose_while_it_ran(tmp_path):
    """The real shell text (REMOTE_WRAPPER) around a process that SIGKILLs itself, with /proc/vmstat's count read
    through a ``sed`` on PATH that counts up once, as the kernel's does when its OOM killer acts; then the death
    report of such an exit line."""
    import os
    import shutil
    import stat

    from jdist.kernel.launch.remote import EXIT_LINE, REMOTE_WRAPPER

    real = shutil.which("sed")
    sed = tmp_path / "sed"  # of /proc/vmstat, the first read (at the start) says 4, later ones 5
    sed.write_text(f'#!/bin/sh\ncase "$*" in *" /proc/vmstat") ;; *) exec {real} "$@";; esac\n'
                   f'if [ -f {tmp_path}/read ]; then echo 5; else touch {tmp_path}/read; echo 4; fi\n')
    sed.chmod(sed.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PMI_RANK": "1", "TMPDIR": str(tmp_path)}
    out = subprocess.run(["/bin/sh", "-c", REMOTE_WRAPPER, "jdist-rank", sys.executable, "-c",
                          "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                         env=env, capture_output=True, timeout=30)
    lines = [m.group(0).strip() for m in EXIT_LINE.finditer(out.stdout)]
    assert lines == [b"jdist-rank-exit 1 137 oom"], out
    again = subprocess.run(out.args, env=env, capture_output=True, timeout=30)  # the count stays at 5: no oom
    assert [m.group(0).strip() for m in EXIT_LINE.finditer(again.stdout)] == [b"jdist-rank-exit 1 137"], again
    launcher, proc = launcher_with_output(tmp_path, b"jdist-rank-exit 1 137 oom\n")
    try:
        report = launcher.death(launcher.deaths(), wait=0.2)
        assert report.oom and report.cause.startswith("killed by the out-of-memory killer (its host, or a memory "
                                                      "limit"), report
    finally:
        proc.kill()
        proc.wait()
