"""Checkpoints of models whose parameters are DTensors (tensor parallel, FSDP + TP, FSDP2): every rank writes
its shards with ``torch.distributed.checkpoint`` into one folder, the model and optimizer state dicts taken
with ``get_state_dict`` (each parameter once, by its global name, whatever the mesh) and put back with
``set_state_dict``; rank 0 adds ``jdist.pt`` with jdist's own state (step, RNG, scheduler...).
``--backend fsdp`` keeps every checkpoint this way; the other torch backends for models with DTensors
(``jdist.save_checkpoint`` of a model the cell parallelized itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: jdist's own state in a sharded checkpoint's folder.
META_FILE = "jdist.pt"


def has_dtensors(model: Any) -> bool:
    """Whether any parameter of ``model`` is a DTensor (then its checkpoint is a folder of shards).

    >>> import torch
    >>> has_dtensors(torch.nn.Linear(2, 2)), has_dtensors(None)
    (False, False)
    """
    if model is None or not hasattr(model, "parameters"):
        return False
    return any(type(p).__name__ == "DTensor" or hasattr(p, "device_mesh") for p in model.parameters())


def save_sharded(rank: int, path: Path, model: Any, optimizer: Any, meta: dict[str, Any]) -> None:
    """Every rank writes its shards into the folder ``path``; rank 0 adds :data:`META_FILE` (collective)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": msd}
    if optimizer is not None:
        state["optim"] = osd
    dcp.save(state, checkpoint_id=str(path))
    if rank == 0:
        torch.save({**meta, "has_optimizer": optimizer is not None}, path / META_FILE)


def load_sharded(path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
    """Load what :func:`save_sharded` wrote into ``model`` and ``optimizer``; returns jdist's state."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = torch.load(path / META_FILE, map_location="cpu", weights_only=False)
    if optimizer is not None and not meta.get("has_optimizer"):
        raise ValueError(f"{path} holds no optimizer state; load it without optimizer=.")
    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": msd}
    if optimizer is not None:
        state["optim"] = osd
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}))
    return meta


__all__ = ["META_FILE", "has_dtensors", "load_sharded", "save_sharded"]
