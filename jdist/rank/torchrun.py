"""torchrun compatibility on every rank: code written for ``torchrun`` runs unchanged in cells.

After set-up each rank has the environment ``torchrun`` gives its workers (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``OMP_NUM_THREADS``...), consistent with jdist's
``rank``, ``local_rank`` and ``device``; CPU ranks also have ``ACCELERATE_USE_CPU=true`` (as
``accelerate launch --cpu`` sets). jdist has already formed the default process group, so:

* ``torch.distributed.init_process_group(...)`` is accepted when it asks for what jdist
  runs (same backend, world size and rank): jdist's group is used and one note says so. Any
  other request is one line that says what differs and what to do.
* ``torch.distributed.destroy_process_group()`` of the default group keeps it (one note):
  the next cell, and every object prepared before, still has a working group.

jdist's own code calls the real functions (:func:`real_init_process_group`,
:func:`real_destroy_process_group`). Accelerate, the Hugging Face ``Trainer`` and
Lightning see a torchelastic worker and use the existing group (docs/frameworks.md).

Example (what a rank of a 2-rank CPU cluster sees; the values are set by :func:`install`):
    >>> env = torchrun_environment(rank=1, world_size=2, local_rank=1, local_world_size=2,
    ...                            node_rank=0, nodes=1, master_addr="127.0.0.1", master_port=29500, run_id="c1")
    >>> env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["GROUP_RANK"], env["TORCHELASTIC_RUN_ID"]
    ('1', '1', '2', '0', 'c1')
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
from typing import Any, Callable

from .backends.base import RankContext
from .imports import AfterImport

_REAL: dict[str, Callable[..., Any]] = {}
_noted: set[str] = set()


def torchrun_environment(*, rank: int, world_size: int, local_rank: int, local_world_size: int, node_rank: int,
                         nodes: int, master_addr: str, master_port: int, run_id: str) -> dict[str, str]:
    """The variables ``torchrun`` sets for one worker (static rendezvous, no restarts)."""
    values = {
        "RANK": rank, "WORLD_SIZE": world_size, "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": local_world_size,
        "GROUP_RANK": node_rank, "GROUP_WORLD_SIZE": nodes, "ROLE_NAME": "default", "ROLE_RANK": rank,
        "ROLE_WORLD_SIZE": world_size, "MASTER_ADDR": master_addr, "MASTER_PORT": master_port,
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": 0, "TORCHELASTIC_MAX_RESTARTS": 0,
    }
    return {key: str(value) for key, value in values.items()}


def install(ctx: RankContext, run_id: str) -> dict[str, str]:
    """Set the torchrun environment of this rank and route user calls of
    ``init_process_group``/``destroy_process_group`` through jdist (collective over MPI:
    every rank calls it during set-up). Returns the variables set."""
    hosts = ctx.comm.allgather(ctx.hostname)
    order = list(dict.fromkeys(hosts))  # hosts in order of their first rank
    port = ctx.port or ctx.comm.bcast(_free_port(ctx.master_addr) if ctx.rank == 0 else None, root=0)
    env = torchrun_environment(rank=ctx.rank, world_size=ctx.world_size, local_rank=ctx.local_rank,
                               local_world_size=ctx.local_world_size, node_rank=order.index(ctx.hostname),
                               nodes=len(order), master_addr=ctx.master_addr, master_port=port, run_id=run_id)
    import torch

    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(torch.get_num_threads())
    if ctx.device_kind == "cpu":  # what `accelerate launch --cpu` sets: Accelerate and the HF Trainer use CPU ranks
        env["ACCELERATE_USE_CPU"] = os.environ.get("ACCELERATE_USE_CPU") or "true"
    os.environ.update(env)
    _patch()
    _after_imports()
    return env


#: Modules that decide "interactive" once, at import; on a rank they must decide "a worker".
_INTERACTIVE_FLAGS = ("lightning.fabric.utilities.imports", "lightning_fabric.utilities.imports")


def _after_imports() -> None:
    """Adjust frameworks that decide at import what a rank is (now if imported, else right after)."""
    hooks: dict[str, Callable[[Any], None]] = {name: _worker_flags for name in _INTERACTIVE_FLAGS}
    hooks["accelerate.state"] = _deepspeed_on_cpu_ranks
    for name, hook in hooks.items():
        if name in sys.modules:
            hook(sys.modules[name])
    if not any(isinstance(f, AfterImport) and f.hooks.keys() == hooks.keys() for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(hooks))


def _worker_flags(module: Any) -> None:
    """Lightning refuses ``strategy="ddp"`` when ``sys.ps1`` exists (it would spawn copies of a
    script), and every IPython kernel sets ``sys.ps1``. A rank is a worker that torchelastic
    started: it spawns nothing (Lightning's ``TorchElasticEnvironment`` says processes are
    created externally). So Lightning's ``_IS_INTERACTIVE`` is False here; ``sys.ps1`` itself stays."""
    module._IS_INTERACTIVE = False
    prefix = module.__name__.split(".")[0] + "."
    for other in list(sys.modules.values()):  # modules that already copied the flag
        if getattr(other, "__name__", "").startswith(prefix) and getattr(other, "_IS_INTERACTIVE", None) is True:
            other._IS_INTERACTIVE = False


def _deepspeed_on_cpu_ranks(state: Any) -> None:
    """Accelerate reads ``ACCELERATE_USE_CPU`` (set on CPU ranks, so that it uses them) as "not
    DeepSpeed": its ``AcceleratorState`` turns to DeepSpeed only when not on CPU, and the HF
    ``Trainer(args=TrainingArguments(deepspeed=...))`` then trains with DDP, silently. When a DeepSpeed
    plugin is given on a CPU rank, the process state is made for CPU ranks (as ``use_cpu=True``
    makes it) and the accelerator state without the flag, so DeepSpeed runs on jdist's group."""
    cls = state.AcceleratorState
    real = cls.__init__
    if getattr(real, "jdist_wrapped", False):
        return

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(real).bind(self, *args, **kwargs)
        flag = os.environ.get("ACCELERATE_USE_CPU")
        if bound.arguments.get("deepspeed_plugin") is None or not flag:
            return real(self, *args, **kwargs)
        if not state.PartialState._shared_state:
            state.PartialState(cpu=True)  # what TrainingArguments(use_cpu=True) makes first
        bound.arguments["cpu"] = False
        del os.environ["ACCELERATE_USE_CPU"]
        try:
            return real(*bound.args, **bound.kwargs)
        finally:
            os.environ["ACCELERATE_USE_CPU"] = flag

    init.jdist_wrapped = True  # type: ignore[attr-defined]
    cls.__init__ = init


def _free_port(addr: str) -> int:
    """A TCP port free on ``addr`` now (what torchrun's ``--master-port`` would be; jdist's own
    group needs none on one host, a user group formed with ``env://`` binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def _patch() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not _REAL:
        _REAL["init_process_group"] = c10d.init_process_group
        _REAL["destroy_process_group"] = c10d.destroy_process_group
        _REAL["new_group"] = c10d.new_group
    for module in (dist, c10d):
        module.init_process_group = init_process_group  # type: ignore[assignment]
        module.destroy_process_group = destroy_process_group  # type: ignore[assignment]
        module.new_group = new_group  # type: ignore[assignment]


def new_group(*args: Any, **kwargs: Any) -> Any:
    """``torch.distributed.new_group`` on a jdist rank: torch's, and the sockets the group opens are noted by
    the rank's guard, so an interrupt or a hang releases a collective waiting in it too: the user's groups,
    ``new_subgroups``, and a library's own (DeepSpeed's clone of the world group, which it forms again
    after the release: a backend spec's ``forget_groups``)."""
    import torch.distributed.distributed_c10d as c10d

    from .guard import socket_fds
    from .session import current

    before = socket_fds()
    group = _REAL.get("new_group", c10d.new_group)(*args, **kwargs)
    s = current()
    if s is not None and s.guard is not None:
        s.guard.note_group_sockets(before, more=True)
    return group


def real_init_process_group(*args: Any, **kwargs: Any) -> Any:
    """torch's own ``init_process_group`` (jdist's set-up and repair use it)."""
    import torch.distributed.distributed_c10d as c10d

    return _REAL.get("init_process_group", c10d.init_process_group)(*args, **kwargs)


def real_destroy_process_group(*args: Any, **kwargs: Any) -> Any:
    """torch's own ``destroy_process_group`` (jdist's teardown and repair use it)."""
    import torch.distributed.distributed_c10d as c10d

    return _REAL.get("destroy_process_group", c10d.destroy_process_group)(*args, **kwargs)


def _note(key: str, text: str) -> None:
    if key not in _noted:
        _noted.add(key)
        print(f"jdist: {text}", file=sys.stderr, flush=True)


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` on a jdist rank: the group jdist formed, if it is
    what the call asks for; otherwise one line that says what differs."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return real_init_process_group(*args, **kwargs)
    try:
        asked = inspect.signature(_REAL["init_process_group"]).bind(*args, **kwargs).arguments
    except TypeError as exc:
        raise TypeError(f"init_process_group: {exc}") from None
    have = dist.get_backend()
    problem = incompatibility(asked, backend=have, world_size=dist.get_world_size(), rank=dist.get_rank())
    if problem:
        raise RuntimeError(problem)
    _note("init", f"init_process_group(): using the {have} process group jdist set up "
                  f"({dist.get_world_size()} ranks); it stays for the next cells.")


def incompatibility(asked: dict[str, Any], *, backend: str, world_size: int, rank: int) -> str | None:
    """Why an ``init_process_group`` call with the arguments ``asked`` cannot use jdist's group
    (``backend``, ``world_size``, ``rank``), or None when it can.

    >>> incompatibility({"backend": "gloo"}, backend="gloo", world_size=2, rank=0) is None
    True
    >>> print(incompatibility({"backend": "nccl"}, backend="gloo", world_size=2, rank=0))
    init_process_group(backend='nccl'): jdist's ranks run a gloo process group (CPU ranks); use backend='gloo' or leave it out, or start GPU ranks: %%distributed --gpus N --restart
    >>> print(incompatibility({"world_size": 4}, backend="gloo", world_size=2, rank=0))
    init_process_group(world_size=4): jdist's process group has 2 ranks; leave world_size out (or int(os.environ['WORLD_SIZE'])), or start 4 ranks: %%distributed -n 4 --restart
    """
    want = asked.get("backend")
    if want is not None:
        names = {part.split(":")[-1].strip().lower() for part in str(want).split(",")}
        if backend.lower() not in names and not (backend == "gloo" and "cpu" in names):
            kind, more = ("CPU", ", or start GPU ranks: %%distributed --gpus N --restart") if backend == "gloo" \
                else ("GPU", "")
            return (f"init_process_group(backend={str(want)!r}): jdist's ranks run a {backend} process group "
                    f"({kind} ranks); use backend={backend!r} or leave it out{more}")
    asked_world = asked.get("world_size", -1)
    if asked_world not in (-1, None) and int(asked_world) != world_size:
        return (f"init_process_group(world_size={asked_world}): jdist's process group has {world_size} ranks; "
                f"leave world_size out (or int(os.environ['WORLD_SIZE'])), or start {asked_world} ranks: "
                f"%%distributed -n {asked_world} --restart")
    asked_rank = asked.get("rank", -1)
    if asked_rank not in (-1, None) and int(asked_rank) != rank:
        return (f"init_process_group(rank={asked_rank}) on jdist's rank {rank}: leave rank out "
                f"(or int(os.environ['RANK']))")
    if asked.get("group_name"):
        return (f"init_process_group(group_name={asked['group_name']!r}): the default group is jdist's; "
                "make another with torch.distributed.new_group(...)")
    return None


def destroy_process_group(group: Any = None) -> None:
    """``torch.distributed.destroy_process_group`` on a jdist rank: a subgroup is destroyed; the
    default group is kept (the cluster's next cells need it)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if group is not None and group is not dist.group.WORLD and group is not dist.distributed_c10d._get_default_group():
        real_destroy_process_group(group)
        return
    _note("destroy", "destroy_process_group(): kept jdist's process group for the next cells "
                     "(%dist stop ends it).")
