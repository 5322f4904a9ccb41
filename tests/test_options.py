"""The %%distributed options (jdist.options): each defined once, with its scope. Pure tests; the
same rules on a real cluster: tests/test_magics.py."""

from __future__ import annotations

import argparse

import pytest

from jdist.options import CELL_OPTIONS, ClusterConfig, Scope, cluster_options, describe, parser_arguments, plan, requested


def parse(line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flags, kwargs in parser_arguments():
        parser.add_argument(*flags, **kwargs)
    return parser.parse_args(line.split())


def test_every_cluster_option_is_a_config_field_with_a_flag_help_and_scope():
    names = [o.name for o in cluster_options()]
    assert names == [f for f in ClusterConfig.__dataclass_fields__]
    for opt in (*cluster_options(), *CELL_OPTIONS):
        assert opt.flag.startswith("-") and opt.help and isinstance(opt.scope, Scope)
    assert {o.name for o in cluster_options() if o.scope is Scope.RESTART} == {"n", "gpus", "backend", "launcher", "hosts", "hostfile", "slurm", "nodes", "ip", "iface",
        "encrypt", "timeout", "port"}


def test_options_not_given_are_told_apart_from_defaults():
    assert requested(parse("")) == {}
    assert requested(parse("--gpus 2 --start-timeout 120")) == {"n": 2, "gpus": True, "start_timeout": 120.0}
    with pytest.raises(ValueError, match="not both"):
        requested(parse("-n 2 --gpus 2"))


def test_a_running_cluster_takes_live_options_and_refuses_restart_ones_with_the_fix():
    running = ClusterConfig(n=2, timeout=30, port=29500)
    p = plan(requested(parse("-n 2 --precision bf16 --watchdog 5 --auto-restart --threads 3 --start-timeout 9")),
             running, restart=False)
    assert p.action == "reuse"
    assert p.live == {"threads": 3, "precision": "bf16", "watchdog": 5.0, "auto_restart": True, "start_timeout": 9.0}
    assert p.config.port == 29500 and p.config.timeout == 30
    with pytest.raises(ValueError) as err:
        plan(requested(parse("-n 3 --timeout 60 --port 29501")), running, restart=False)
    assert str(err.value).startswith("A cluster is running with different options: -n 3 (running: -n 2); "
                                     "--timeout 60 (running: 30); --port 29501 (running: 29500). Add --restart")


def test_auto_restart_turns_on_and_off_on_a_running_cluster():
    running = ClusterConfig(n=2)
    on = plan(requested(parse("--auto-restart")), running, restart=False)
    assert on.live == {"auto_restart": True}
    off = plan(requested(parse("--auto-restart off")), on.config, restart=False)
    assert off.live == {"auto_restart": False} and off.config.auto_restart is False
    with pytest.raises(argparse.ArgumentError, match="invalid on or off value: 'maybe'"):
        parse("--auto-restart maybe")


def test_restart_keeps_every_option_it_is_not_given():
    running = ClusterConfig(n=2, backend="fsdp", timeout=30, port=29500, threads=3, precision="bf16", watchdog=5,
                            auto_restart=True, start_timeout=9)
    p = plan(requested(parse("--backend ddp")), running, restart=True)
    assert p.action == "restart"
    assert p.config == ClusterConfig(n=2, backend="ddp", timeout=30, port=29500, threads=3, precision="bf16",
                                     watchdog=5, auto_restart=True, start_timeout=9)
    assert plan(requested(parse("--gpus 4")), running, restart=True).config.gpus is True


def test_start_needs_a_rank_count_and_checks_values():
    with pytest.raises(ValueError, match=r"No cluster is running: start one with %%distributed -n 2"):
        plan({}, None, restart=False)
    for line, fix in [("-n 0", "at least 1"), ("-n 2 --watchdog -1", "--watchdog must be"),
                      ("-n 2 --port 80", "1024 to 65535"), ("-n 2 --threads 0", "--threads must be at least 1"),
                      ("-n 2 --backend nope", "Unknown backend 'nope'"), ("-n 2 --launcher nope", "Unknown launcher")]:
        with pytest.raises(ValueError, match=fix):
            plan(requested(parse(line)), None, restart=False)


def test_the_sidebar_lists_each_option_with_its_scope():
    rows = {r["flag"]: r for r in describe(vars(ClusterConfig(n=2, port=29500)) | {})}
    assert rows["--port"]["value"] == "29500" and rows["--port"]["scope"] == "restart"
    assert rows["--threads"]["value"] == "default" and rows["--threads"]["scope"] == "live"
    assert rows["--auto-restart"]["value"] == "no"


def parse_shlex(line: str) -> argparse.Namespace:
    import shlex

    parser = argparse.ArgumentParser(exit_on_error=False)
    for flags, kwargs in parser_arguments():
        parser.add_argument(*flags, **kwargs)
    return parser.parse_args(shlex.split(line))


def test_where_the_ranks_run_picks_the_launcher_and_the_rank_count():
    given = requested(parse("--hosts gpu1:4,gpu2:4"))
    assert (given["launcher"], given["n"], given["gpus"]) == ("ssh", 8, False)
    assert requested(parse("--hosts gpu1:4,gpu2:4 --gpus 8"))["gpus"] is True
    slurm = requested(parse_shlex('--slurm "-p gpu -A proj -t 60" -N 2 --gpus 8'))
    assert (slurm["launcher"], slurm["slurm"], slurm["nodes"], slurm["n"]) == ("slurm", "-p gpu -A proj -t 60", 2, 8)
    assert requested(parse("--slurm -N 2 -n 4"))["slurm"] == ""  # inside an allocation: srun as it is
    assert plan(requested(parse("--hosts a:1,b:1")), None, restart=False).config.launcher == "ssh"


def test_a_hostfile_gives_hosts_and_counts(tmp_path):
    f = tmp_path / "hosts.txt"
    f.write_text("# our boxes\ngpu1:2\n\ngpu2   # one rank\n")
    given = requested(parse(f"--hostfile {f}"))
    assert (given["n"], given["launcher"]) == (3, "ssh")
    with pytest.raises(ValueError, match=r"--hostfile .*nope.txt: No such file"):
        requested(parse(f"--hostfile {tmp_path / 'nope.txt'}"))


@pytest.mark.parametrize("config, says", [
    (dict(n=2, hosts="a:1", slurm=""), "Give one of --hosts and --slurm"),
    (dict(n=4, hosts="a:1,b:1", launcher="ssh"), "has room for 2 rank(s), but -n 4 asks for 4"),
    (dict(n=2, hosts="a:1,b:1"), "--hosts starts the ranks with --launcher ssh"),
    (dict(n=2, launcher="ssh"), "--launcher ssh needs the hosts"),
    (dict(n=2, nodes=2), "-N/--nodes is the node count of a Slurm job step"),
    (dict(n=2, slurm="", launcher="slurm", nodes=3), "-N 3: give 1 to 2 nodes for -n 2"),
    (dict(n=2, ip="10.0.0.1"), "--ip/--iface choose the network between hosts"),
    (dict(n=2, hosts="a:2", launcher="ssh", ip="gpu1"), "--ip 'gpu1' is not an IP address"),
    (dict(n=2, hosts="a:x", launcher="ssh"), "'a:x' is not host or host:N"),
])
def test_multi_node_options_are_checked_with_the_fix(config, says):
    with pytest.raises(ValueError) as err:
        ClusterConfig(**config).check()
    assert says in str(err.value)


def test_profiles_give_cluster_options_and_the_cell_wins(tmp_path, monkeypatch):
    from jdist.options import load_profile

    path = tmp_path / "jdist" / "clusters.toml"
    path.parent.mkdir()
    path.write_text('[boxes]\nhosts = "gpu1:4,gpu2:4"\niface = "ib0"\ntimeout = 120.0\n\n[bad]\nhostz = "x"\n')
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    assert load_profile("boxes") == {"hosts": "gpu1:4,gpu2:4", "iface": "ib0", "timeout": 120.0}
    given = requested(parse("--cluster boxes --timeout 30 -n 6"))
    assert (given["hosts"], given["iface"], given["timeout"], given["n"], given["launcher"]) == \
        ("gpu1:4,gpu2:4", "ib0", 30.0, 6, "ssh")
    with pytest.raises(ValueError, match=r"--cluster nope: no \[nope\] in .*clusters.toml; it has: boxes, bad"):
        load_profile("nope")
    with pytest.raises(ValueError, match=r"'hostz' in .* is not a cluster option; use: .*hosts"):
        load_profile("bad")
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"no profiles file .*clusters.toml; create it with a \[boxes\] table"):
        load_profile("boxes")
