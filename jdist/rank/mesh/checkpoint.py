"""Checkpoints of models whose parameters are DTensors (tensor parallel, FSDP + TP, FSDP2): every rank writes
its shards with ``torch.distributed.checkpoint`` into one folder, the model and optimizer state dicts taken
with ``get_state_dict`` (each parameter once, by its global name, whatever the mesh) and put back with
``set_state_dict``; rank 0 adds ``jdist.pt`` with jdist's own state (step, RNG, scheduler...).
``--backend fsdp`` keeps every checkpoint this way; the other torch backends for models with DTensors
(``jdist.save_checkpoint`` of a model the cell parallelized itself) and for a pipeline stage's module
(``PipelineStage(module, ...)``): each stage's state under its own key, ``stage<index>``, since every stage
names its parameters alike (a 3-D model's stages are DTensors on different sub-meshes under the same names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: jdist's own state in a sharded checkpoint's folder.
META_FILE = "jdist.pt"


def stage_of(model: Any) -> int | None:
    """The index of the pipeline stage whose module ``model`` is (``torch.distributed.pipelining``), or None.

    >>> import torch
    >>> stage_of(torch.nn.Linear(2, 2)) is None
    True
    """
    import gc
    import sys

    if model is None or "torch.distributed.pipelining" not in sys.modules:
        return None
    from torch.distributed.pipelining.stage import _PipelineStageBase

    for obj in gc.get_referrers(model):  # (a stage holds its module as an attribute)
        if isinstance(obj, dict):
            for holder in gc.get_referrers(obj):
                if isinstance(holder, _PipelineStageBase) and getattr(holder, "submod", None) is model:
                    return int(holder.stage_index)
        elif isinstance(obj, _PipelineStageBase) and getattr(obj, "submod", None) is model:
            return int(obj.stage_index)
    return None


def is_sharded(model: Any) -> bool:
    """Whether ``model``'s checkpoint is a folder of shards: DTensor parameters, or a pipeline stage's module."""
    return has_dtensors(model) or stage_of(model) is not None


def has_dtensors(model: Any) -> bool:
    """Whether any parameter of ``model`` is a DTensor (then its checkpoint is a folder of shards).

    >>> import torch
    >>> has_dtensors(torch.nn.Linear(2, 2)), has_dtensors(None)
    (False, False)
    """
    if model is None or not hasattr(model, "parameters"):
        return False
    return any(type(p).__name__ == "DTensor" or hasattr(p, "device_mesh") for p in model.parameters())


def _states(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state dicts to save or to load into (``get_state_dict``), and what ``torch.distributed.checkpoint``
    is given: under ``stage<index>`` for a pipeline stage's module."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": msd}
    if optimizer is not None:
        state["optim"] = osd
    stage = stage_of(model)
    return state, state if stage is None else {f"stage{stage}": state}


def save_sharded(rank: int, path: Path, model: Any, optimizer: Any, meta: dict[str, Any]) -> None:
    """Every rank writes its shards into the folder ``path``; rank 0 adds :data:`META_FILE` (collective)."""
    import torch
    import torch.distributed.checkpoint as dcp

    dcp.save(_states(model, optimizer)[1], checkpoint_id=str(path))
    if rank == 0:
        torch.save({**meta, "has_optimizer": optimizer is not None}, path / META_FILE)


def load_sharded(path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
    """Load what :func:`save_sharded` wrote into ``model`` and ``optimizer``; returns jdist's state."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    meta = torch.load(path / META_FILE, map_location="cpu", weights_only=False)
    if optimizer is not None and not meta.get("has_optimizer"):
        raise ValueError(f"{path} holds no optimizer state; load it without optimizer=.")
    if optimizer is not None:  # (optimizer.state is a defaultdict: a read of opt.state[p]["step"] before any step
        for param in [p for p, st in optimizer.state.items() if not st]:  # leaves an empty entry, and torch then
            del optimizer.state[param]  # takes the state as made, and finds nothing to load into)
    state, given = _states(model, optimizer)
    dcp.load(given, checkpoint_id=str(path))  # (in place: into state's tensors)
    set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}))
    return meta


__all__ = ["META_FILE", "has_dtensors", "is_sharded", "load_sharded", "save_sharded", "stage_of"]
