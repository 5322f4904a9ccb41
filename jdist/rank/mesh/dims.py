"""Which process group is which dimension of the device meshes the code built.

:class:`MeshDims` (one per rank process: :data:`DIMS`) maps a group to its dimension name. Every
``DeviceMesh`` made on the rank (jdist's ``--mesh``, the code's own ``init_device_mesh``, ``DeviceMesh(...)``,
``from_group`` with names) is noted by a wrapper of ``DeviceMesh.__init__`` (:func:`learn_meshes`); unnamed
dimensions are ``dim0``, ``dim1``... The communication timers ask :meth:`MeshDims.of` for a collective's group
(a dict look-up) and stamp each interval with it (``comm_time_<dim>_s``).

Example (one process, a 1x1 mesh on a gloo group of one rank):
    >>> import torch.distributed as dist
    >>> from jdist.rank.mesh.dims import DIMS, learn_meshes
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> undo = learn_meshes()
    >>> from torch.distributed.device_mesh import init_device_mesh
    >>> m = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    >>> DIMS.names(), DIMS.of(m.get_group("tp")) in ("dp", "tp")
    (['dp', 'tp'], True)
    >>> undo(); DIMS.clear(); dist.destroy_process_group()
"""

from __future__ import annotations

from typing import Any, Callable


class MeshDims:
    """Process group -> the mesh dimension it is (the first mesh that named it wins; a group of several
    dimensions, a 1x1 mesh's, keeps the first). Looked up by group name, so a group made again after a
    release (:mod:`jdist.rank.mesh.groups`, same name) is still its dimension."""

    def __init__(self) -> None:
        self.by_name: dict[str, str] = {}  # group name -> dimension name
        self.by_group: dict[Any, str] = {}  # the group objects seen (a cache of by_name)
        self.order: list[str] = []  # dimension names, in the order first seen

    def note(self, mesh: Any) -> None:
        """Learn the dimensions of ``mesh`` (a ``DeviceMesh`` whose groups exist)."""
        names = getattr(mesh, "mesh_dim_names", None) or tuple(f"dim{i}" for i in range(mesh.ndim))
        groups = getattr(mesh, "_dim_group_names", None) or []
        for name, group in zip(names, groups):
            if group is None:
                continue
            self.by_name.setdefault(str(group), name)
            if name not in self.order:
                self.order.append(name)
        self.by_group.clear()

    def of(self, group: Any) -> str | None:
        """The dimension of ``group`` (None: the default group, unless a mesh dimension is the whole world; a
        group no mesh named)."""
        try:
            return self.by_group[group]
        except (KeyError, TypeError):
            pass
        asked = group
        if group is None:
            import torch.distributed as dist

            if not dist.is_initialized():
                return None
            group = dist.group.WORLD
        dim = self.by_name.get(getattr(group, "group_name", None) or "")
        try:
            self.by_group[asked] = dim  # type: ignore[assignment]  (None too: the default group, cached)
        except TypeError:
            pass
        return dim

    def of_name(self, group_name: str) -> str | None:
        """The dimension of the group named ``group_name``."""
        return self.by_name.get(group_name)

    def of_any(self, group: Any) -> str | None:
        """The dimension of a functional collective's ``group``: ``(mesh, dim)`` (what DTensor gives), a 1-D
        ``DeviceMesh``, a group name or a ``ProcessGroup`` (a list of ranks: None)."""
        if type(group) is tuple and len(group) == 2:
            mesh, i = group
            names = getattr(mesh, "_dim_group_names", None)
            if names is not None and isinstance(i, int):
                return self.by_name.get(str(names[i]))
            if isinstance(i, str):  # (mesh, "tp")
                return i if i in self.order else None
            return None
        if isinstance(group, str):
            return self.by_name.get(group)
        names = getattr(group, "_dim_group_names", None)
        if names is not None:
            return self.by_name.get(str(names[0])) if len(names) == 1 else None
        return self.of(group) if group is not None and hasattr(group, "group_name") else None

    def names(self) -> list[str]:
        return list(self.order)

    def clear(self) -> None:
        self.by_name.clear()
        self.by_group.clear()
        self.order.clear()


#: This process's mesh dimensions (one per rank process).
DIMS = MeshDims()


def learn_meshes(new_group: Callable[..., Any] | None = None) -> Callable[[], None]:
    """Note every ``DeviceMesh`` made from now on in :data:`DIMS` (and those jdist made before); returns the
    remover. Meshes made by slicing (``mesh["tp"]``) name groups their root mesh already named. ``new_group``:
    what a mesh makes its dimensions' groups with instead of torch's (``torch.distributed.device_mesh``
    imported torch's by name: a rank's ``new_group`` notes the group's sockets, so that a release can break
    a wait on them)."""
    import torch.distributed.device_mesh as device_mesh
    from torch.distributed.device_mesh import DeviceMesh

    real = DeviceMesh.__init__
    real_from_group = DeviceMesh.from_group
    if getattr(real, "__jdist_wrapped__", False):
        return lambda: None

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        try:
            DIMS.note(self)
        except Exception:  # a mesh jdist cannot read is timed as "other" communication
            pass

    __init__.__jdist_wrapped__ = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = real  # type: ignore[attr-defined]
    def from_group(*args: Any, **kwargs: Any) -> Any:
        mesh = real_from_group(*args, **kwargs)
        if getattr(mesh, "mesh_dim_names", None):  # (unnamed: jdist's own FSDP mesh of the default group)
            DIMS.note(mesh)
        return mesh

    DeviceMesh.__init__ = __init__  # type: ignore[method-assign]
    DeviceMesh.from_group = staticmethod(from_group)  # type: ignore[method-assign,assignment]
    real_new_group = getattr(device_mesh, "new_group", None)
    if new_group is not None and real_new_group is not None:
        device_mesh.new_group = new_group  # type: ignore[attr-defined]

    def undo() -> None:
        DeviceMesh.__init__ = real  # type: ignore[method-assign]
        DeviceMesh.from_group = staticmethod(real_from_group)  # type: ignore[method-assign,assignment]
        if new_group is not None and real_new_group is not None:
            device_mesh.new_group = real_new_group  # type: ignore[attr-defined]

    return undo


__all__ = ["DIMS", "MeshDims", "learn_meshes"]
