"""The ``%%distributed`` options, each defined once, with its scope, by whoever owns it.

jdist's own cluster options are the fields of :class:`ClusterConfig` (their flag, help and
:class:`Scope` in the field's metadata); its own cell options are :data:`CELL_OPTIONS`. A plugin
owns its options (:class:`OptionOwner`): a launcher (``--hosts`` is the ssh launcher's), a
backend (its :class:`~jdist.plugins.BackendSpec`) or a record sink (``--tensorboard``).
:func:`jdist.plugins.option_table` assembles them all into one :class:`OptionTable`; from it
come the magic's argument parser and ``%%distributed?`` help (:meth:`~OptionTable.parser_arguments`),
what a line gives (:meth:`~OptionTable.requested`), what it asks of a running cluster
(:meth:`~OptionTable.plan`: reuse it, change live options, refuse a change that needs
``--restart``, or keep the options not given across ``--restart``), the checks
(:meth:`~OptionTable.check`: jdist's, then the owners'), this cell's :class:`CellOptions` and
the options the sidebar lists for each cluster (:meth:`~OptionTable.describe`).

Scopes:

* ``restart``: fixed while the cluster runs; another value needs ``--restart``;
* ``live``: applied to the running cluster at once, no restart (by the kernel, or on the ranks),
  and kept for later cells and restarts;
* ``cell``: this cell only.

Example:
    >>> from jdist.plugins import option_table
    >>> table = option_table()
    >>> p = table.plan({"n": 2}, running=None, restart=False)
    >>> p.action, p.config.n, p.config.backend
    ('start', 2, 'ddp')
    >>> running = p.config
    >>> table.plan({"precision": "bf16", "threads": 1}, running, restart=False).live
    {'threads': 1, 'precision': 'bf16'}
    >>> table.plan({"timeout": 30.0}, running, restart=False)
    Traceback (most recent call last):
    ...
    ValueError: A cluster is running with different options: --timeout 30 (running: 60). Add --restart to replace it (rank state is lost), or drop these options to reuse it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

#: Values of ``--precision`` (autocast dtype of prepared models; fp16 adds a GradScaler).
PRECISIONS = ("fp32", "bf16", "fp16")


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
    """One flag of ``%%distributed``.

    ``applied_by``: who applies a live change ("kernel", or "ranks": :mod:`jdist.rank.bootstrap`
    has its rank-side code, or the backend that owns it); ``message``: what a live change prints
    (``{}``: the new value); ``default``: the value when not given (jdist's cluster options: their
    :class:`ClusterConfig` field's); ``implies``: giving it selects the plugin that owns it
    (``--hosts`` starts the ranks with ``--launcher ssh``).
    """

    name: str
    flags: tuple[str, ...]
    help: str
    scope: Scope
    type: Any = None
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None
    switch: bool = False  # a flag without a value (this cell)
    toggle: bool = False  # "--flag" turns it on, "--flag off" turns it off
    applied_by: Literal["kernel", "ranks"] = "kernel"
    const: Any = None  # the value of the flag given alone ("--flag" without a value); None: a value is needed
    default: Any = None
    message: str | None = None
    implies: bool = False

    @property
    def flag(self) -> str:
        return self.flags[-1]

    @property
    def flag_names(self) -> str:
        """Every flag, as errors name them: ``-N/--nodes``."""
        return "/".join(self.flags)

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


def elastic_range(text: str) -> tuple[int, int]:
    """``--elastic MIN:MAX`` as ``(MIN, MAX)``; one line with the fix for anything else.

    >>> elastic_range("2:4")
    (2, 4)
    >>> elastic_range("3:2")
    Traceback (most recent call last):
    ValueError: --elastic 3:2: MIN must not be more than MAX, e.g. --elastic 2:3.
    """
    low, sep, high = str(text).partition(":")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = 0
    if not sep or lo < 1 or hi < 1:
        raise ValueError(f"--elastic {text}: give MIN:MAX ranks, both at least 1, e.g. --elastic 2:4.")
    if lo > hi:
        raise ValueError(f"--elastic {text}: MIN must not be more than MAX, e.g. --elastic {hi}:{lo}.")
    return lo, hi


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
    """What a cluster runs with: jdist's own options as fields (see their metadata), and the
    options of its launcher and backend that were given, in :attr:`plugin`.

    >>> c = ClusterConfig(n=2, launcher="ssh", plugin={"hosts": "a:1,b:1"})
    >>> c.get("hosts"), c.get("nodes"), c.replace(timeout=30.0, nodes=2).as_dict()["nodes"]
    ('a:1,b:1', None, 2)
    """

    n: int = field(metadata={"option": Option("", ("-n",), "Number of ranks: CPU ranks (gloo), or with --gpus "
                                              "one CUDA GPU each.", Scope.RESTART, type=int, metavar="N")})
    gpus: bool = _option(False, ("--gpus",), "Number of ranks with one CUDA GPU each (NCCL).", Scope.RESTART,
                         type=int, metavar="N")
    backend: str = _option("ddp", ("--backend",), "Training backend on the ranks: ddp (default), fsdp, horovod, "
                           "or one installed through the jdist.backends entry points.", Scope.RESTART)
    launcher: str = _option("local-mpi", ("--launcher",), "How the ranks are started: local-mpi (default: MPI "
                            "ranks on this machine), or one installed through the jdist.launchers entry points.",
                            Scope.RESTART)
    encrypt: bool = _option(False, ("--encrypt",), "Encrypt the kernel's traffic with the ranks (CurveZMQ). The "
                            "process group's own traffic (gloo, NCCL) is not encrypted.", Scope.RESTART, toggle=True)
    timeout: float = _option(60.0, ("--timeout",), "Process-group timeout in seconds (default 60).", Scope.RESTART,
                             type=float, metavar="S")
    port: int | None = _option(None, ("--port",), "Fixed TCP port for the process-group rendezvous (default: none; "
                               "a private file store is used).", Scope.RESTART, type=int, metavar="P")
    threads: int | None = _option(None, ("--threads",), "torch threads per CPU rank (default: OMP_NUM_THREADS "
                                  "if set, else cores / ranks).",
                                  Scope.LIVE, type=int, metavar="T", applied_by="ranks",
                                  message="torch uses {} thread(s) per rank now.")
    precision: str = _option("fp32", ("--precision",), "Autocast precision of prepared models (fp16 adds a "
                             "GradScaler; jdist.backward applies it).", Scope.LIVE, choices=PRECISIONS,
                             applied_by="ranks", message="Precision is now {} on all ranks (prepared models included).")
    mesh: str | None = _option(None, ("--mesh",), "A device mesh over the ranks, as `mesh` in every cell: NAME=SIZE "
                               "pairs, e.g. dp=2,tp=2 (one size may be -1: the rest); its sizes multiply to the "
                               "number of ranks (torch's DeviceMesh on the ranks' device).", Scope.LIVE,
                               metavar="DIMS", applied_by="ranks",
                               message="`mesh` is now a {} device mesh on every rank.")
    watchdog: float = _option(30.0, ("--watchdog",), "Seconds without progress, with every running rank proven "
                              "blocked in a collective, after which the cell is reported as hung with each rank's "
                              "stack and the ranks are released; healthy training that prints nothing is left alone "
                              "(default 30; 0: off).", Scope.LIVE, type=float, metavar="S")
    interrupt_grace: float = _option(10.0, ("--interrupt-grace",), "Seconds the ranks have to stop after an "
                                     "interrupt or a release (SIGINT) before the ranks still running are named "
                                     "with where they are (default 10).", Scope.LIVE, type=float, metavar="S")
    auto_restart: bool = _option(False, ("--auto-restart",), "If the rank processes die, restart them at once, "
                                 "replay the set-up cells and restore the newest jdist.checkpoint_every checkpoint "
                                 "(--auto-restart off: no more).", Scope.LIVE, toggle=True)
    elastic: str | None = _option(None, ("--elastic",), "MIN:MAX ranks: when ranks are lost (a rank's process "
                                  "killed, a host gone), the cell fails as always and the cluster goes on at once "
                                  "with those left (at least MIN) from the newest jdist.checkpoint_every "
                                  "checkpoint, resharded; %%dist resize grows it again (up to MAX).", Scope.LIVE,
                                  metavar="MIN:MAX")
    auto_metrics: bool = _option(True, ("--auto-metrics",), "Records without jdist.log: each optimizer step of "
                                 "a script or cell that does not call jdist.log is a record with its loss (the "
                                 "scalar it called .backward() on), step, compute and communication time and "
                                 "memory (--auto-metrics off: no hooks at all, e.g. when the backward root is not "
                                 "the loss).", Scope.LIVE, toggle=True, applied_by="ranks")
    start_timeout: float = _option(120.0, ("--start-timeout",), "Seconds to wait for ranks to start (default 120).",
                                   Scope.LIVE, type=float, metavar="S")
    #: The options of plugins (the launcher's, the backend's) that were given, by name.
    plugin: dict[str, Any] = field(default_factory=dict, hash=False, metadata={"internal": True})

    def get(self, name: str, default: Any = None) -> Any:
        """The value of option ``name``: a field, else a plugin option's value if given, else ``default``."""
        if name in _CORE_NAMES:
            return getattr(self, name)
        return self.plugin.get(name, default)

    def replace(self, **changes: Any) -> ClusterConfig:
        """A copy with ``changes`` (jdist's options and plugins' alike; a plugin option set to None is dropped)."""
        core = {k: v for k, v in changes.items() if k in _CORE_NAMES}
        plugin = {**self.plugin, **{k: v for k, v in changes.items() if k not in _CORE_NAMES}}
        return dataclasses.replace(self, **core, plugin={k: v for k, v in plugin.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        """Every option's value, flat: jdist's fields, then the plugin options given."""
        return {**{name: getattr(self, name) for name in _CORE_NAMES}, **self.plugin}

    def check(self) -> None:
        """Raise ValueError with the fix for impossible settings of jdist's own options (pure: no
        probing of the machine; :meth:`OptionTable.check` adds the plugins' checks).

        >>> ClusterConfig(n=0).check()
        Traceback (most recent call last):
        ...
        ValueError: -n/--gpus must be at least 1 (got 0); e.g. -n 2.
        """
        if self.n < 1:
            raise ValueError(f"-n/--gpus must be at least 1 (got {self.n}); e.g. -n 2.")
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be positive seconds (got {self.timeout:g}).")
        if self.start_timeout <= 0:
            raise ValueError(f"--start-timeout must be positive seconds (got {self.start_timeout:g}).")
        if self.watchdog < 0:
            raise ValueError(f"--watchdog must be seconds >= 0 (0 turns it off; got {self.watchdog:g}).")
        if self.interrupt_grace <= 0:
            raise ValueError(f"--interrupt-grace must be positive seconds (got {self.interrupt_grace:g}).")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1 (got {self.threads}); leave it out for cores / ranks.")
        if self.port is not None and not 1024 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: use a port from 1024 to 65535, or leave --port out.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision {self.precision!r}: use one of {', '.join(PRECISIONS)}.")
        if self.mesh is not None:
            from jdist.common.meshspec import parse_mesh

            parse_mesh(self.mesh, self.n)
        if self.elastic is not None:
            low, high = elastic_range(self.elastic)
            if not low <= self.n <= high:
                raise ValueError(f"--elastic {self.elastic} with {self.ranks_flag}: the ranks to start must be within "
                                 f"MIN:MAX, e.g. --elastic {min(low, self.n)}:{max(high, self.n)}.")

    @property
    def elastic_range(self) -> tuple[int, int] | None:
        """``--elastic``'s (MIN, MAX), None without it."""
        return elastic_range(self.elastic) if self.elastic is not None else None

    @property
    def ranks_flag(self) -> str:
        """``-n 2`` or ``--gpus 2``."""
        return f"{'--gpus' if self.gpus else '-n'} {self.n}"


_CORE_NAMES = tuple(f.name for f in dataclasses.fields(ClusterConfig) if "option" in f.metadata)


@functools.cache
def cluster_options() -> tuple[Option, ...]:
    """jdist's own cluster options, in :class:`ClusterConfig` field order."""
    return tuple(dataclasses.replace(f.metadata["option"], name=f.name,
                                     default=None if f.default is dataclasses.MISSING else f.default)
                 for f in dataclasses.fields(ClusterConfig) if "option" in f.metadata)


#: jdist's own cell options (plugins add theirs: ``--tensorboard``, ``--mlflow``).
CELL_OPTIONS: tuple[Option, ...] = (
    Option("targets", ("--targets",), "Ranks to run this cell on: 0, 0,2, 1-3 or all (default: all).", Scope.CELL,
           type=str, metavar="RANKS"),
    Option("output", ("--output",), "Whose stdout/stderr to show: rank0 (the lowest selected rank, live; "
           "default), all (every rank, lines labelled by rank), none.", Scope.CELL, type=str,
           choices=("rank0", "all", "none"), default="rank0"),
    Option("debug_ranks", ("--debug-ranks",), "Ranks where breakpoint() / pdb.set_trace() stop this cell, with a pdb "
           "prompt in the notebook (e.g. 1 or 0,2); elsewhere they do nothing. JupyterLab's Debugger panel stops "
           "these ranks too (default: the cell's lowest rank).", Scope.CELL, type=str,
           metavar="RANKS"),
    Option("no_dashboard", ("--no-dashboard",), "Do not show the live dashboard for jdist.log metrics.", Scope.CELL,
           switch=True, default=False),
    Option("run_dir", ("--run-dir",), "Folder for run logs (default: $JDIST_RUN_DIR or <jupyter data dir>/jdist/runs).",
           Scope.CELL, type=str, metavar="DIR"),
    Option("cluster", ("--cluster",), "Take the cluster options of profile NAME from <jupyter config dir>/jdist/"
           "clusters.toml (options given in the cell win).", Scope.CELL, type=str, metavar="NAME"),
    Option("restart", ("--restart",), "Replace the running cluster first: with the options given, the others "
           "kept (rank state is lost).", Scope.CELL, switch=True, default=False),
)


class CellOptions:
    """This cell's options (scope ``cell``): jdist's and the installed plugins', every one with a
    value (its default when not given), read as attributes. Made by :meth:`OptionTable.cell_options`
    and passed whole (magics, supervisor, sinks, recovery replays).

    >>> opts = OptionTable().cell_options({"output": "all"})
    >>> opts.output, opts.no_dashboard, opts.replace(output="none").output
    ('all', False, 'none')
    >>> opts.outptu
    Traceback (most recent call last):
    ...
    AttributeError: No cell option 'outptu'; the cell options are: targets, output, debug_ranks, no_dashboard, run_dir, cluster, restart.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        try:
            return values[name]
        except KeyError:
            raise AttributeError(f"No cell option {name!r}; the cell options are: {', '.join(values)}.") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("CellOptions are frozen: use .replace(name=value)")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CellOptions) and self._values == other._values

    def __repr__(self) -> str:
        return f"CellOptions({self._values!r})"

    def replace(self, **changes: Any) -> CellOptions:
        unknown = set(changes) - set(self._values)
        if unknown:
            getattr(self, sorted(unknown)[0])  # the error naming the options
        return CellOptions({**self._values, **changes})

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


@dataclass(frozen=True)
class OptionOwner:
    """A plugin with options of its own: selected by ``--<kind> <name>`` (a launcher, a backend),
    or a record sink (kind ``sink``: its cell options turn it on).

    ``check(config)``: ValueError with the fix for settings it cannot run (pure), called when it
    is selected. ``complete(given)``: fill, in the options a line gives, what its options imply
    (the ssh launcher: ``-n`` from ``--hosts``).
    """

    kind: Literal["launcher", "backend", "sink"]
    name: str
    options: tuple[Option, ...] = ()
    check: Callable[[ClusterConfig], None] | None = None
    complete: Callable[[dict[str, Any]], None] | None = None


@dataclass(frozen=True)
class Frontend:
    """A way of running code on the ranks and showing it (the notebook's ``%%distributed``, ``jdist run``,
    ``jdist.ray.fit``), declared by the module that implements it: the options it honours. Every other
    option is refused by :meth:`OptionTable.refusal` with one line; an option a front end never decided on
    (a new one) is refused too, so nothing is accepted and silently ignored.

    ``honours``: jdist's own options (by name) it applies; ``plugins``: the kinds of plugin
    (:class:`OptionOwner`) whose options it applies (a front end that starts a cluster applies its
    launcher's and backend's, one that builds the run's sinks the sinks'); ``refuses``: jdist's options it
    does not apply, each with the reason and the way to get it (one line). ``all_options``: the
    notebook's cell, where every option is defined. ``restart`` and ``stacks``: how a user of this front
    end gets fresh ranks and sees where the ranks are, for the advice under a fault (None: it has no such
    command; ``jdist run``'s run ends with its ranks).

    >>> cli = Frontend("jdist run", honours=frozenset({"n", "output"}), plugins=frozenset({"sink"}),
    ...                refuses={"targets": "a script runs on every rank"})
    >>> cli.refusal(OptionTable().option("targets"))
    'jdist run does not take --targets: a script runs on every rank.'
    >>> cli.refusal(OptionTable().option("output")) is None
    True
    """

    name: str
    honours: frozenset[str] = frozenset()
    plugins: frozenset[str] = frozenset()
    refuses: Mapping[str, str] = field(default_factory=dict)
    all_options: bool = False
    restart: str | None = None
    stacks: str | None = None

    def refusal(self, option: Option, owner_kinds: Iterable[str] = ()) -> str | None:
        """Why this front end refuses ``option`` (one line naming the fix), or None if it honours it.
        ``owner_kinds``: the kinds of the plugins that define it (none: jdist's own)."""
        kinds = set(owner_kinds)
        if self.all_options or (kinds and kinds <= self.plugins) or (not kinds and option.name in self.honours):
            return None
        why = self.refuses.get(option.name) or ("it does not apply it yet" if not kinds else
                                                f"it does not apply {'/'.join(sorted(kinds))} plugins' options")
        return f"{self.name} does not take {option.flag}: {why}."


#: The notebook's ``%%distributed``: where every option is defined, every option is honoured.
NOTEBOOK = Frontend("%%distributed", all_options=True, restart="%dist restart", stacks="%dist stacks")


@dataclass(frozen=True)
class Plan:
    """What a cell's options do to the cluster: ``start`` one, ``restart`` it (with ``config``), or
    ``reuse`` it with the ``live`` changes applied."""

    action: Literal["start", "restart", "reuse"]
    config: ClusterConfig
    live: dict[str, Any] = field(default_factory=dict)


class OptionTable:
    """Every option: jdist's own and those of ``owners`` (:func:`jdist.plugins.option_table` passes
    the installed plugins). Raises TypeError when two define the same name differently."""

    def __init__(self, owners: Iterable[OptionOwner] = ()):
        self.owners = tuple(owners)
        by_name: dict[str, Option] = {o.name: o for o in (*cluster_options(), *CELL_OPTIONS)}
        self.owned: dict[str, list[OptionOwner]] = {}
        for owner in self.owners:
            for opt in owner.options:
                known = by_name.get(opt.name)
                if known is not None and (known != opt or opt.name not in self.owned):
                    first = self.owned.get(opt.name, [None])[0]
                    raise TypeError(f"Option {opt.name!r} of {owner.kind} {owner.name!r} is already defined "
                                    f"{'by ' + first.kind + ' ' + repr(first.name) if first else 'by jdist'}.")
                by_name[opt.name] = opt
                self.owned.setdefault(opt.name, []).append(owner)
        self.by_name = by_name

    # -- the table ---------------------------------------------------------------------------
    @property
    def cluster(self) -> list[Option]:
        """The cluster options (restart and live scope), jdist's first."""
        return [o for o in self.by_name.values() if o.scope is not Scope.CELL]

    @property
    def cell(self) -> list[Option]:
        """The cell options, jdist's first."""
        return [o for o in self.by_name.values() if o.scope is Scope.CELL]

    def option(self, name: str) -> Option:
        return self.by_name[name]

    def owner(self, kind: str, name: str) -> OptionOwner | None:
        return next((o for o in self.owners if o.kind == kind and o.name == name), None)

    def names(self, kind: str) -> list[str]:
        """The installed plugins of ``kind``, sorted (``--launcher``/``--backend`` choices)."""
        return sorted(o.name for o in self.owners if o.kind == kind)

    def parser_arguments(self, frontend: Frontend = NOTEBOOK) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
        """``argparse.add_argument`` arguments of every option ``frontend`` honours: cluster options, then
        cell options."""
        return [opt.argparse() for opt in self.honoured(frontend)]

    def honoured(self, frontend: Frontend) -> list[Option]:
        """The options ``frontend`` honours, cluster options first."""
        return [opt for opt in (*self.cluster, *self.cell) if self.refusal(frontend, opt.name) is None]

    def refusal(self, frontend: Frontend, name: str) -> str | None:
        """Why ``frontend`` refuses option ``name`` (one line), or None if it honours it.

        >>> OptionTable().refusal(NOTEBOOK, "debug_ranks") is None
        True
        """
        return frontend.refusal(self.by_name[name], (o.kind for o in self.owned.get(name, ())))

    def refuse_given(self, frontend: Frontend, given: Mapping[str, Any]) -> None:
        """ValueError (one line) for the first option given (by name; None: not given) that ``frontend``
        does not honour; unknown names are the caller's to report."""
        for name, value in given.items():
            if name not in self.by_name or value is None:
                continue
            why = self.refusal(frontend, name)
            if why:
                raise ValueError(why)

    # -- what a line gives ---------------------------------------------------------------------
    def requested(self, args: Any) -> dict[str, Any]:
        """The cluster options a parsed line gives (those not given are left out).

        ``-n N`` and ``--gpus N`` both set the rank count; ``--gpus`` also sets ``gpus``; an
        option that implies its owner selects it (``--hosts``: ``--launcher ssh``), and the
        selected launcher and backend fill in what their options imply.
        """
        given = {o.name: getattr(args, o.name) for o in self.cluster if getattr(args, o.name, None) is not None}
        profile = getattr(args, "cluster", None)
        if profile:
            counted = "n" in given or "gpus" in given  # the cell's -n/--gpus win over the profile's
            for name, value in self.load_profile(profile).items():
                if not (counted and name in ("n", "gpus")):
                    given.setdefault(name, value)
        n, gpus = given.pop("n", None), given.pop("gpus", None)
        if n is not None and gpus is not None:
            raise ValueError("Give either -n N (CPU ranks) or --gpus N (one GPU per rank), not both.")
        if n is not None:
            given.update(n=n, gpus=False)
        elif gpus is not None:
            given.update(n=gpus, gpus=True)
        for kind in ("launcher", "backend"):
            implied = self._implied(kind, given)
            if kind not in given and len(implied) == 1:
                given[kind] = next(iter(implied))
            owner = self.owner(kind, given.get(kind, self.option(kind).default))
            if owner is not None and owner.complete is not None:
                owner.complete(given)
        return given

    def _implied(self, kind: str, values: Mapping[str, Any]) -> dict[str, list[Option]]:
        """Owners of ``kind`` selected by the implying options among ``values``: name -> those options."""
        out: dict[str, list[Option]] = {}
        for name, value in values.items():
            opt = self.by_name.get(name)
            if opt is None or not opt.implies or value is None or value == opt.default:
                continue
            for owner in self.owned.get(name, []):
                if owner.kind == kind:
                    out.setdefault(owner.name, []).append(opt)
        return out

    def cell_options(self, args: Any) -> CellOptions:
        """This cell's :class:`CellOptions` from a parsed line (or a mapping): every cell option,
        its default where not given."""
        get = args.get if isinstance(args, Mapping) else (lambda name: getattr(args, name, None))
        return CellOptions({o.name: o.default if get(o.name) is None else get(o.name) for o in self.cell})

    def config(self, given: Mapping[str, Any]) -> ClusterConfig:
        """A :class:`ClusterConfig` from option values by name (plugin options go to ``plugin``;
        unknown names: ValueError)."""
        unknown = [k for k in given if k not in self.by_name or self.by_name[k].scope is Scope.CELL]
        if unknown:
            raise ValueError(f"Unknown cluster option(s) {', '.join(unknown)}; the cluster options are: "
                             f"{', '.join(o.name for o in self.cluster)}.")
        if "n" not in given:
            raise ValueError("No cluster is running: start one with %%distributed -n 2 (CPU ranks) or --gpus N.")
        core = {k: v for k, v in given.items() if k in _CORE_NAMES}
        plugin = {k: v for k, v in given.items()
                  if k not in _CORE_NAMES and v is not None and v != self.by_name[k].default}
        return ClusterConfig(**core, plugin=plugin)

    # -- checks ------------------------------------------------------------------------------
    def check(self, config: ClusterConfig) -> None:
        """ValueError with the fix: jdist's own checks, the launcher and backend exist, every plugin
        option given belongs to the selected launcher or backend, then their own checks (pure)."""
        config.check()
        for kind in ("backend", "launcher"):
            selected = getattr(config, kind)
            if self.owner(kind, selected) is None:
                raise ValueError(f"Unknown {kind} {selected!r}. Use --{kind} with one of: {', '.join(self.names(kind))}.")
        for kind in ("launcher", "backend"):
            implied = self._implied(kind, config.plugin)
            if len(implied) > 1:
                flags = [opts[0].flag for opts in implied.values()]
                raise ValueError(f"Give one of {' and '.join(flags)}: they select different {kind}s "
                                 f"({', '.join(implied)}).")
        for name, value in config.plugin.items():
            self._check_owned(config, name)
        for kind in ("launcher", "backend"):
            owner = self.owner(kind, getattr(config, kind))
            if owner is not None and owner.check is not None:
                owner.check(config)

    def _selected_owns(self, config: ClusterConfig, name: str) -> bool:
        """Whether option ``name`` belongs to the launcher or backend ``config`` selects (or to no plugin)."""
        owners = [o for o in self.owned.get(name, []) if o.kind in ("launcher", "backend")]
        return not owners or any(getattr(config, o.kind) == o.name for o in owners)

    def _check_owned(self, config: ClusterConfig, name: str) -> None:
        opt = self.by_name.get(name)
        if opt is None:
            raise ValueError(f"Unknown option {name!r}; the cluster options are: {', '.join(o.name for o in self.cluster)}.")
        owners = self.owned.get(name, [])
        kinds = {o.kind for o in owners}
        for kind in ("launcher", "backend"):
            if kind not in kinds:
                continue
            names = [o.name for o in owners if o.kind == kind]
            selected = getattr(config, kind)
            if selected in names:
                return
            if opt.implies:
                raise ValueError(f"{opt.flag} {'starts the ranks with' if kind == 'launcher' else 'selects'} "
                                 f"--{kind} {names[0]}; drop --{kind} {selected}.")
            selectors = sorted({o.flag for n in names for o in self.owner(kind, n).options if o.implies})  # type: ignore[union-attr]
            via = " or ".join([*selectors, *(f"--{kind} {n}" for n in names if not selectors)])
            raise ValueError(f"{opt.flag_names} is an option of --{kind} {', '.join(names)}, not of --{kind} "
                             f"{selected}: give {via}, or leave {opt.flag} out.")

    # -- a running cluster -------------------------------------------------------------------------
    def plan(self, given: Mapping[str, Any], running: ClusterConfig | None, restart: bool) -> Plan:
        """What ``given`` (:meth:`requested`) asks of the ``running`` cluster's config (None: none runs).

        Raises ValueError with the fix: no cluster and no rank count, a restart-scope option that
        differs without ``restart``, or a config that :meth:`check` refuses.
        """
        if running is None:
            config = self.config(given)
            self.check(config)
            return Plan("start", config)
        if restart:  # options not given are kept, except those of a launcher or backend no longer selected
            config = running.replace(**given)
            config = config.replace(**{name: None for name in config.plugin
                                       if name not in given and not self._selected_owns(config, name)})
            self.check(config)
            return Plan("restart", config)
        conflicts, live = [], {}
        for name in [o.name for o in self.cluster if o.name in given]:  # in the order the options are defined
            value, old = given[name], running.get(name, self.by_name[name].default)
            if value == old:
                continue
            if self.by_name[name].scope is Scope.RESTART:
                if name in ("n", "gpus"):  # given together (requested)
                    conflicts.append(f"{'--gpus' if given['gpus'] else '-n'} {given['n']} (running: {running.ranks_flag})")
                else:
                    conflicts.append(f"{self.by_name[name].flag} {_show(value)} "
                                     f"(running: {_show(old) if old is not None else 'none'})")
            else:
                live[name] = value
        conflicts = list(dict.fromkeys(conflicts))
        if conflicts:
            raise ValueError(
                f"A cluster is running with different options: {'; '.join(conflicts)}. "
                "Add --restart to replace it (rank state is lost), or drop these options to reuse it."
            )
        config = running.replace(**live)
        self.check(config)
        return Plan("reuse", config, live)

    def live_messages(self, changes: Mapping[str, Any]) -> list[str]:
        """What the live ``changes`` print (options with a :attr:`Option.message`)."""
        return [self.by_name[k].message.format(v) for k, v in changes.items()  # type: ignore[union-attr]
                if self.by_name[k].message]

    def rank_options(self, config: ClusterConfig) -> dict[str, Any]:
        """The values the ranks apply at set-up: each of jdist's own options ``applied_by="ranks"``
        and every option of the selected backend (its default where not given)."""
        backend = self.owner("backend", config.backend)
        plugins = {o.name for owner in self.owners for o in owner.options}
        names = [o.name for o in self.cluster if o.applied_by == "ranks" and o.name not in plugins]
        names += [o.name for o in (backend.options if backend else ()) if o.name not in names]
        return {name: config.get(name, self.by_name[name].default) for name in names}

    # -- profiles and the sidebar ---------------------------------------------------------------
    def load_profile(self, name: str, path: Path | None = None) -> dict[str, Any]:
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
        names = {o.name for o in self.cluster}
        out: dict[str, Any] = {}
        for key, value in profiles[name].items():
            option = key.replace("-", "_")
            if option not in names:
                raise ValueError(f"--cluster {name}: {key!r} in {path} is not a cluster option; use: "
                                 f"{', '.join(sorted(names))}.")
            out[option] = value
        return out

    def describe(self, config: ClusterConfig) -> list[dict[str, str]]:
        """The options of a config as the sidebar lists them: jdist's own, then the plugin options given.

        >>> OptionTable().describe(ClusterConfig(n=2))[:2]  # doctest: +NORMALIZE_WHITESPACE
        [{'name': 'n', 'flag': '-n', 'value': '2', 'scope': 'restart', 'help': 'Number of ranks: CPU ranks (gloo), or with --gpus one CUDA GPU each.'},
         {'name': 'gpus', 'flag': '--gpus', 'value': 'no', 'scope': 'restart', 'help': 'Number of ranks with one CUDA GPU each (NCCL).'}]
        """
        out = []
        for name, value in config.as_dict().items():
            opt = self.by_name.get(name)
            if opt is None:
                continue
            text = ("yes" if value else "no") if isinstance(value, bool) else ("default" if value is None else _show(value))
            out.append({"name": name, "flag": opt.flag, "value": text, "scope": opt.scope.value, "help": opt.help})
        return out


def profiles_file() -> Path:
    """Where ``--cluster NAME`` profiles live: ``<jupyter config dir>/jdist/clusters.toml``."""
    from jupyter_core.paths import jupyter_config_dir

    return Path(jupyter_config_dir()) / "jdist" / "clusters.toml"


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


__all__ = [
    "CELL_OPTIONS",
    "CellOptions",
    "ClusterConfig",
    "Frontend",
    "NOTEBOOK",
    "Option",
    "OptionOwner",
    "OptionTable",
    "PRECISIONS",
    "Plan",
    "Scope",
    "cluster_options",
    "profiles_file",
]
