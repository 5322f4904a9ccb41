"""``--mesh`` on the ranks: a ``DeviceMesh`` with the option's names and sizes, as ``mesh`` in every cell.

:func:`set_mesh` (``--mesh dp=2,tp=2``, at start and on a live change) builds it over jdist's world group on
the rank's device type and puts it in the cell namespace; the same dimensions again keep the mesh; another
value makes a new one (the old one's groups stay for the models built on it). Its dimensions are noted in
:data:`jdist.rank.mesh.dims.DIMS`, like those of every mesh the code builds itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jdist.common.meshspec import format_mesh, parse_mesh

from .dims import DIMS

if TYPE_CHECKING:
    from ..session import RankSession


def make_mesh(dims: tuple[tuple[str, int], ...], device_type: str) -> Any:
    """A ``DeviceMesh`` with these dimensions over the default group, on ``device_type``."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, tuple(size for _, size in dims),
                            mesh_dim_names=tuple(name for name, _ in dims))
    DIMS.note(mesh)
    return mesh


def set_mesh(s: RankSession, text: str | None) -> None:
    """``--mesh``'s value on this rank (collective: every rank calls it at once); see the module doc."""
    from ..namespace import user_ns

    ns = user_ns()
    current = getattr(s, "mesh", None)
    if text is None:
        if current is not None and ns.get("mesh") is current:
            del ns["mesh"]
        s.mesh = None
        return
    from ..backends.torch_group import TorchBackend

    if not isinstance(s.backend, TorchBackend):
        raise ValueError(f"--mesh needs torch's process group on the ranks (--backend ddp or fsdp, not "
                         f"{s.backend_name}); leave --mesh out.")
    dims = parse_mesh(text, s.ctx.world_size)
    if current is None or _dims_of(current) != dims:
        current = make_mesh(dims, s.ctx.device_kind)
        s.mesh = current
    ns["mesh"] = current


def _dims_of(mesh: Any) -> tuple[tuple[str, int], ...]:
    return tuple(zip(mesh.mesh_dim_names or (), mesh.mesh.shape))


__all__ = ["format_mesh", "make_mesh", "set_mesh"]
