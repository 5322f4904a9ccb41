"""Plugins found by name through entry points (seen by every process), and the one option table.

A package of your own adds a plugin without changing jdist (``pip install`` it into the
environment of the kernel and of the ranks), with one entry point:

``jdist.launchers``
    a :class:`jdist.kernel.launch.RankLauncher` class (kernel side): how ranks start. Its
    ``options``, ``check`` and ``complete`` join the option table.
``jdist.backends``
    a :class:`BackendSpec`: light metadata the kernel reads to check a ``--backend`` before any
    rank starts (its options, the modules it needs and the fix when they are missing, how its
    waiting stacks look), and the import path of its :class:`jdist.rank.backends.Backend` class,
    which only the ranks import.
``jdist.sinks``
    a :class:`SinkSpec`: a destination for a cell's records (like ``--tensorboard``), with the
    cell options that turn it on.
``jdist.metrics``
    a :class:`MetricSpec`: automatic metrics (names and meanings) and the rank-side source that
    measures them.
``jdist.panels``
    a dashboard panel: a function of a :class:`jdist.metrics.Run` returning a
    :class:`jdist.metrics.panels.LineDef` or a :class:`~jdist.protocol.BarPanel`.

::

    [project.entry-points."jdist.backends"]
    deepspeed = "my_pkg.specs:DEEPSPEED"     # BackendSpec("deepspeed", "my_pkg.backend:DeepSpeedBackend", ...)

jdist's own plugins are registered the same way (pyproject.toml; its backends' specs are in
:mod:`jdist.backends`, beside nothing else: this module holds the types and the registry). :func:`option_table` is every
``%%distributed`` option: jdist's own (:mod:`jdist.options`) and each installed plugin's.

Example:
    >>> available_backends()
    ['ddp', 'deepspeed', 'fsdp', 'horovod', 'tf']
    >>> backend_spec("ddp").factory
    'jdist.rank.backends.ddp:DDPBackend'
    >>> option_table().option("hosts").flag
    '--hosts'
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Callable, Iterable

from jdist.common.stacks import COLLECTIVE_PATHS
from jdist.options import ClusterConfig, Option, OptionOwner, OptionTable, Scope

BACKENDS_GROUP = "jdist.backends"
LAUNCHERS_GROUP = "jdist.launchers"
SINKS_GROUP = "jdist.sinks"
METRICS_GROUP = "jdist.metrics"
PANELS_GROUP = "jdist.panels"


@cache
def _all_entry_points() -> Any:
    """Every installed distribution's entry points, read once (each ``entry_points(group=)`` call
    reads every distribution's metadata again)."""
    return entry_points()


@cache
def _entry_points(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in _all_entry_points().select(group=group)}


def load_object(path: str) -> Any:
    """The object at ``"package.module:name"``."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _missing(requires: tuple[str, ...]) -> list[str]:
    def found(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ValueError:  # in sys.modules as None: blocked
            return False

    return [m for m in requires if not found(m)]


@dataclass(frozen=True)
class BackendSpec:
    """A training backend as the kernel sees it (nothing here imports torch).

    ``factory``: ``"module:Class"`` of its :class:`jdist.rank.backends.Backend` (imported on
    the ranks). ``options``: its own ``%%distributed`` options (their values reach the backend
    as ``ctx.options``); ``check(config)``: ValueError with the fix for settings it cannot run.
    ``requires``: modules that must be importable, checked before any rank starts;
    ``install_hint``: the fix when one is missing. ``backward_waits``: a backward pass waits
    for other ranks (gradients are all-reduced inside it); ``collective_paths``: path
    fragments of the frames in which a rank waits for the others (hang detection, releases);
    ``spins``: a rank blocked in a collective still keeps a core busy (Horovod's MPI thread
    polls), so the hang watchdog cannot use its process's CPU time as evidence. ``framework``:
    what the ranks run, ``"torch"`` (the device pinned with torch, torchrun's environment) or
    ``"tf"`` (no torch imported on the ranks); ``preimport``: modules each engine imports before
    it connects (overlapping the controller's start); ``hints``: ``(text, line)`` pairs: a rank's
    error whose ``ename: evalue`` contains ``text`` gets ``line`` under it (a known upstream failure
    and its fix). ``slots``: its group is torch's default group, which ``jdist.tune`` can tile into slot groups
    of ``per_trial`` ranks for its trials (and form again over the world after the sweep). ``releases``: a rank
    blocked in one of its collectives can be released (torch's groups: the rank's guard breaks their
    sockets); without it, a rank that does not stop after a release is restarted with the others.
    ``forget_groups``: ``"module:function"`` (rank side) that makes the library drop the process groups it
    keeps for later (DeepSpeed's clone of the world group, reused by its next engine). A release breaks
    every group, the library's too, and the default group is then made again; this is called on every rank
    after that, whichever backend runs, when each of ``requires`` is imported there, so that the library
    forms its groups again rather than use the broken ones.
    """

    name: str
    factory: str
    help: str = ""
    requires: tuple[str, ...] = ()
    install_hint: str = ""
    backward_waits: bool = False
    collective_paths: tuple[str, ...] = COLLECTIVE_PATHS
    spins: bool = False
    options: tuple[Option, ...] = ()
    check: Callable[[ClusterConfig], None] | None = None
    framework: str = "torch"
    preimport: tuple[str, ...] = ("torch",)
    hints: tuple[tuple[str, str], ...] = ()
    slots: bool = False
    releases: bool = True
    forget_groups: str = ""

    def hints_for(self, errors: Iterable[str]) -> list[str]:
        """The hint lines for these ``ename: evalue`` lines, each once, in the order of :attr:`hints`.

        >>> BackendSpec("x", "m:C", hints=(("PerReplica", "use tf.keras"),)).hints_for(["ValueError: a PerReplica"])
        ['use tf.keras']
        """
        errors = list(errors)
        return [line for text, line in self.hints if any(text in e for e in errors)]

    def unavailable(self) -> str | None:
        """Why this backend cannot run in this environment (with the fix), or None.

        >>> BackendSpec("x", "m:C", requires=("no_such_module_here",), install_hint="pip install it").unavailable()
        'pip install it'
        """
        missing = _missing(self.requires)
        if not missing:
            return None
        return self.install_hint or f"--backend {self.name} needs {', '.join(missing)}; install it in this environment."

    def load(self) -> type:
        """The backend class (on the ranks)."""
        return load_object(self.factory)

    def imported(self) -> bool:
        """Whether each of :attr:`requires` is imported in this process already (nothing is imported here).

        >>> BackendSpec("x", "m:C", requires=("sys",)).imported()
        True
        >>> BackendSpec("y", "m:C", requires=("no_such_module",)).imported()
        False
        """
        return all(m in sys.modules for m in self.requires)

    def owner(self) -> OptionOwner:
        return OptionOwner("backend", self.name, self.options, self.check)


@dataclass(frozen=True)
class SinkSpec:
    """A destination for a cell's records, on in the cells that give one of its ``options``
    (cell scope). ``factory``: ``"module:function"`` (kernel side), called with the run and the
    cell's :class:`~jdist.options.CellOptions`; returns a :class:`jdist.kernel.sinks.RecordSink`,
    or None when this cell did not ask for it. ``requires``/``install_hint``: as for backends,
    checked before the cell runs.
    """

    name: str
    factory: str
    options: tuple[Option, ...]
    help: str = ""
    requires: tuple[str, ...] = ()
    install_hint: str = ""

    def unavailable(self) -> str | None:
        """Why this sink cannot run here (with the fix), or None."""
        missing = _missing(self.requires)
        if not missing:
            return None
        flags = "/".join(o.flag for o in self.options)
        return self.install_hint or f"{flags} needs {', '.join(missing)}; install it in this environment."

    def wanted(self, opts: Any) -> bool:
        """Whether this cell's options turn it on."""
        return any(getattr(opts, o.name) not in (None, False, o.default) for o in self.options)

    def load(self) -> Callable[..., Any]:
        return load_object(self.factory)

    def owner(self) -> OptionOwner:
        return OptionOwner("sink", self.name, self.options)


@dataclass(frozen=True)
class MetricSpec:
    """Automatic metrics from a package: their names and meanings (``metrics``, in the order its
    source sets them), and ``factory``: ``"module:Class"`` of the
    :class:`jdist.rank.sources.MetricSource` that measures them on the ranks (imported there only).
    """

    name: str
    factory: str
    metrics: tuple[tuple[str, str], ...]

    def load(self) -> type:
        return load_object(self.factory)


def _load_specs(group: str, kind: type) -> dict[str, Any]:
    specs = {}
    for name, ep in _entry_points(group).items():
        spec = ep.load()
        if not isinstance(spec, kind) or spec.name != name:
            raise TypeError(f"entry point {name} = {ep.value} in group {group} must be a {kind.__name__} named {name!r}")
        specs[name] = spec
    return specs


@cache
def backend_specs() -> dict[str, BackendSpec]:
    """Every backend installed in this environment, by name."""
    return _load_specs(BACKENDS_GROUP, BackendSpec)


#: Said when no plugin of jdist's own is found: the package is importable but its entry points are not
#: registered (a checkout on ``sys.path`` or ``PYTHONPATH`` rather than an installed distribution).
NOT_INSTALLED = ("jdist's backends and launchers are not registered: jdist is importable but not installed. "
                 "Install it with `pip install -e .` in the checkout (or `pip install jdist`).")


def available_backends() -> list[str]:
    """Names accepted by ``--backend``, sorted."""
    return sorted(backend_specs())


def backend_spec(name: str) -> BackendSpec:
    """The backend called ``name``; a ValueError naming the choices otherwise.

    >>> backend_spec("nope")
    Traceback (most recent call last):
    ...
    ValueError: Unknown backend 'nope'. Use --backend with one of: ddp, deepspeed, fsdp, horovod, tf.
    """
    try:
        return backend_specs()[name]
    except KeyError:
        names = available_backends()
        raise ValueError(
            f"Unknown backend {name!r}. Use --backend with one of: {', '.join(names)}." if names else NOT_INSTALLED
        ) from None


def available_launchers() -> list[str]:
    """Names accepted by ``--launcher``, sorted."""
    return sorted(_entry_points(LAUNCHERS_GROUP))


def launcher_class(name: str) -> type:
    """The launcher class called ``name`` (kernel side); a ValueError naming the choices otherwise."""
    try:
        ep = _entry_points(LAUNCHERS_GROUP)[name]
    except KeyError:
        names = available_launchers()
        raise ValueError(
            f"Unknown launcher {name!r}. Use --launcher with one of: {', '.join(names)}." if names else NOT_INSTALLED
        ) from None
    return ep.load()


@cache
def sink_specs() -> dict[str, SinkSpec]:
    """Every record sink plugin installed here, by name (kernel side)."""
    return _load_specs(SINKS_GROUP, SinkSpec)


@cache
def metric_specs() -> tuple[MetricSpec, ...]:
    """The automatic metrics of installed plugins, in entry-point name order."""
    specs = _load_specs(METRICS_GROUP, MetricSpec)
    return tuple(specs[name] for name in sorted(specs))


@cache
def panel_plugins() -> tuple[Callable[[Any], Any], ...]:
    """The dashboard panels of installed plugins (after jdist's own), in entry-point name order."""
    eps = _entry_points(PANELS_GROUP)
    return tuple(eps[name].load() for name in sorted(eps))


@cache
def option_table() -> OptionTable:
    """Every ``%%distributed`` option: jdist's own, then each installed launcher's, backend's and
    sink's (kernel side: it imports the launcher classes)."""
    owners: list[OptionOwner] = []
    for name in available_launchers():
        cls = launcher_class(name)
        if getattr(cls, "name", None) != name:
            raise TypeError(f"entry point {name} in group {LAUNCHERS_GROUP} must be a launcher class named {name!r}")
        owners.append(OptionOwner("launcher", name, tuple(cls.options), cls.check, cls.complete))
    owners += [spec.owner() for spec in backend_specs().values()]
    for spec in sink_specs().values():
        if any(o.scope is not Scope.CELL for o in spec.options):
            raise TypeError(f"sink {spec.name!r}: its options must have cell scope (Scope.CELL)")
        owners.append(spec.owner())
    return OptionTable(owners)
