"""Resizing a live session: what the ranks carry from one world to the next (``%dist resize``).

:func:`snapshot` (collective, on the old world) writes into a folder every rank can read:

- each model that a variable holds (prepared, or parallelized by the code itself), with the optimizer whose
  parameters it holds and the LR scheduler of that optimizer, through :func:`jdist.save_checkpoint` (so each backend's own layout: one file of
  the replicated state for DDP and Horovod, ``torch.distributed.checkpoint`` shards for FSDP2 and DTensor models,
  which are resharded to the new world when loaded);
- each prepared loader's place in its epoch, as the samples of the epoch consumed by all ranks together
  (:meth:`jdist.rank.data.ResumableLoader.elastic_state`), which the new world splits anew;
- the plain variables that are the same on every rank (their pickles compared by digest): rank 0's pickle.
  Those that differ per rank or cannot be pickled are named as not carried.

The kernel then starts the new world, replays the set-up cells, and :func:`restore` (collective, on the new world)
loads the state into what they built, under the same variable names, and sets the carried variables.

Example (what the kernel runs on every rank):
    >>> manifest = snapshot("/shared/resize-1")      # doctest: +SKIP
    >>> restore("/shared/resize-1", manifest)         # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import pickle
import sys
import time
import types
from pathlib import Path
from typing import Any

from .checkpoint import _inner_optimizer as _inner  # (a prepared optimizer's torch optimizer)
from .namespace import user_ns
from .session import session

#: The names jdist itself defines in a rank's namespace: they belong to the world they were made in.
WORLD_NAMES = frozenset({"rank", "world_size", "local_rank", "device", "jdist", "mesh", "In", "Out", "exit", "quit",
                         "get_ipython", "mpi_rank", "mpi_size"})
#: The variables' pickles are kept in this file of the snapshot's folder.
VARIABLES_FILE = "variables.pkl"


def _world_objects() -> tuple[type, ...]:
    """Types whose values are rebuilt by the set-up cells, never carried as pickles: modules, optimizers,
    schedulers, loaders, datasets, samplers, meshes and process groups (their state goes through
    :func:`jdist.save_checkpoint`), functions and classes."""
    kinds: list[type] = [types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type]
    torch = sys.modules.get("torch")
    if torch is not None:
        kinds += [torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler,
                  torch.utils.data.DataLoader, torch.utils.data.Dataset, torch.utils.data.Sampler,
                  torch.nn.Parameter]
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available():
            kinds.append(dist.ProcessGroup)
            from torch.distributed.device_mesh import DeviceMesh

            kinds.append(DeviceMesh)
    from .data import ResumableLoader

    kinds.append(ResumableLoader)
    training = sys.modules.get("jdist.rank.training")
    if training is not None:
        kinds += [training.PreparedOptimizer, training.PreparedScheduler]
    return tuple(kinds)


def _params(obj: Any) -> set[int]:
    if hasattr(obj, "parameters"):
        return {id(p) for p in obj.parameters()}
    return {id(p) for group in _inner(obj).param_groups for p in group["params"]}


def states(ns: dict[str, Any]) -> list[dict[str, str | None]]:
    """Each model a variable holds (a module with parameters that no other such variable holds inside it: what
    ``jdist.prepare`` returned, or a model the code parallelized or wrapped itself), with the variables of the
    optimizer that holds its parameters and of that optimizer's scheduler (None where there is none): what
    :func:`snapshot` saves, in the namespace's order.

    >>> import torch
    >>> net = torch.nn.Linear(2, 1)
    >>> ns = {"net": net, "loss_fn": torch.nn.MSELoss(), "opt": torch.optim.SGD(net.parameters(), lr=0.1)}
    >>> states(ns)
    [{'model': 'net', 'optimizer': 'opt', 'scheduler': None}]
    """
    import torch

    public = [(k, v) for k, v in ns.items() if not k.startswith("_")]
    modules = [(k, v) for k, v in public if isinstance(v, torch.nn.Module) and any(True for _ in v.parameters())]
    inside = {id(m) for _, v in modules for m in v.modules() if m is not v}
    models, seen = [], set()
    for k, v in modules:
        if id(v) not in inside and id(v) not in seen:
            seen.add(id(v))
            models.append((k, v))
    optimizers = [(k, v) for k, v in public if isinstance(v, torch.optim.Optimizer)]
    wrapped = {id(_inner(v)) for _, v in optimizers if _inner(v) is not v}
    optimizers = [(k, v) for k, v in optimizers if id(v) not in wrapped]  # (the prepared one, not what it wraps)
    schedulers = [(k, v) for k, v in public if hasattr(v, "optimizer") and hasattr(v, "state_dict")
                  and hasattr(v, "step") and not hasattr(v, "param_groups")]
    out = []
    for name, model in models:
        held = _params(model)
        opt = next((k for k, o in optimizers if _params(o) and _params(o) <= held), None)
        sched = None
        if opt is not None:
            inner = _inner(ns[opt])
            sched = next((k for k, v in schedulers if _inner(v.optimizer) is inner), None)
        out.append({"model": name, "optimizer": opt, "scheduler": sched})
    return out


def snapshot(directory: str) -> dict[str, Any]:
    """Save what a resize carries into ``directory`` (see the module doc); collective. Returns the manifest:
    the states, loaders and variables carried, the variables not carried and why, the seconds each part took."""
    from .checkpoint import save_checkpoint

    s = session()
    ctx, ns = s.ctx, user_ns()
    folder = Path(directory)
    if ctx.rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    ctx.comm.Barrier()
    t0 = time.perf_counter()
    saved = []
    for i, names in enumerate(states(ns)):
        path = folder / f"state-{i}"
        save_checkpoint(path, model=ns[names["model"]], optimizer=ns.get(names["optimizer"] or ""),
                        scheduler=ns.get(names["scheduler"] or ""))
        saved.append({**names, "path": str(path), "sharded": path.is_dir()})
    t_state = time.perf_counter() - t0
    from .data import ResumableLoader

    loaders = {}
    for name, value in ns.items():
        if isinstance(value, ResumableLoader) and not name.startswith("_"):
            loaders[name] = value.elastic_state(ctx.world_size)
    t1 = time.perf_counter()
    carried, differ, unpicklable, sizes = _variables(ns, ctx)
    if ctx.rank == 0:
        with open(folder / VARIABLES_FILE, "wb") as fh:
            pickle.dump(carried, fh, protocol=pickle.HIGHEST_PROTOCOL)
    ctx.comm.Barrier()
    return {"world_size": ctx.world_size, "states": saved, "loaders": loaders, "variables": sorted(carried),
            "variable_bytes": sizes, "differ": differ, "unpicklable": unpicklable,
            "lr_rule": s.lr_rule, "grad_accum": s.train.grad_accum, "backend": s.backend_name,
            "seconds": {"state": t_state, "variables": time.perf_counter() - t1}}


def _variables(ns: dict[str, Any], ctx: Any) -> tuple[dict[str, Any], list[str], list[str], int]:
    """The plain variables alike on every rank ({name: value}), those that differ, those that cannot be pickled,
    and the bytes of the carried ones' pickles."""
    skip = _world_objects()
    backend = session().backend
    given = set(WORLD_NAMES) | (set(backend.namespace()) if backend is not None else set())
    digests: dict[str, str | None] = {}
    pickles: dict[str, bytes] = {}
    for name, value in list(ns.items()):
        if name.startswith("_") or name in given or isinstance(value, skip):
            continue
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            digests[name] = None
            continue
        pickles[name] = data
        digests[name] = hashlib.sha1(data).hexdigest()
    everyone = ctx.comm.allgather(digests)
    names = sorted(set().union(*everyone))
    unpicklable = [n for n in names if any(d.get(n, "") is None for d in everyone)]
    differ = [n for n in names if n not in unpicklable and len({d.get(n) for d in everyone}) > 1]
    carried = {n: pickle.loads(pickles[n]) for n in names if n not in unpicklable and n not in differ}
    return carried, differ, unpicklable, sum(len(pickles[n]) for n in carried)


def restore(directory: str, manifest: dict[str, Any], checkpoint: dict[str, Any] | None = None,
            grad_accum: int | None = None) -> dict[str, Any]:
    """Load a :func:`snapshot` into what the replayed set-up cells built (the same variable names); collective.
    ``checkpoint``: ``jdist.checkpoint_every``'s settings (every, directory, keep, names: {object: variable}) to set
    again, where the cell that set them was not replayed; ``grad_accum``: the gradient accumulation to train with
    from now on (``--keep-global-batch``). Returns what was done: per loader where its epoch goes on, the
    learning-rate factor re-applied, the seconds."""
    from .checkpoint import checkpoint_every, load_checkpoint

    s = session()
    ctx, ns = s.ctx, user_ns()
    t0 = time.perf_counter()
    missing = sorted({v for st in manifest["states"] for v in (st["model"], st["optimizer"], st["scheduler"])
                      if v and v not in ns} | {name for name in manifest["loaders"] if name not in ns})
    if missing:
        raise NameError(f"{', '.join(missing)} not defined after replaying the set-up cells, so their state was not "
                        f"loaded (it is kept in {directory}): define them and load it with jdist.load_checkpoint.")
    for st in manifest["states"]:
        load_checkpoint(st["path"], model=ns[st["model"]], optimizer=ns.get(st["optimizer"] or ""),
                        scheduler=ns.get(st["scheduler"] or ""), restore_rng=False, notes=[])
    factor = None
    if grad_accum is not None:  # the global batch is kept: so is the learning rate
        s.train.grad_accum = int(grad_accum)
    else:
        factor = _relearn(ns, manifest, ctx.world_size)
    t_state = time.perf_counter() - t0
    loaders = {name: ns[name].resume_elastic(state, ctx.rank, ctx.world_size)
               for name, state in manifest["loaders"].items()}
    with open(Path(directory) / VARIABLES_FILE, "rb") as fh:
        ns.update(pickle.load(fh))
    if checkpoint is not None:
        objects = {key: ns[var] for key, var in checkpoint["names"].items() if var and var in ns}
        checkpoint_every(checkpoint["every"], checkpoint["directory"], keep=checkpoint["keep"], **objects)
    return {"lr_factor": factor, "loaders": loaders,
            "seconds": {"state": t_state, "variables": time.perf_counter() - t0 - t_state}}


def _relearn(ns: dict[str, Any], manifest: dict[str, Any], world_size: int) -> float | None:
    """Where the set-up used ``jdist.scale_lr`` (its rule is noted on the session), the loaded optimizers' learning
    rates are scaled from the old world size to the new one (their schedulers' base rates too); the factor."""
    rule = manifest.get("lr_rule")
    if not rule or manifest["world_size"] == world_size:
        return None
    from .training import scale_lr

    name, base = rule
    factor = scale_lr(1.0, name, world_size, base) / scale_lr(1.0, name, manifest["world_size"], base)
    for st in manifest["states"]:
        if st["optimizer"]:
            for group in _inner(ns[st["optimizer"]]).param_groups:
                group["lr"] = group["lr"] * factor
                if "initial_lr" in group:
                    group["initial_lr"] = group["initial_lr"] * factor
        if st["scheduler"]:
            sched = getattr(ns[st["scheduler"]], "scheduler", ns[st["scheduler"]])
            if hasattr(sched, "base_lrs"):
                sched.base_lrs = [lr * factor for lr in sched.base_lrs]
            if hasattr(sched, "_last_lr"):
                sched._last_lr = [lr * factor for lr in sched._last_lr]
    return factor


__all__ = ["VARIABLES_FILE", "WORLD_NAMES", "restore", "snapshot", "states"]
