"""The ``%%distributed`` options, each defined once, with its scope.

A cluster option is a field of :class:`ClusterConfig` whose metadata says its flag, help
and :class:`Scope`; the cell options (:data:`CELL_OPTIONS`) apply to one cell. From this one
definition come the magic's argument parser and its ``%%distributed?`` help
(:func:`parser_arguments`), what a cell asks of a running cluster (:func:`plan`: reuse it,
change live options, refuse a change that needs ``--restart``, or keep the options not given
across ``--restart``), the pure checks of :meth:`ClusterConfig.check`, and the options the
sidebar lists for each cluster (:func:`describe`).

Scopes:

* ``restart``: fixed while the cluster runs; another value needs ``--restart``;
* ``live``: applied to the running cluster at once, no restart (by the kernel, or on the ranks),
  and kept for later cells and restarts;
* ``cell``: this cell only.

Example:
    >>> p = plan({"n": 2}, running=None, restart=False)
    >>> p.action, p.config.n, p.config.backend
    ('start', 2, 'ddp')
    >>> running = p.config
    >>> plan({"precision": "bf16", "threads": 1}, running, restart=False).live
    {'threads': 1, 'precision': 'bf16'}
    >>> plan({"backend": "fsdp"}, running, restart=False)
    Traceback (most recent call last):
    ...
    ValueError: A cluster is running with different options: --backend fsdp (running: ddp). Add --restart to replace it (rank state is lost), or drop these options to reuse it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Mapping

#: Values of ``--precision`` (autocast dtype of prepared models; fp16 adds a GradScaler).
PRECISIONS = ("fp32", "bf16", "fp16")
#: Largest rank count accepted for local CPU ranks (each rank is a Python process with torch).
MAX_LOCAL_RANKS = 64


class Scope(str, Enum):
    RESTART = "restart"
    LIVE = "live"
    CELL = "cell"

    @property
    def note(self) -> str:
        return {"restart": "Changing it needs --restart.",
                "live": "Changes the running cluster without a restart; kept for later cells.",
                "cell": "This cell only."}[self.value]


@dataclass(frozen=True)
class Option:
    """One flag of ``%%distributed``. ``applied_by``: who applies a live change ("kernel"/"ranks")."""

    name: str
    flags: tuple[str, ...]
    help: str
    scope: Scope
    type: Any = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    switch: bool = False  # a flag without a value (this cell)
    toggle: bool = False  # "--flag" turns it on, "--flag off" turns it off
    applied_by: Literal["kernel", "ranks"] = "kernel"
    const: Any = None  # the value of the flag given alone ("--flag" without a value); None: a value is needed

    @property
    def flag(self) -> str:
        return self.flags[-1]

    def argparse(self) -> tuple[tuple[str, ...], dict[str, Any]]:
        """``(flags, kwargs)`` for ``argparse.add_argument``; every default is None ("not given")."""
        kwargs: dict[str, Any] = {"default": None, "dest": self.name,
                                  "help": f"{self.help} {self.scope.note}"}
        if self.switch:
            kwargs["action"] = "store_true"
        elif self.toggle:
            kwargs.update(nargs="?", const=True, type=on_off, metavar="on|off")
        elif self.const is not None:
            kwargs.update(nargs="?", const=self.const, type=self.type, metavar=self.metavar)
        else:
            kwargs["type"] = self.type
            if self.choices:
                kwargs["choices"] = list(self.choices)
            if self.metavar:
                kwargs["metavar"] = self.metavar
        return self.flags, kwargs


def on_off(text: str) -> bool:
    """``on``/``off`` (also yes/no, true/false, 1/0) as a bool; argparse shows the error.

    >>> on_off("off"), on_off("ON")
    (False, True)
    """
    value = {"on": True, "yes": True, "true": True, "1": True, "off": False, "no": False, "false": False,
             "0": False}.get(text.strip().lower())
    if value is None:
        raise ValueError(text)
    return value


on_off.__name__ = "on or off"  # argparse's message: "invalid on or off value: 'x'"


def _option(default: Any, flags: tuple[str, ...], help: str, scope: Scope, **kw: Any) -> Any:
    return field(default=default, metadata={"option": Option("", flags, help, scope, **kw)})


@dataclass(frozen=True)
class ClusterConfig:
    """What a cluster runs with: every field is a ``%%distributed`` option (see its metadata)."""

    n: int = field(metadata={"option": Option("", ("-n",), "Number of ranks: CPU ranks (gloo), or with --gpus "
                                              "one CUDA GPU each.", Scope.RESTART, type=int, metavar="N")})
    gpus: bool = _option(False, ("--gpus",), "Number of ranks with one CUDA GPU each (NCCL).", Scope.RESTART,
                         type=int, metavar="N")
    backend: str = _option("ddp", ("--backend",), "Training backend on the ranks: ddp (default), fsdp, horovod, "
                           "or one installed through the jdist.backends entry points.", Scope.RESTART)
    launcher: str = _option("local-mpi", ("--launcher",), "How the ranks are started: local-mpi (default: MPI "
                            "ranks on this machine), or one installed through the jdist.launchers entry points.",
                            Scope.RESTART)
    hosts: str | None = _option(None, ("--hosts",), "Run the ranks on these hosts over ssh (MPICH hydra): "
                                "gpu1:4,gpu2:4 gives 4 ranks per host (-n/--gpus default to the total); the same "
                                "Python path on each, a shared home (docs/multinode.md).", Scope.RESTART, type=str,
                                metavar="HOST:N,...")
    hostfile: str | None = _option(None, ("--hostfile",), "Like --hosts, from a file: one host[:ranks] per line.",
                                   Scope.RESTART, type=str, metavar="FILE")
    slurm: str | None = _option(None, ("--slurm",), "Run the ranks as a Slurm job step (srun --mpi=pmi2): inside "
                                "an allocation as it is; outside one, give srun's own options in quotes, e.g. "
                                "--slurm \"-p gpu -A proj -t 60\".", Scope.RESTART, type=str, metavar="\"SRUN OPTIONS\"",
                                const="")
    nodes: int | None = _option(None, ("-N", "--nodes"), "With --slurm: the number of nodes (srun -N).", Scope.RESTART,
                                type=int, metavar="NODES")
    ip: str | None = _option(None, ("--ip",), "With ranks on other hosts: the address of this machine (and of rank "
                             "0's host for the process group) that the others reach; jdist's listeners bind it "
                             "(default: the address of the route to the first host).", Scope.RESTART, type=str,
                             metavar="ADDR")
    iface: str | None = _option(None, ("--iface",), "With ranks on other hosts: the network interface for jdist's "
                                "traffic and gloo/NCCL on every host (default: the one that routes to rank 0).",
                                Scope.RESTART, type=str, metavar="NAME")
    encrypt: bool = _option(False, ("--encrypt",), "Encrypt the kernel's traffic with the ranks (CurveZMQ). The "
                            "process group's own traffic (gloo, NCCL) is not encrypted.", Scope.RESTART, toggle=True)
    timeout: float = _option(60.0, ("--timeout",), "Process-group timeout in seconds (default 60).", Scope.RESTART,
                             type=float, metavar="S")
    port: int | None = _option(None, ("--port",), "Fixed TCP port for the process-group rendezvous (default: none; "
                               "a private file store is used).", Scope.RESTART, type=int, metavar="P")
    threads: int | None = _option(None, ("--threads",), "torch threads per CPU rank (default: cores / ranks).",
                                  Scope.LIVE, type=int, metavar="T", applied_by="ranks")
    precision: str = _option("fp32", ("--precision",), "Autocast precision of prepared models (fp16 adds a "
                             "GradScaler; jdist.backward applies it).", Scope.LIVE, choices=PRECISIONS,
                             applied_by="ranks")
    watchdog: float = _option(30.0, ("--watchdog",), "Seconds without progress, with every running rank proven "
                              "blocked in a collective, after which the cell is reported as hung with each rank's "
                              "stack and the ranks are released; healthy training that prints nothing is left alone "
                              "(default 30; 0: off).", Scope.LIVE, type=float, metavar="S")
    auto_restart: bool = _option(False, ("--auto-restart",), "If the rank processes die, restart them at once, "
                                 "replay the set-up cells and restore the newest jdist.checkpoint_every checkpoint "
                                 "(--auto-restart off: no more).", Scope.LIVE, toggle=True)
    start_timeout: float = _option(120.0, ("--start-timeout",), "Seconds to wait for ranks to start (default 120).",
                                   Scope.LIVE, type=float, metavar="S")

    def check(self) -> None:
        """Raise ValueError with the fix for impossible settings (pure: no probing of the machine).

        >>> ClusterConfig(n=0).check()
        Traceback (most recent call last):
        ...
        ValueError: -n/--gpus must be at least 1 (got 0); e.g. -n 2.
        """
        from jdist.plugins import available_launchers, backend_spec

        if self.n < 1:
            raise ValueError(f"-n/--gpus must be at least 1 (got {self.n}); e.g. -n 2.")
        if not self.gpus and self.n > MAX_LOCAL_RANKS:
            raise ValueError(f"-n {self.n} is more than {MAX_LOCAL_RANKS} local ranks; use -n {MAX_LOCAL_RANKS} or fewer.")
        backend_spec(self.backend)  # names the choices
        if self.launcher not in available_launchers():
            raise ValueError(f"Unknown launcher {self.launcher!r}. Use --launcher with one of: "
                             f"{', '.join(available_launchers())}.")
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be positive seconds (got {self.timeout:g}).")
        if self.start_timeout <= 0:
            raise ValueError(f"--start-timeout must be positive seconds (got {self.start_timeout:g}).")
        if self.watchdog < 0:
            raise ValueError(f"--watchdog must be seconds >= 0 (0 turns it off; got {self.watchdog:g}).")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1 (got {self.threads}); leave it out for cores / ranks.")
        if self.port is not None and not 1024 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: use a port from 1024 to 65535, or leave --port out.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision {self.precision!r}: use one of {', '.join(PRECISIONS)}.")
        places = [flag for flag, value in (("--hosts", self.hosts), ("--hostfile", self.hostfile),
                                           ("--slurm", self.slurm)) if value is not None]
        if len(places) > 1:
            raise ValueError(f"Give one of {' and '.join(places)}: they say where the ranks run.")
        if self.hosts is not None:
            total = sum(count for _, count in parse_hosts(self.hosts))  # names a malformed list
            if total < self.n:
                raise ValueError(f"--hosts {self.hosts} has room for {total} rank(s), but {self.ranks_flag} asks "
                                 f"for {self.n}: add ranks per host (host:N) or leave {self.ranks_flag.split()[0]} out.")
        expected = {"--hosts": "ssh", "--hostfile": "ssh", "--slurm": "slurm"}.get(places[0]) if places else None
        if expected and self.launcher != expected:
            raise ValueError(f"{places[0]} starts the ranks with --launcher {expected}; drop --launcher {self.launcher}.")
        if self.launcher in ("ssh",) and expected is None:
            raise ValueError("--launcher ssh needs the hosts: give --hosts gpu1:4,gpu2:4 or --hostfile FILE.")
        if self.nodes is not None and self.slurm is None:
            raise ValueError("-N/--nodes is the node count of a Slurm job step: use it with --slurm "
                             "(with --hosts, the hosts are the nodes).")
        if self.nodes is not None and not 1 <= self.nodes <= self.n:
            raise ValueError(f"-N {self.nodes}: give 1 to {self.n} nodes for {self.ranks_flag}.")
        if (self.ip or self.iface) and self.launcher == "local-mpi":
            raise ValueError("--ip/--iface choose the network between hosts; on one machine everything stays on "
                             "loopback: leave them out, or give --hosts/--slurm.")
        if self.ip is not None:
            import ipaddress

            try:
                ipaddress.ip_address(self.ip)
            except ValueError:
                raise ValueError(f"--ip {self.ip!r} is not an IP address; give one of this machine's "
                                 "addresses, e.g. --ip 10.1.2.3 (or --iface NAME).") from None

    @property
    def ranks_flag(self) -> str:
        """``-n 2`` or ``--gpus 2``."""
        return f"{'--gpus' if self.gpus else '-n'} {self.n}"


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``--hosts`` (or a hostfile's lines) as ``[(host, ranks)]``; a host without ``:N`` gets 1.

    >>> parse_hosts("gpu1:4,gpu2:4")
    [('gpu1', 4), ('gpu2', 4)]
    >>> parse_hosts("node1, node2:2")
    [('node1', 1), ('node2', 2)]
    >>> parse_hosts("gpu1:x")
    Traceback (most recent call last):
    ...
    ValueError: --hosts: 'gpu1:x' is not host or host:N (N ranks, at least 1); e.g. --hosts gpu1:4,gpu2:4.
    """
    out = []
    for item in text.replace("\n", ",").split(","):
        item = item.split("#", 1)[0].strip()
        if not item:
            continue
        host, _, count = item.partition(":")
        if not host or any(c.isspace() for c in host) or (count and not (count.isdigit() and int(count) >= 1)):
            raise ValueError(f"--hosts: {item!r} is not host or host:N (N ranks, at least 1); "
                             "e.g. --hosts gpu1:4,gpu2:4.")
        out.append((host, int(count) if count else 1))
    if not out:
        raise ValueError("--hosts: no host given; e.g. --hosts gpu1:4,gpu2:4.")
    return out


def read_hostfile(path: str) -> list[tuple[str, int]]:
    """A hostfile's hosts (one ``host[:N]`` per line, ``#`` comments), as :func:`parse_hosts`."""
    try:
        text = open(os.path.expanduser(path)).read()
    except OSError as exc:
        raise ValueError(f"--hostfile {path}: {exc.strerror}; give a file with one host[:ranks] per line.") from None
    try:
        return parse_hosts(text)
    except ValueError as exc:
        raise ValueError(f"--hostfile {path}: {str(exc).removeprefix('--hosts: ')}") from None


def profiles_file() -> Path:
    """Where ``--cluster NAME`` profiles live: ``<jupyter config dir>/jdist/clusters.toml``."""
    from jupyter_core.paths import jupyter_config_dir

    return Path(jupyter_config_dir()) / "jdist" / "clusters.toml"


def load_profile(name: str, path: Path | None = None) -> dict[str, Any]:
    """The cluster options of profile ``name`` (a TOML table of option names, as the flags say them):

        [mycluster]
        hosts = "gpu1:4,gpu2:4"
        iface = "ib0"

    ValueError with the fix for a missing file, profile or option.
    """
    import tomllib

    path = path or profiles_file()
    try:
        profiles = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"--cluster {name}: no profiles file {path}; create it with a [{name}] table "
                         "(docs/multinode.md).") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--cluster {name}: {path} is not valid TOML ({exc}).") from None
    if name not in profiles or not isinstance(profiles[name], dict):
        raise ValueError(f"--cluster {name}: no [{name}] in {path}; it has: {', '.join(profiles) or 'none'}.")
    names = {o.name for o in cluster_options()}
    out: dict[str, Any] = {}
    for key, value in profiles[name].items():
        option = key.replace("-", "_")
        if option not in names:
            raise ValueError(f"--cluster {name}: {key!r} in {path} is not a cluster option; use: "
                             f"{', '.join(sorted(names))}.")
        out[option] = value
    return out


@functools.cache
def cluster_options() -> tuple[Option, ...]:
    """The cluster options, in :class:`ClusterConfig` field order."""
    return tuple(dataclasses.replace(f.metadata["option"], name=f.name) for f in dataclasses.fields(ClusterConfig))


CELL_OPTIONS: tuple[Option, ...] = (
    Option("targets", ("--targets",), "Ranks to run this cell on: 0, 0,2, 1-3 or all (default: all).", Scope.CELL,
           type=str, metavar="RANKS"),
    Option("output", ("--output",), "Whose stdout/stderr to show: rank0 (the lowest selected rank, live; "
           "default), all (every rank, lines labelled by rank), none.", Scope.CELL, type=str,
           choices=("rank0", "all", "none")),
    Option("no_dashboard", ("--no-dashboard",), "Do not show the live dashboard for jdist.log metrics.", Scope.CELL,
           switch=True),
    Option("run_dir", ("--run-dir",), "Folder for run logs (default: $JDIST_RUN_DIR or <jupyter data dir>/jdist/runs).",
           Scope.CELL, type=str, metavar="DIR"),
    Option("tensorboard", ("--tensorboard",), "Also write this cell's run to TensorBoard while it runs, under "
           "DIR/<run id> (each rank and their mean; needs jdist[tracking]).", Scope.CELL, type=str, metavar="DIR"),
    Option("mlflow", ("--mlflow",), "Also log this cell's run to MLflow while it runs: URI is a tracking store or "
           "server (default: MLflow's own, $MLFLOW_TRACKING_URI or sqlite:///mlflow.db; needs jdist[tracking]).",
           Scope.CELL, type=str, metavar="URI", const=True),
    Option("cluster", ("--cluster",), "Take the cluster options of profile NAME from <jupyter config dir>/jdist/"
           "clusters.toml (options given in the cell win).", Scope.CELL, type=str, metavar="NAME"),
    Option("restart", ("--restart",), "Replace the running cluster first: with the options given, the others "
           "kept (rank state is lost).", Scope.CELL, switch=True),
)


def parser_arguments() -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """``argparse.add_argument`` arguments of ``%%distributed``: cluster options, then cell options."""
    return [opt.argparse() for opt in (*cluster_options(), *CELL_OPTIONS)]


def requested(args: Any) -> dict[str, Any]:
    """The cluster options a parsed ``%%distributed`` line gives (those not given are left out).

    ``-n N`` and ``--gpus N`` both set the rank count; ``--gpus`` also sets ``gpus``.
    """
    given = {o.name: getattr(args, o.name) for o in cluster_options() if getattr(args, o.name, None) is not None}
    profile = getattr(args, "cluster", None)
    if profile:
        counted = "n" in given or "gpus" in given  # the cell's -n/--gpus win over the profile's
        for name, value in load_profile(profile).items():
            if not (counted and name in ("n", "gpus")):
                given.setdefault(name, value)
    n, gpus = given.pop("n", None), given.pop("gpus", None)
    if n is not None and gpus is not None:
        raise ValueError("Give either -n N (CPU ranks) or --gpus N (one GPU per rank), not both.")
    if n is not None:
        given.update(n=n, gpus=False)
    elif gpus is not None:
        given.update(n=gpus, gpus=True)
    if "n" not in given and (given.get("hosts") or given.get("hostfile")):
        hosts = parse_hosts(given["hosts"]) if given.get("hosts") else read_hostfile(given["hostfile"])
        given.update(n=sum(count for _, count in hosts), gpus=False)
    if given.get("hostfile") and not given.get("hosts"):
        read_hostfile(given["hostfile"])  # one clear line now, not an error of mpiexec later
    if "launcher" not in given:
        if given.get("hosts") or given.get("hostfile"):
            given["launcher"] = "ssh"
        elif given.get("slurm") is not None:
            given["launcher"] = "slurm"
    return given


@dataclass(frozen=True)
class Plan:
    """What a cell's options do to the cluster: ``start`` one, ``restart`` it (with ``config``), or
    ``reuse`` it with the ``live`` changes applied."""

    action: Literal["start", "restart", "reuse"]
    config: ClusterConfig
    live: dict[str, Any] = field(default_factory=dict)


def plan(given: Mapping[str, Any], running: ClusterConfig | None, restart: bool) -> Plan:
    """What ``given`` (:func:`requested`) asks of the ``running`` cluster's config (None: none runs).

    Raises ValueError with the fix: no cluster and no rank count, a restart-scope option that
    differs without ``restart``, or a config that :meth:`ClusterConfig.check` refuses.
    """
    options = {o.name: o for o in cluster_options()}
    if running is None:
        if "n" not in given:
            raise ValueError("No cluster is running: start one with %%distributed -n 2 (CPU ranks) or --gpus N.")
        config = ClusterConfig(**given)
        config.check()
        return Plan("start", config)
    if restart:  # options not given are kept
        config = dataclasses.replace(running, **given)
        config.check()
        return Plan("restart", config)
    conflicts, live = [], {}
    for name in [o for o in options if o in given]:  # in the order the options are defined
        value, old = given[name], getattr(running, name)
        if value == old:
            continue
        if options[name].scope is Scope.RESTART:
            if name in ("n", "gpus"):  # given together (requested)
                conflicts.append(f"{'--gpus' if given['gpus'] else '-n'} {given['n']} (running: {running.ranks_flag})")
            else:
                conflicts.append(f"{options[name].flag} {_show(value)} (running: {_show(old) if old is not None else 'none'})")
        else:
            live[name] = value
    conflicts = list(dict.fromkeys(conflicts))
    if conflicts:
        raise ValueError(
            f"A cluster is running with different options: {'; '.join(conflicts)}. "
            "Add --restart to replace it (rank state is lost), or drop these options to reuse it."
        )
    config = dataclasses.replace(running, **live)
    config.check()
    return Plan("reuse", config, live)


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe(config: Mapping[str, Any]) -> list[dict[str, str]]:
    """The cluster options of a config (a :class:`ClusterConfig` as a dict), as the sidebar lists them.

    >>> describe({"n": 2, "gpus": False, "backend": "ddp"})[:2]  # doctest: +NORMALIZE_WHITESPACE
    [{'name': 'n', 'flag': '-n', 'value': '2', 'scope': 'restart', 'help': 'Number of ranks: CPU ranks (gloo), or with --gpus one CUDA GPU each.'},
     {'name': 'gpus', 'flag': '--gpus', 'value': 'no', 'scope': 'restart', 'help': 'Number of ranks with one CUDA GPU each (NCCL).'}]
    """
    out = []
    for opt in cluster_options():
        if opt.name not in config:
            continue
        value = config[opt.name]
        text = ("yes" if value else "no") if isinstance(value, bool) else ("default" if value is None else _show(value))
        out.append({"name": opt.name, "flag": opt.flag, "value": text, "scope": opt.scope.value, "help": opt.help})
    return out


__all__ = [
    "CELL_OPTIONS",
    "ClusterConfig",
    "MAX_LOCAL_RANKS",
    "Option",
    "PRECISIONS",
    "Plan",
    "Scope",
    "cluster_options",
    "describe",
    "parser_arguments",
    "load_profile",
    "parse_hosts",
    "plan",
    "read_hostfile",
    "requested",
]
