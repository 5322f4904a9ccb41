"""Checkpoints that resume training exactly, for every backend.

:func:`save_checkpoint` is called on every rank with the same arguments. What it stores:
model and optimizer state, optional LR scheduler, the fp16 GradScaler, every rank's RNG
states (torch, CUDA, Python, NumPy), the data loader's epoch and position
(:class:`jdist.rank.data.ResumableLoader`), the step and any extra picklable values.

How model and optimizer state are written is the backend's (:meth:`Backend.save_state`):

- ddp, horovod (replicated state): rank 0 writes one ``torch.save`` file at ``path``.
- fsdp (sharded state): ``path`` is a directory written by ``torch.distributed.checkpoint``,
  each rank saving its own shards, plus ``jdist.pt`` with the rest.
- tf (``--framework tf``): ``path`` is a directory with rank 0's ``tf.train.Checkpoint`` of the Keras
  model and optimizer plus ``jdist.pkl``; every rank writes (TF's strategy needs it), the others to
  a copy that is deleted. torch is not imported: RNG states are Python's and NumPy's.

Both are written under a temporary name and renamed when complete, so a checkpoint
that exists is whole. :func:`checkpoint_every` saves automatically every N logged steps (a log hook of the session).

Example (inside ``%%distributed`` cells):
    >>> jdist.save_checkpoint("ckpt/step-10", model=model, optimizer=opt, step=10, loader=loader)  # doctest: +SKIP
    >>> state = jdist.load_checkpoint("ckpt/step-10", model=model, optimizer=opt, loader=loader)  # doctest: +SKIP
    >>> state["step"]   # doctest: +SKIP
    10
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

from jdist.protocol import PROTOCOL_VERSION, CheckpointEveryMessage, CheckpointSavedMessage, Record

from .session import RankSession, session

#: Version of jdist's part of a checkpoint; a checkpoint of another version is refused on load.
FORMAT = 1


def _rng_state(ctx: Any) -> dict[str, Any]:
    """This rank's random number generators: Python's, NumPy's, and torch's (CPU, CUDA) where torch is loaded."""
    state: dict[str, Any] = {"python": random.getstate()}
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if ctx.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(ctx.device)
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(ctx: Any, state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
        if "cuda" in state and ctx.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], ctx.device)
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


def _inner_optimizer(optimizer: Any) -> Any:
    training = sys.modules.get("jdist.rank.training")  # not loaded: nothing was prepared (TF ranks: no torch)
    return optimizer.optimizer if training is not None and isinstance(optimizer, training.PreparedOptimizer) else optimizer


def _common(s: RankSession, step: int | None, scheduler: Any, loader: Any, extra: dict[str, Any]) -> dict[str, Any]:
    scaler = s.train.scaler
    return {
        "format": FORMAT,
        "backend": s.backend_name,
        "world_size": s.ctx.world_size,
        "step": step,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "loader": loader.state_dict() if loader is not None else None,
        "precision": s.train.precision,
        "extra": extra,
    }


def save_checkpoint(path: str | os.PathLike, *, model: Any = None, optimizer: Any = None, step: int | None = None,
                    scheduler: Any = None, loader: Any = None, **extra: Any) -> Path:
    """Save a checkpoint of the training state at ``path`` (collective: call on every rank).

    ``loader`` should be the object ``jdist.prepare`` returned for the DataLoader (it knows
    its position). ``extra``: any picklable values, returned by :func:`load_checkpoint`.
    Returns the path written.

    >>> jdist.save_checkpoint("ckpt/step-10", model=model, optimizer=opt, step=10)  # doctest: +SKIP
    """
    s = session()
    ctx, backend = s.ctx, _backend(s)
    if loader is not None and not hasattr(loader, "state_dict"):
        raise TypeError("save_checkpoint(loader=...) takes the loader jdist.prepare returned: loader = jdist.prepare(loader).")
    path = Path(path).absolute()
    comm = ctx.comm
    token = comm.bcast(uuid.uuid4().hex[:8] if ctx.rank == 0 else None, root=0)
    tmp = path.with_name(f".{path.name}.tmp-{token}")
    meta = {**_common(s, step, scheduler, loader, extra), "rng": comm.gather(_rng_state(ctx), root=0)}
    backend.save_state(tmp, model, _inner_optimizer(optimizer), meta)
    comm.Barrier()
    if ctx.rank == 0:
        _replace(tmp, path)
    comm.Barrier()
    return path


def _replace(tmp: Path, path: Path) -> None:
    if path.exists():
        old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        tmp.rename(path)


def load_checkpoint(path: str | os.PathLike, *, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                    loader: Any = None, restore_rng: bool = True, notes: list[str] | None = None) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` saved into the given (prepared) objects, on every rank.

    Returns ``{"step": ..., **extra}``. RNG states are restored per rank when the world
    size matches. The backend must be the one that saved. Saved on another number of ranks, sharded state is
    resharded and a prepared loader goes on with the samples of its epoch not yet seen; what differs is said in a
    line on rank 0 (``notes``: appended to that list instead, on every rank).

    >>> state = jdist.load_checkpoint("ckpt/step-10", model=model, optimizer=opt)  # doctest: +SKIP
    """
    s = session()
    ctx, backend = s.ctx, _backend(s)
    path = Path(path).absolute()
    seen = ctx.comm.allgather(path.exists())
    if not all(seen):
        missing = [r for r, ok in enumerate(seen) if not ok]
        raise FileNotFoundError(
            f"Checkpoint {path} is not visible on rank(s) {missing}. Give a path that exists and that "
            "all ranks share (a shared filesystem on multi-node clusters); jdist.latest_checkpoint(dir) finds one."
        )
    from .mesh.checkpoint import is_sharded

    sharded = is_sharded(model)
    if path.is_dir() != (backend.checkpoint_layout == "dir" or sharded):
        saved_kind = "sharded (a folder)" if path.is_dir() else "single-file"
        now = ("this model is sharded (DTensor parameters, or a pipeline stage's module)" if sharded else
               f"this cluster runs --backend {s.backend_name}")
        raise ValueError(f"{path} is a {saved_kind} checkpoint but {now}; load it into the model that saved it, "
                         "under the backend that saved it.")
    opt = _inner_optimizer(optimizer)
    with _keeping_param_groups(opt):
        meta = backend.load_state(path, model, opt)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} was written by a jdist with checkpoint format {meta.get('format')!r}; this one "
                         f"reads format {FORMAT}. Load it with the jdist version that saved it.")
    if scheduler is not None and meta.get("scheduler") is not None:
        scheduler.load_state_dict(meta["scheduler"])
    if meta.get("scaler") is not None:
        from .training import scaler

        scaler(s).load_state_dict(meta["scaler"])
    said: list[str] = []
    if loader is not None and meta.get("loader") is not None:
        if not hasattr(loader, "load_state_dict"):
            raise TypeError("load_checkpoint(loader=...) takes the loader jdist.prepare returned.")
        loader.note = None
        loader.load_state_dict(meta["loader"])
        if getattr(loader, "note", None):
            said.append(loader.note)
    if restore_rng and meta.get("rng"):
        if len(meta["rng"]) == ctx.world_size:
            _set_rng_state(ctx, meta["rng"][ctx.rank])
        else:
            said.append(f"{path} was saved by {len(meta['rng'])} ranks, this cluster has {ctx.world_size}: "
                        "random number generator states were not restored")
    if notes is not None:
        notes.extend(said)
    elif ctx.rank == 0:
        for line in said:
            print(f"jdist: {line}.")
    s.restored_step = int(meta.get("step") or 0)
    return {"step": meta.get("step"), **(meta.get("extra") or {})}


def _backend(s: RankSession) -> Any:
    if s.backend is None:
        raise RuntimeError("jdist checkpoints need a backend: call them inside a %%distributed cell.")
    return s.backend


@contextlib.contextmanager
def _keeping_param_groups(optimizer: Any) -> Iterator[None]:
    """``Optimizer.load_state_dict`` replaces the param-group dicts. A scheduler built on the
    optimizer before ``jdist.prepare`` (or Horovod's wrapper, which shares them) would then
    set the learning rate on stale dicts: copy the loaded values into the original ones."""
    if optimizer is None or not hasattr(optimizer, "param_groups"):  # none, or not torch's (Keras)
        yield
        return
    groups = optimizer.param_groups
    originals = list(groups)
    yield
    for old, new in zip(originals, optimizer.param_groups):
        if old is not new:
            old.update(new)
    groups[:] = originals
    optimizer.param_groups = groups


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in ``directory`` (by name, e.g. ``step-00000020``), or None.

    >>> latest_checkpoint("/nonexistent") is None
    True
    """
    directory = Path(directory)
    if not directory.is_dir():
        return None
    done = [p for p in directory.iterdir() if not p.name.startswith(".")]
    return max(done, key=lambda p: p.name) if done else None


class AutoCheckpoint:
    """A log hook of the session: saves when a logged step is a multiple of ``every``."""

    def __init__(self, every: int, directory: Path, keep: int | None, objects: dict[str, Any]):
        self.every, self.directory, self.keep, self.objects = every, directory, keep, objects
        self.last: int | None = None

    def __call__(self, rec: Record) -> None:
        step = rec.get("step")
        if not isinstance(step, int) or step <= 0 or step % self.every or step == self.last:
            return
        self.last = step
        path = save_checkpoint(self.directory / f"step-{step:08d}", step=step, **self.objects)
        s = session()
        s.publish(CheckpointSavedMessage(v=PROTOCOL_VERSION, kind="checkpoint_saved", cell=s.stream.cell,
                                         path=str(path), step=step))
        if self.keep and s.ctx.rank == 0:
            done = sorted(p for p in self.directory.iterdir() if p.name.startswith("step-"))
            for old in done[: -self.keep]:
                shutil.rmtree(old) if old.is_dir() else old.unlink()


def checkpoint_every(every: int | None, directory: str | os.PathLike | None = None, *, keep: int | None = 2,
                     **objects: Any) -> None:
    """Save a checkpoint every ``every`` steps, when ``jdist.log(step=...)`` logs a multiple of it.

    Checkpoints go to ``directory/step-<step>``; the newest ``keep`` are kept (None: all).
    ``objects``: what :func:`save_checkpoint` takes (model=, optimizer=, scheduler=, loader=...).
    All ranks must log the same steps. ``checkpoint_every(None)`` turns it off.

    >>> jdist.checkpoint_every(100, "ckpt", model=model, optimizer=opt, loader=loader)  # doctest: +SKIP
    """
    from .namespace import names_of_objects

    s = session()
    if every is None:
        s.log_hooks.pop("checkpoint_every", None)
        return
    if int(every) < 1 or directory is None:
        raise ValueError("checkpoint_every(N, directory, model=..., optimizer=...): N >= 1 steps and a directory.")
    auto = AutoCheckpoint(int(every), Path(directory).absolute(), keep, objects)
    s.log_hooks["checkpoint_every"] = auto
    # The kernel keeps this, so that a restart after the ranks died can restore the
    # newest checkpoint into the same variables (see jdist.kernel.recovery).
    names = names_of_objects()
    s.publish(CheckpointEveryMessage(v=PROTOCOL_VERSION, kind="checkpoint_every", cell=s.stream.cell, every=int(every),
                                     directory=str(auto.directory), keep=keep,
                                     names={key: names.get(id(obj)) for key, obj in objects.items()}))


def restored_step() -> int:
    """The step of the checkpoint restored last on this rank (by :func:`load_checkpoint` or
    ``%dist restart``), 0 if none: where a training loop resumes.

    >>> for step in range(jdist.restored_step(), total_steps): ...   # doctest: +SKIP
    """
    return session().restored_step


def restore_latest(directory: str, names: dict[str, str | None], every: int, keep: int | None) -> dict[str, Any]:
    """Load the newest checkpoint of ``directory`` into the variables ``names`` ({object: variable
    name}) of this rank's namespace and switch automatic checkpoints on again (``%dist restart``).
    """
    from .namespace import user_ns

    ns = user_ns()
    missing = sorted(var or f"<unnamed {key}>" for key, var in names.items() if not var or var not in ns)
    if missing:
        raise NameError(
            f"{', '.join(missing)} not defined after replaying the set-up cells; define them and call "
            "jdist.load_checkpoint(jdist.latest_checkpoint(...), model=..., ...) yourself."
        )
    objects = {key: ns[var] for key, var in names.items() if var}
    path = latest_checkpoint(directory)
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    loadable = {k: v for k, v in objects.items() if k in ("model", "optimizer", "scheduler", "loader")}
    notes: list[str] = []
    state = load_checkpoint(path, **loadable, notes=notes)
    checkpoint_every(every, directory, keep=keep, **objects)
    return {"path": str(path), "step": state.get("step"), "notes": notes}
