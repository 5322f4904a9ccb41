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
