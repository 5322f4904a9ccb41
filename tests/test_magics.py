"""The magics: argument parsing (unit) and their behaviour in a real kernel with a real cluster."""

from __future__ import annotations

import os
import socket

import pytest
from conftest import strip_ansi
from IPython.core.error import UsageError

from jdist.kernel.magics import DistributedMagics, parse_line, parse_targets
from jdist.kernel.probes import visible_gpus


@pytest.mark.parametrize("text,ranks", [(None, None), ("all", None), ("0", [0]), ("0,2", [0, 2]), ("1-3", [1, 2, 3]), ("3, 1,1", [1, 3])])
def test_parse_targets(text, ranks):
    assert parse_targets(text) == ranks


@pytest.mark.parametrize("text", ["x", "1-", "3-1", "-1", "0;1"])
def test_parse_targets_rejects_with_example(text):
    with pytest.raises(UsageError, match="--targets 0,2"):
        parse_targets(text)


def test_option_values_are_split_as_a_shell_splits_them(tmp_path):
    # IPython's parse_argstring kept the quotes: srun got '"-p gpu -A proj -t 60"' as one argument and failed
    from jdist.kernel.launch.remote import SlurmLauncher
    from jdist.plugins import option_table

    args = parse_line(DistributedMagics.distributed, '--slurm "-p gpu -A proj -t 60" -N 2 -n 4')
    assert (args.slurm, args.nodes, args.n) == ("-p gpu -A proj -t 60", 2, 4)
    config = option_table().config({"n": 4, "nodes": 2, "slurm": args.slurm, "launcher": "slurm"})
    assert SlurmLauncher(config, tmp_path).mpi_cmd()[-8:] == ["-N", "2", "-p", "gpu", "-A", "proj", "-t", "60"]
    assert parse_line(DistributedMagics.distributed, "--slurm='-t 1' -n 2").slurm == "-t 1"
    assert parse_line(DistributedMagics.dist, 'pull "x"').name == "x"
    with pytest.raises(UsageError, match=r"No closing quotation; close the quotes around an option's value"):
        parse_line(DistributedMagics.distributed, '--slurm "-t 1 -n 2')


def test_no_cluster_errors_say_how_to_start(kernel):
    out = kernel.run("%%distributed\nx = 1", allow_error=True)
    assert out.error["ename"] == "UsageError"  # the reply is an error: "Run all" stops here
    assert "No cluster is running: start one with %%distributed -n 2" in out.shown
    out = kernel.run("%dist status", allow_error=True)
    assert "%%distributed -n 2" in out.shown
    assert "No jdist cluster is running." in kernel.run("%dist stop").stdout


@pytest.mark.skipif(visible_gpus() >= 2, reason="this machine has GPUs")
def test_gpus_without_gpus_names_the_cpu_alternative(kernel):
    out = kernel.run("%%distributed --gpus 2\nx = 1", allow_error=True)
    assert "--gpus 2 asks for 2 GPUs" in out.shown and "Use -n 2 to run 2 CPU ranks" in out.shown
    assert len(out.shown.splitlines()) == 1, "one clear line, no internal traceback"


def test_bad_options_are_one_line_errors(kernel):
    for line, expect in [
        ("-n 0", "at least 1"),
        ("-n 2 --backend nope", "Unknown backend 'nope'"),
        ("-n 2 --gpus 2", "not both"),
        ("-n 2 --output loud", "invalid choice"),
        ("-n 2 --precision fp8", "invalid choice"),
    ]:
        out = kernel.run(f"%%distributed {line}\nx = 1", allow_error=True)
        assert expect in out.shown, (line, out.shown)
        assert len(out.shown.splitlines()) <= 2 and out.error["ename"] == "UsageError"


def test_help_is_real(kernel):
    out = kernel.run("%%distributed?")
    text = strip_ansi(out.pager)
    for word in ["--gpus", "--targets", "--backend", "--output", "--launcher", "rank", "Example"]:
        assert word in text
    # each option says whether changing it needs a restart (jdist.options scopes)
    assert "Changing it needs --restart" in text and "Changes the running cluster without a restart" in text
    text = strip_ansi(kernel.run("%dist?").pager)
    for word in ["status", "pull NAME", "push NAME", "restart", "--rank"]:
        assert word in text


def test_targets_output_status_pull_push(cluster_kernel):
    out = cluster_kernel.run("%%distributed --targets 1\nonly = 'one'\nprint('ran on', rank)")
    assert out.stdout.strip() == "ran on 1"  # the lowest selected rank streams
    out = cluster_kernel.run("%dist pull only --rank 1")
    assert cluster_kernel.value("only") == "one"
    out = cluster_kernel.run("%%distributed --targets 7\nx = 1", allow_error=True)
    assert "No rank 7" in out.shown and "0..1" in out.shown

    out = cluster_kernel.run("%%distributed --output none\nprint('quiet')")
    assert "quiet" not in out.stdout

    status = cluster_kernel.run("%dist status").stdout
    assert "2 CPU rank(s), backend ddp" in status
    assert status.count("idle") == 2 and "cpu" in status

    cluster_kernel.run("payload = {'lr': 0.1}\n%dist push payload")
    out = cluster_kernel.run("%%distributed --output all\nprint(payload['lr'] * (rank + 1))")
    assert "[rank 0] 0.1" in out.stdout and "[rank 1] 0.2" in out.stdout


def test_pull_errors_name_the_fix(cluster_kernel):
    out = cluster_kernel.run("%dist pull does_not_exist", allow_error=True)
    assert "'does_not_exist' is not defined" in out.shown and "%%distributed cell first" in out.shown
    cluster_kernel.run("%%distributed\nimport threading\nlock = threading.Lock()")
    out = cluster_kernel.run("%dist pull lock", allow_error=True)
    assert "could not be sent back" in out.shown
    out = cluster_kernel.run("%dist push", allow_error=True)
    assert "needs a variable name" in out.shown


def test_conflicting_options_need_restart(cluster_kernel):
    out = cluster_kernel.run("%%distributed -n 3\nx = 1", allow_error=True)
    assert "-n 3 (running: -n 2)" in out.shown and "--restart" in out.shown
    # same options as running: reused, no restart
    out = cluster_kernel.run("%%distributed -n 2 --backend ddp\nprint('reused')")
    assert "Starting" not in out.stdout and "reused" in out.stdout


def test_precision_changes_without_restart_and_applies_to_prepared_models(cluster_kernel):
    cluster_kernel.run("%%distributed\nimport torch\nlin = jdist.prepare(torch.nn.Linear(4, 4))\nkept = 1")
    out = cluster_kernel.run("%%distributed --precision bf16\n"
                             "seen = []\nlin.module.register_forward_hook(lambda m, a, o: seen.append(o.dtype))\n"
                             "print(lin(torch.ones(2, 4)).dtype, seen[0], kept)")
    assert "Precision is now bf16" in out.stdout and "Starting" not in out.stdout
    assert out.stdout.strip().endswith("torch.float32 torch.bfloat16 1")  # autocast inside, fp32 out, state kept
    assert "precision bf16" in cluster_kernel.run("%dist status").stdout
    out = cluster_kernel.run("%%distributed --precision fp32\nprint(lin(torch.ones(2, 4)).dtype)")
    assert out.stdout.strip().endswith("torch.float32")


def test_restart_replays_setup_cells_and_fresh_loses_state(cluster_kernel):
    cluster_kernel.run("%%distributed\nbefore_restart = rank + 1")
    out = cluster_kernel.run("%dist restart")
    assert "Ready: 2 rank(s), backend ddp" in out.stdout and "set-up cell(s)" in out.stdout
    assert "jdist.checkpoint_every was not used, so training progress is lost" in out.stdout
    out = cluster_kernel.run("%%distributed\nprint(before_restart, world_size)")
    assert out.stdout.strip() == "1 2"
    out = cluster_kernel.run("%dist restart --fresh")
    assert "variables on the ranks are lost (--fresh)" in out.stdout
    out = cluster_kernel.run("%%distributed\nprint('before_restart' in globals(), world_size)")
    assert out.stdout.strip() == "False 2"
    assert "process-group timeout 30 s" in cluster_kernel.run("%dist status").stdout  # kept, not reset to 60
    # (a cell's --restart, which keeps every option too: the next test)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_cluster_changes_live_options_and_restarts_keeping_every_option(cluster_kernel):
    """Two bugs of the option handling, fixed by defining each option once with its scope:
    a --port cluster could not change --precision/--watchdog/--auto-restart nor take --restart
    (its own rank 0 holds the port, and the port was probed again), and --threads was silently
    ignored on a running cluster and dropped by --restart."""
    port = _free_port()
    threads = max(1, (os.cpu_count() or 1) // 2) + 1  # not the default for 2 ranks on this machine
    out = cluster_kernel.run(f"%%distributed --restart --port {port}\nprint(world_size)")
    assert out.stdout.strip().endswith("2")
    out = cluster_kernel.run(f"%%distributed --precision bf16 --watchdog 5 --auto-restart --threads {threads}\n"
                             "import torch\nprint(torch.get_num_threads())")
    assert "Starting" not in out.stdout and "Precision is now bf16" in out.stdout
    assert out.stdout.strip().endswith(str(threads))
    config = "(lambda c: (c.port, c.precision, c.watchdog, c.auto_restart, c.threads, c.timeout))(jdist.kernel.cluster.current().config)"
    assert cluster_kernel.value(config) == (port, "bf16", 5.0, True, threads, 30.0)
    out = cluster_kernel.run("%%distributed --restart\nimport torch\nprint(world_size, torch.get_num_threads(), jdist.precision())")
    assert "Ready: 2 rank(s)" in out.stdout and out.stdout.strip().endswith(f"2 {threads} bf16")
    assert cluster_kernel.value(config) == (port, "bf16", 5.0, True, threads, 30.0)  # every option kept
    out = cluster_kernel.run("%%distributed --precision fp32\nprint(jdist.precision())")
    assert out.stdout.strip().endswith("fp32") and cluster_kernel.value(config)[0] == port


def test_stop_is_quiet_and_ends_the_rank_processes(cluster_kernel):
    import os
    import time

    cluster_kernel.run("%%distributed\nimport os; my_pid = os.getpid()")
    cluster_kernel.run("%dist pull my_pid")
    pids = cluster_kernel.value("my_pid")
    out = cluster_kernel.run("%dist stop")
    assert out.stdout == "Cluster stopped.\n" and out.stderr == ""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
