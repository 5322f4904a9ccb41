"""``jdist.sharding(model)``: how a model's parameters are laid out over the device mesh, on this rank.

One row per parameter: its name, global shape, dtype, its placement on each mesh dimension (DTensor's
``Shard(d)``, ``Replicate()``, ``Partial()``; FSDP2 and tensor parallel make DTensors), and what this rank
holds of it: the local shape and bytes. A plain tensor (a DDP model, a pipeline stage's own layers) is
held whole. The last row sums the bytes. Nothing is communicated: call it on one rank
(``%%distributed --targets 0``) or on all of them (each rank's own table).

Example (one process, a plain model):
    >>> import torch
    >>> from jdist.rank.mesh.sharding import sharding
    >>> sharding(torch.nn.Linear(4, 2)).to_dict("records")[-1]["bytes"]
    40
"""

from __future__ import annotations

from typing import Any


def sharding(model: Any) -> Any:
    """A DataFrame of ``model``'s parameters and this rank's share of each (see the module doc)."""
    import pandas as pd

    rows = []
    dims: list[str] = []
    for name, param in model.named_parameters():
        mesh = getattr(param, "device_mesh", None)
        placements = getattr(param, "placements", None)
        if mesh is not None and placements is not None:
            names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
            local = param.to_local()
            placed = {dim: _placement(p) for dim, p in zip(names, placements)}
            for dim in names:
                if dim not in dims:
                    dims.append(dim)
        else:
            local, placed = param, {}
        rows.append({"parameter": name, "global shape": tuple(param.shape), "dtype": str(param.dtype).removeprefix("torch."),
                     **placed, "local shape": tuple(local.shape), "bytes": local.numel() * local.element_size()})
    columns = ["parameter", "global shape", "dtype", *dims, "local shape", "bytes"]
    for row in rows:
        for dim in dims:
            row.setdefault(dim, "whole" if not row.get(dim) else row[dim])
    if rows:
        rows.append({"parameter": "total", "global shape": "", "dtype": "", **{d: "" for d in dims}, "local shape": "",
                     "bytes": sum(r["bytes"] for r in rows)})
    return pd.DataFrame(rows, columns=columns)


def _placement(p: Any) -> str:
    """``Shard(dim=0)`` -> ``"Shard(0)"``; ``Replicate()``, ``Partial(sum)`` as they are."""
    dim = getattr(p, "dim", None)
    if type(p).__name__.endswith("Shard") and dim is not None:
        return f"Shard({dim})"
    if type(p).__name__ == "Replicate":
        return "Replicate()"
    return str(p)


__all__ = ["sharding"]
