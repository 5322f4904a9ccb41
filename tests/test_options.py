"""The %%distributed options (jdist.options) and their one table (jdist.plugins.option_table): each
option defined once, with its scope, by jdist or the plugin that owns it. Pure tests; the same rules
on a real cluster: tests/test_magics.py."""

from __future__ import annotations

import argparse
import shlex

import pytest

from jdist.options import CELL_OPTIONS, ClusterConfig, Option, OptionOwner, OptionTable, Scope, cluster_options
from jdist.plugins import option_table

TABLE = option_table()


def parse(line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flags, kwargs in TABLE.parser_arguments():
        parser.add_argument(*flags, **kwargs)
    return parser.parse_args(shlex.split(line))


def requested(line: str) -> dict:
    return TABLE.requested(parse(line))


def plan(given: dict, running: ClusterConfig | None, restart: bool):
    return TABLE.plan(given, running, restart)


def check(**values) -> None:
    TABLE.check(TABLE.config(values))


def test_every_option_has_a_flag_help_and_scope_and_jdists_own_are_config_fields():
    assert [o.name for o in cluster_options()] == [f for f in ClusterConfig.__dataclass_fields__ if f != "plugin"]
    for opt in (*TABLE.cluster, *TABLE.cell):
        assert opt.flag.startswith("-") and opt.help and isinstance(opt.scope, Scope)
    restart = {o.name for o in TABLE.cluster if o.scope is Scope.RESTART}
    assert restart == {"n", "gpus", "backend", "launcher", "encrypt", "timeout", "port",  # jdist's own
                       "hosts", "hostfile", "ip", "iface", "slurm", "nodes",  # the ssh and slurm launchers'
                       "k8s", "namespace", "image", "pod_python", "pod_cpu", "pod_memory", "node_selector",
                       "tolerations", "pull_secret", "ssh_user", "ssh_port", "k8s_runtime",
                       "training_runtime",  # the k8s launcher's
                       "framework"}  # the tf backend's
    assert {o.name for o in TABLE.cell} == {o.name for o in CELL_OPTIONS} | {"tensorboard", "mlflow"}
    # each plugin option has its owner: the launchers own theirs, the tracker sinks theirs
    owners = {name: sorted(f"{o.kind}:{o.name}" for o in owned) for name, owned in TABLE.owned.items()}
    k8s = {name: ["launcher:k8s"] for name in ("k8s", "namespace", "image", "pod_python", "pod_cpu", "pod_memory",
                                                "node_selector", "tolerations", "pull_secret", "ssh_user", "ssh_port",
                                                "k8s_runtime", "training_runtime")}
    assert owners == {"hosts": ["launcher:ssh"], "hostfile": ["launcher:ssh"], "slurm": ["launcher:slurm"],
                      "nodes": ["launcher:k8s", "launcher:slurm"], "ip": ["launcher:k8s", "launcher:slurm", "launcher:ssh"],
                      "iface": ["launcher:k8s", "launcher:slurm", "launcher:ssh"], **k8s, "tensorboard": ["sink:tensorboard"],
                      "mlflow": ["sink:mlflow"], "zero": ["backend:deepspeed"], "offload": ["backend:deepspeed"],
                      "framework": ["backend:tf"]}


def test_options_not_given_are_told_apart_from_defaults():
    assert requested("") == {}
    assert requested("--gpus 2 --start-timeout 120") == {"n": 2, "gpus": True, "start_timeout": 120.0}
    with pytest.raises(ValueError, match="not both"):
        requested("-n 2 --gpus 2")


def test_a_running_cluster_takes_live_options_and_refuses_restart_ones_with_the_fix():
    running = ClusterConfig(n=2, timeout=30, port=29500)
    p = plan(requested("-n 2 --precision bf16 --watchdog 5 --auto-restart --threads 3 --start-timeout 9"),
             running, restart=False)
    assert p.action == "reuse"
    assert p.live == {"threads": 3, "precision": "bf16", "watchdog": 5.0, "auto_restart": True, "start_timeout": 9.0}
    assert p.config.port == 29500 and p.config.timeout == 30
    # what the live changes print comes from their options' definitions; kernel-side ones print nothing
    assert TABLE.live_messages(p.live) == ["torch uses 3 thread(s) per rank now.",
                                           "Precision is now bf16 on all ranks (prepared models included)."]
    with pytest.raises(ValueError) as err:
        plan(requested("-n 3 --timeout 60 --port 29501"), running, restart=False)
    assert str(err.value).startswith("A cluster is running with different options: -n 3 (running: -n 2); "
                                     "--timeout 60 (running: 30); --port 29501 (running: 29500). Add --restart")


def test_a_launchers_option_on_a_running_cluster_needs_a_restart():
    running = TABLE.config(requested("--hosts a:1,b:1"))
    with pytest.raises(ValueError, match=r"--hosts a:2,b:2 \(running: a:1,b:1\)\. Add --restart"):
        plan(requested("--hosts a:2,b:2"), running, restart=False)
    assert plan(requested("--hosts a:1,b:1"), running, restart=False).action == "reuse"


def test_auto_restart_turns_on_and_off_on_a_running_cluster():
    running = ClusterConfig(n=2)
    on = plan(requested("--auto-restart"), running, restart=False)
    assert on.live == {"auto_restart": True}
    off = plan(requested("--auto-restart off"), on.config, restart=False)
    assert off.live == {"auto_restart": False} and off.config.auto_restart is False
    with pytest.raises(argparse.ArgumentError, match="invalid on or off value: 'maybe'"):
        parse("--auto-restart maybe")


def test_restart_keeps_every_option_it_is_not_given():
    running = ClusterConfig(n=2, backend="fsdp", timeout=30, port=29500, threads=3, precision="bf16", watchdog=5,
                            auto_restart=True, start_timeout=9)
    p = plan(requested("--backend ddp"), running, restart=True)
    assert p.action == "restart"
    assert p.config == ClusterConfig(n=2, backend="ddp", timeout=30, port=29500, threads=3, precision="bf16",
                                     watchdog=5, auto_restart=True, start_timeout=9)
    assert plan(requested("--gpus 4"), running, restart=True).config.gpus is True


def test_restart_on_another_backend_or_launcher_drops_the_options_of_the_old_one():
    running = ClusterConfig(n=2, backend="deepspeed", launcher="ssh", plugin={"zero": 3, "offload": "all",
                                                                              "hosts": "a:1,b:1"})
    p = plan(requested("--backend ddp"), running, restart=True)
    assert (p.config.backend, p.config.plugin) == ("ddp", {"hosts": "a:1,b:1"})  # the launcher's stay
    p = plan(requested("--launcher local-mpi --offload optimizer"), running, restart=True)
    assert (p.config.launcher, p.config.plugin) == ("local-mpi", {"zero": 3, "offload": "optimizer"})
    with pytest.raises(ValueError, match="--zero is an option of --backend deepspeed, not of --backend ddp"):
        plan(requested("--backend ddp --zero 1"), running, restart=True)  # given: still refused


def test_start_needs_a_rank_count_and_checks_values():
    with pytest.raises(ValueError, match=r"No cluster is running: start one with %%distributed -n 2"):
        plan({}, None, restart=False)
    for line, fix in [("-n 0", "at least 1"), ("-n 2 --watchdog -1", "--watchdog must be"),
                      ("-n 2 --interrupt-grace 0", "--interrupt-grace must be positive"),
                      ("-n 2 --port 80", "1024 to 65535"), ("-n 2 --threads 0", "--threads must be at least 1"),
                      ("-n 2 --backend nope", "Unknown backend 'nope'"), ("-n 2 --launcher nope", "Unknown launcher")]:
        with pytest.raises(ValueError, match=fix):
            plan(requested(line), None, restart=False)


def test_the_local_rank_limit_is_the_local_launchers_only():
    with pytest.raises(ValueError, match=r"-n 128 is more than 64 ranks on this machine; .* \(--hosts, --slurm\)"):
        check(n=128)
    check(n=128, launcher="ssh", hosts="a:64,b:64")  # the review's case: refused before, by every launcher
    check(n=128, launcher="slurm", slurm="", nodes=2)
    check(n=128, gpus=True)


def test_the_sidebar_lists_each_option_with_its_scope():
    rows = {r["flag"]: r for r in TABLE.describe(ClusterConfig(n=2, port=29500))}
    assert rows["--port"]["value"] == "29500" and rows["--port"]["scope"] == "restart"
    assert rows["--threads"]["value"] == "default" and rows["--threads"]["scope"] == "live"
    assert rows["--auto-restart"]["value"] == "no"
    assert "--hosts" not in rows  # a plugin option is listed where it was given
    ssh = {r["flag"]: r for r in TABLE.describe(TABLE.config(requested("--hosts a:1,b:1")))}
    assert ssh["--hosts"]["value"] == "a:1,b:1" and ssh["--launcher"]["value"] == "ssh"


def test_where_the_ranks_run_picks_the_launcher_and_the_rank_count():
    given = requested("--hosts gpu1:4,gpu2:4")
    assert (given["launcher"], given["n"], given["gpus"]) == ("ssh", 8, False)
    assert requested("--hosts gpu1:4,gpu2:4 --gpus 8")["gpus"] is True
    slurm = requested('--slurm "-p gpu -A proj -t 60" -N 2 --gpus 8')
    assert (slurm["launcher"], slurm["slurm"], slurm["nodes"], slurm["n"]) == ("slurm", "-p gpu -A proj -t 60", 2, 8)
    assert requested("--slurm -N 2 -n 4")["slurm"] == ""  # inside an allocation: srun as it is
    assert plan(requested("--hosts a:1,b:1"), None, restart=False).config.launcher == "ssh"


def test_a_hostfile_gives_hosts_and_counts(tmp_path):
    f = tmp_path / "hosts.txt"
    f.write_text("# our boxes\ngpu1:2\n\ngpu2   # one rank\n")
    given = requested(f"--hostfile {f}")
    assert (given["n"], given["launcher"]) == (3, "ssh")
    with pytest.raises(ValueError, match=r"--hostfile .*nope.txt: No such file"):
        requested(f"--hostfile {tmp_path / 'nope.txt'}")


@pytest.mark.parametrize("config, says", [
    (dict(n=2, hosts="a:1", slurm=""), "Give one of --hosts and --slurm: they select different launchers"),
    (dict(n=4, hosts="a:1,b:1", launcher="ssh"), "has room for 2 rank(s), but -n 4 asks for 4"),
    (dict(n=2, hosts="a:1,b:1"), "--hosts starts the ranks with --launcher ssh; drop --launcher local-mpi"),
    (dict(n=2, launcher="ssh"), "--launcher ssh needs the hosts"),
    (dict(n=2, nodes=2), "-N/--nodes is an option of --launcher k8s, slurm, not of --launcher local-mpi: give --k8s "
                         "or --slurm"),
    (dict(n=2, slurm="", launcher="slurm", nodes=3), "-N 3: give 1 to 2 nodes for -n 2"),
    (dict(n=2, ip="10.0.0.1"), "--ip is an option of --launcher k8s, slurm, ssh, not of --launcher local-mpi: "
                               "give --hostfile or --hosts or --k8s or --slurm"),
    (dict(n=2, k8s="", launcher="k8s"), "--k8s needs the ranks' image: give --image IMAGE"),
    (dict(n=6, k8s="", image="i", nodes=4, launcher="k8s"), "-n 6 on -N 4 pods: give a rank count that -N divides (e.g. -n 4 -N 4)"),
    (dict(n=2, k8s="", image="i", namespace="ML", launcher="k8s"), "--namespace 'ML' is not a valid Kubernetes name"),
    (dict(n=2, k8s="", image="i", tolerations="a:Never", launcher="k8s"), "--tolerations: 'a:Never' has effect 'Never'"),
    (dict(n=2, image="i"), "--image is an option of --launcher k8s, not of --launcher local-mpi: give --k8s"),
    (dict(n=2, hosts="a:2", launcher="ssh", ip="gpu1"), "--ip 'gpu1' is not an IP address"),
    (dict(n=2, hosts="a:x", launcher="ssh"), "'a:x' is not host or host:N"),
])
def test_launcher_options_are_checked_by_their_owner_with_the_fix(config, says):
    with pytest.raises(ValueError) as err:
        check(**config)
    assert says in str(err.value)


def test_profiles_give_cluster_options_and_the_cell_wins(tmp_path, monkeypatch):
    path = tmp_path / "jdist" / "clusters.toml"
    path.parent.mkdir()
    path.write_text('[boxes]\nhosts = "gpu1:4,gpu2:4"\niface = "ib0"\ntimeout = 120.0\n\n[bad]\nhostz = "x"\n')
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    assert TABLE.load_profile("boxes") == {"hosts": "gpu1:4,gpu2:4", "iface": "ib0", "timeout": 120.0}
    given = requested("--cluster boxes --timeout 30 -n 6")
    assert (given["hosts"], given["iface"], given["timeout"], given["n"], given["launcher"]) == \
        ("gpu1:4,gpu2:4", "ib0", 30.0, 6, "ssh")
    with pytest.raises(ValueError, match=r"--cluster nope: no \[nope\] in .*clusters.toml; it has: boxes, bad"):
        TABLE.load_profile("nope")
    with pytest.raises(ValueError, match=r"'hostz' in .* is not a cluster option; use: .*hosts"):
        TABLE.load_profile("bad")
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"no profiles file .*clusters.toml; create it with a \[boxes\] table"):
        TABLE.load_profile("boxes")


def test_cell_options_are_one_object_from_the_table():
    opts = TABLE.cell_options(parse("--output all --tensorboard tb --targets 0"))
    assert (opts.output, opts.tensorboard, opts.targets, opts.mlflow, opts.no_dashboard) == ("all", "tb", "0", None, False)
    assert TABLE.cell_options(parse("")) == TABLE.cell_options({})  # defaults where not given
    assert opts.replace(output="none").output == "none" and opts.output == "all"  # frozen
    with pytest.raises(AttributeError, match="No cell option 'outptu'; the cell options are: targets, output"):
        opts.outptu  # noqa: B018


def test_the_ranks_get_their_options_values_at_set_up():
    config = ClusterConfig(n=2, threads=3)
    assert TABLE.rank_options(config) == {"threads": 3, "precision": "fp32", "auto_metrics": True,
                                          "mesh": None}


def test_two_plugins_cannot_define_one_option_differently():
    mine = Option("hosts", ("--hosts",), "my hosts", Scope.RESTART)
    with pytest.raises(TypeError, match=r"Option 'hosts' of launcher 'mine' is already defined by launcher 'ssh'"):
        OptionTable([*TABLE.owners, OptionOwner("launcher", "mine", (mine,))])
    with pytest.raises(TypeError, match=r"Option 'timeout' of backend 'x' is already defined by jdist"):
        OptionTable([OptionOwner("backend", "x", (Option("timeout", ("--timeout",), "t", Scope.RESTART),))])


def test_a_backends_option_belongs_to_it():
    zero = Option("stage", ("--stage",), "engine stage", Scope.RESTART, type=int, default=0)
    table = OptionTable([*TABLE.owners, OptionOwner("backend", "engine", (zero,))])
    config = table.config({"n": 2, "stage": 3})
    with pytest.raises(ValueError, match=r"--stage is an option of --backend engine, not of --backend ddp: give "
                                         r"--backend engine, or leave --stage out"):
        table.check(config)
    ok = table.config({"n": 2, "backend": "engine", "stage": 3})
    table.check(ok)
    assert table.rank_options(ok) == {"threads": None, "precision": "fp32", "auto_metrics": True,
                                         "mesh": None, "stage": 3}
    assert table.rank_options(table.config({"n": 2, "backend": "engine"}))["stage"] == 0  # its default


def frontends():
    from jdist.cli import SCRIPT
    from jdist.kernel.raytrain import RAY
    from jdist.options import NOTEBOOK

    return [NOTEBOOK, SCRIPT, RAY]


@pytest.mark.parametrize("frontend", frontends(), ids=lambda f: f.name)
def test_every_front_end_honours_or_refuses_every_option_with_one_line(frontend):
    """Each option of the table, for each front end: honoured, or refused with a reason it wrote down
    (jdist's own options) or its plugin kinds (plugins' options). ``jdist.tune`` takes no option of the table
    (its arguments are its own: ``jdist.tune(..., output=...)`` is Python's TypeError)."""
    own = {o.name for o in (*cluster_options(), *CELL_OPTIONS)}
    for opt in (*TABLE.cluster, *TABLE.cell):
        why = TABLE.refusal(frontend, opt.name)
        if why is None:
            assert frontend.all_options or opt.name in frontend.honours or opt.name not in own, opt.name
            continue
        assert why.startswith(f"{frontend.name} does not take {opt.flag}: ") and "\n" not in why, why
        if opt.name in own:
            assert opt.name in frontend.refuses, f"{frontend.name} never decided on {opt.flag}"
    assert not set(frontend.honours) & set(frontend.refuses)
    assert set(frontend.honours) | set(frontend.refuses) <= own  # no stale names


def test_an_option_a_front_end_never_decided_on_is_refused(monkeypatch):
    from jdist import options
    from jdist.cli import SCRIPT
    from jdist.kernel.raytrain import RAY

    new = Option("shiny", ("--shiny",), "A cell option added later.", Scope.CELL, switch=True, default=False)
    monkeypatch.setattr(options, "CELL_OPTIONS", (*CELL_OPTIONS, new))
    table = OptionTable(TABLE.owners)
    assert table.refusal(options.NOTEBOOK, "shiny") is None
    for frontend in (SCRIPT, RAY):
        assert table.refusal(frontend, "shiny") == f"{frontend.name} does not take --shiny: it does not apply it yet."
        with pytest.raises(ValueError, match="does not take --shiny"):
            table.refuse_given(frontend, {"shiny": True, "output": None})
    sink = OptionOwner("sink", "csv", (Option("csv", ("--csv",), "CSV rows.", Scope.CELL, type=str),))
    table = OptionTable((*TABLE.owners, sink))
    assert table.refusal(SCRIPT, "csv") is None and table.refusal(RAY, "csv") is None  # both build the run's sinks


def test_jdist_run_and_ray_fit_refuse_what_they_do_not_honour_in_one_line(capsys, tmp_path):
    from jdist.cli import main, parser
    from jdist.kernel.raytrain import fit

    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    assert main(["run", "-n", "2", "--debug-ranks", "1", str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jdist: error: jdist run does not take --debug-ranks: breakpoint() prompts need a notebook")
    assert "\n" not in err
    run = parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "--debug-ranks" not in run and "--targets" not in run and "--output" in run
    with pytest.raises(TypeError, match=r"^jdist.ray.fit does not take --output: Ray prints its workers' output itself"):
        fit(None, output="all")
    with pytest.raises(TypeError, match=r"^jdist.ray.fit: no option 'tensorbord'; it takes: no_dashboard, run_dir, .*tensorboard"):
        fit(None, tensorbord="runs")
