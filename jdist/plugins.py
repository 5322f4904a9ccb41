"""Backends and launchers found by name, through entry points (seen by every process).

Two entry-point groups, so that a package of your own adds a backend or a launcher without
changing jdist (``pip install`` it into the environment of the kernel and of the ranks):

``jdist.backends``
    Each entry is a :class:`BackendSpec`: light metadata the kernel reads to check a
    ``--backend`` before any rank starts (its name, the modules it needs, the fix when they
    are missing, how its waiting stacks look), and the import path of its
    :class:`jdist.rank.backends.Backend` class, which only the ranks import::

        [project.entry-points."jdist.backends"]
        deepspeed = "my_pkg.specs:DEEPSPEED"     # BackendSpec("deepspeed", "my_pkg.backend:DeepSpeedBackend", ...)

``jdist.launchers``
    Each entry is a :class:`jdist.kernel.launch.RankLauncher` class (kernel side)::

        [project.entry-points."jdist.launchers"]
        slurm = "my_pkg.launch:SlurmLauncher"

jdist's own backends and launchers are registered the same way (pyproject.toml).

Example:
    >>> available_backends()
    ['ddp', 'fsdp', 'horovod']
    >>> backend_spec("ddp").factory
    'jdist.rank.backends.ddp:DDPBackend'
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from jdist.stacks import COLLECTIVE_PATHS

BACKENDS_GROUP = "jdist.backends"
LAUNCHERS_GROUP = "jdist.launchers"


@dataclass(frozen=True)
class BackendSpec:
    """A training backend as the kernel sees it (nothing here imports torch).

    ``factory``: ``"module:Class"`` of its :class:`jdist.rank.backends.Backend` (imported on
    the ranks). ``requires``: modules that must be importable, checked before any rank
    starts; ``install_hint``: the fix when one is missing. ``backward_waits``: a backward pass
    waits for other ranks (gradients are all-reduced inside it); ``collective_paths``: path
    fragments of the frames in which a rank waits for the others (hang detection, releases);
    ``spins``: a rank blocked in a collective still keeps a core busy (Horovod's MPI thread
    polls), so the hang watchdog cannot use its process's CPU time as evidence.
    """

    name: str
    factory: str
    help: str = ""
    requires: tuple[str, ...] = ()
    install_hint: str = ""
    backward_waits: bool = False
    collective_paths: tuple[str, ...] = COLLECTIVE_PATHS
    spins: bool = False

    def unavailable(self) -> str | None:
        """Why this backend cannot run in this environment (with the fix), or None.

        >>> BackendSpec("x", "m:C", requires=("no_such_module_here",), install_hint="pip install it").unavailable()
        'pip install it'
        """
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if not missing:
            return None
        return self.install_hint or f"--backend {self.name} needs {', '.join(missing)}; install it in this environment."

    def load(self) -> type:
        """The backend class (on the ranks)."""
        return load_object(self.factory)


def load_object(path: str) -> Any:
    """The object at ``"package.module:name"``."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


HOROVOD_INSTALL_HINT = (
    "Horovod is not installed in this environment. Install it with `make horovod` from a jdist checkout "
    "(runs tools/build_horovod.sh: builds Horovod 0.28.1 against your torch with MPI, 3-8 minutes once, "
    "then cached), then %dist restart. Or pick --backend ddp or --backend fsdp."
)

DDP = BackendSpec("ddp", "jdist.rank.backends.ddp:DDPBackend", backward_waits=True,
                  help="PyTorch DistributedDataParallel (gradients all-reduced during backward)")
FSDP = BackendSpec("fsdp", "jdist.rank.backends.fsdp:FSDPBackend",
                   help="PyTorch FSDP2 fully_shard (parameters, gradients and optimizer state sharded)")
HOROVOD = BackendSpec("horovod", "jdist.rank.backends.horovod:HorovodBackend", requires=("horovod",),
                      install_hint=HOROVOD_INSTALL_HINT,
                      collective_paths=(*COLLECTIVE_PATHS, "/horovod/torch/mpi_ops.py", "/horovod/common/"),
                      spins=True,
                      help="Horovod DistributedOptimizer over the ranks' MPI world")


@cache
def backend_specs() -> dict[str, BackendSpec]:
    """Every backend installed in this environment, by name."""
    specs = {}
    for ep in entry_points(group=BACKENDS_GROUP):
        spec = ep.load()
        if not isinstance(spec, BackendSpec) or spec.name != ep.name:
            raise TypeError(f"entry point {ep.name} = {ep.value} in group {BACKENDS_GROUP} must be a "
                            f"BackendSpec named {ep.name!r}")
        specs[ep.name] = spec
    return specs


def available_backends() -> list[str]:
    """Names accepted by ``--backend``, sorted."""
    return sorted(backend_specs())


def backend_spec(name: str) -> BackendSpec:
    """The backend called ``name``; a ValueError naming the choices otherwise.

    >>> backend_spec("nope")
    Traceback (most recent call last):
    ...
    ValueError: Unknown backend 'nope'. Use --backend with one of: ddp, fsdp, horovod.
    """
    try:
        return backend_specs()[name]
    except KeyError:
        raise ValueError(
            f"Unknown backend {name!r}. Use --backend with one of: {', '.join(available_backends())}."
        ) from None


@cache
def _launcher_entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=LAUNCHERS_GROUP)}


def available_launchers() -> list[str]:
    """Names accepted by ``--launcher``, sorted."""
    return sorted(_launcher_entry_points())


def launcher_class(name: str) -> type:
    """The launcher class called ``name`` (kernel side); a ValueError naming the choices otherwise."""
    try:
        ep = _launcher_entry_points()[name]
    except KeyError:
        raise ValueError(
            f"Unknown launcher {name!r}. Use --launcher with one of: {', '.join(available_launchers())}."
        ) from None
    return ep.load()
