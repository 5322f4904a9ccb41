"""The process groups beyond the default one (a device mesh's dimensions, ``new_group``), kept across a release.

A release breaks every group's connections, and jdist makes the default group again
(:func:`jdist.rank.backends.torch_group.recreate_process_group`). torch destroys all groups with the default
one, so a ``DeviceMesh`` with more than one dimension (FSDP + TP, HSDP, PP + DP) and every ``new_group`` would
be left naming groups that no longer exist (``Could not resolve the process group registered under the
name 1``). Around that re-creation:

* :func:`snapshot` notes, before the groups are destroyed, each group this rank belongs to: its name, its
  ranks, its backend, description and tag, and the Python object;
* :func:`restore`, after the new default group formed, makes each of them again **under the same name**
  (torch's own ``_new_process_group_helper``, in the order they were first made, on their members only), so a
  mesh, which looks its groups up by name, and DTensor's functional collectives find them; then every
  reference to an old group object in a dict or a list (an object's attributes: FSDP2's mesh info, a
  pipeline stage's ``group``, a ``DeviceMesh``'s registry, the cell's own ``tp_group = mesh.get_group("tp")``)
  is replaced by the new object (:func:`swap_references`), and a ``DistributedDataParallel`` on a re-made
  group gets a reducer on it (``_update_process_group``).

What cannot be replaced (a tuple, a C++ object that holds the old group) is counted and said in one line.

Example (one process, a gloo group of one rank; what a release's repair does):
    >>> import os, torch.distributed as dist
    >>> from jdist.rank.mesh.groups import snapshot, restore
    >>> os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    >>> store = dist.HashStore()
    >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    >>> sub = dist.new_group([0]); holder = {"group": sub}; name = sub.group_name
    >>> kept = snapshot()
    >>> dist.destroy_process_group(); dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> report = restore(kept)
    >>> holder["group"] is not sub, holder["group"].group_name == name, report.remade
    (True, True, 1)
    >>> dist.destroy_process_group()
"""

from __future__ import annotations

import gc
import inspect
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KeptGroup:
    """One group of this rank, as :func:`snapshot` noted it."""

    name: str
    ranks: list[int]  # global ranks, in the group's order
    backend: str
    desc: str | None
    tag: str | None
    timeout: Any
    old: Any  # the ProcessGroup object (destroyed by then)


@dataclass
class Snapshot:
    """This rank's groups before a release's re-creation, and torch's group counter (the next name)."""

    default: Any
    groups: list[KeptGroup] = field(default_factory=list)
    group_count: int = 0


@dataclass
class RestoreReport:
    """What :func:`restore` did: groups made again, references replaced, DDPs given a new reducer, and what it
    could not fix (one line each)."""

    remade: int = 0
    replaced: int = 0
    ddp: int = 0
    stuck: int = 0  # references jdist could not change (a tuple: often the failed cell's traceback, unused again)
    problems: list[str] = field(default_factory=list)

    def kept(self) -> str | None:
        """What the cell's error says was kept, or None when there was nothing beyond the default group.

        >>> RestoreReport(remade=2, replaced=5).kept()
        'the 2 other process groups (device meshes, new_group) were made again under their names, and the 5 references to the old ones hold the new ones'
        >>> RestoreReport(remade=2).kept()
        'the 2 other process groups (device meshes, new_group) were made again under their names'
        """
        if not self.remade:
            return None
        more = f"; {self.ddp} DistributedDataParallel on them re-attached" if self.ddp else ""
        if self.stuck:  # (said as a caveat: in the trials the next cells worked, the holder was not used again)
            more += (f"; {self.stuck} more in tuples or C++ objects jdist cannot change: an object that then fails "
                     "with 'Could not resolve the process group' must be built again")
        several = self.remade > 1
        refs = ""
        if self.replaced:
            refs = (f", and the {self.replaced} reference{'s' if self.replaced != 1 else ''} to the old "
                    f"{'ones' if several else 'one'} {'hold' if self.replaced != 1 else 'holds'} the new "
                    f"{'ones' if several else 'one'}")
        return (f"the {self.remade} other process group{'s' if several else ''} (device meshes, new_group) "
                f"{'were' if several else 'was'} made again under {'their names' if several else 'its name'}"
                f"{refs}{more}")

    def lost(self) -> str | None:
        """What could not be kept (one clause each), or None."""
        return "; ".join(self.problems) or None


def _sort_key(name: str) -> tuple[int, int, str]:
    """torch names groups by a counter (``"1"``, ``"2"``...) or by a hash of their ranks: every rank makes its
    groups again in the same order (the order of the counter; hashes after, by name), so no two ranks wait
    for each other's group.

    >>> sorted(["10", "2", "ab"], key=_sort_key)
    ['2', '10', 'ab']
    """
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def snapshot() -> Snapshot | None:
    """The groups of this rank beyond the default one, before they are destroyed (None: no default group)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not dist.is_initialized():
        return None
    world = c10d._world
    default = world.default_pg
    kept = Snapshot(default=default, group_count=world.group_count)
    for pg, name in list(world.pg_names.items()):
        if pg is default or pg is None:
            continue
        mapping = world.pg_group_ranks.get(pg, {})
        ranks = [g for g, _ in sorted(mapping.items(), key=lambda item: item[1])]
        backend = world.pg_map.get(pg, (None, None))[0]
        kept.groups.append(KeptGroup(
            name=str(name), ranks=ranks, backend=str(backend or dist.get_backend()), desc=getattr(pg, "group_desc", None),
            tag=world.pg_to_tag.get(pg), timeout=_timeout(pg), old=pg))
    kept.groups.sort(key=lambda g: _sort_key(g.name))
    return kept


def _timeout(pg: Any) -> Any:
    """The group's own timeout (its backend's options), or None (the default timeout)."""
    try:
        backend = pg._get_backend(pg._device_types[0])
        return backend.options._timeout
    except Exception:
        return None


def restore(kept: Snapshot | None) -> RestoreReport:
    """Make this rank's groups of ``kept`` again under their names on the new default group, then replace the
    old objects (see the module doc). Every rank calls it; each group forms among its members only."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    report = RestoreReport()
    if kept is None or not dist.is_initialized():
        return report
    world = c10d._world
    new_default = world.default_pg
    store = world.pg_map[new_default][1]
    rank = dist.get_rank()
    mapping: dict[int, Any] = {}
    if kept.default is not None and kept.default is not new_default:
        mapping[id(kept.default)] = new_default
    for group in kept.groups:
        try:
            pg = _make(group, rank, store, new_default)
        except Exception as exc:
            report.problems.append(f"the group {group.name!r} ({group.desc or 'new_group'}, ranks {group.ranks}) could "
                                   f"not be made again ({type(exc).__name__}: {exc}): what uses it fails; "
                                   "run %dist restart")
            continue
        mapping[id(group.old)] = pg
        report.remade += 1
    world.group_count = max(world.group_count, kept.group_count)
    olds = [kept.default] + [g.old for g in kept.groups]
    report.replaced, stuck = swap_references(mapping, olds)
    report.ddp = _reattach_ddp(mapping, new_default)
    report.stuck = stuck
    return report


def _make(group: KeptGroup, rank: int, store: Any, default: Any) -> Any:
    """One group again, under its name, through torch's own helper (what ``new_group`` calls)."""
    import torch.distributed.distributed_c10d as c10d

    helper = c10d._new_process_group_helper
    kwargs: dict[str, Any] = {"timeout": group.timeout or c10d._get_default_timeout(c10d.Backend(group.backend)),
                              "pg_tag": group.tag, "device_id": getattr(default, "bound_device_id", None),
                              "group_desc": group.desc}
    known = inspect.signature(helper).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in known}
    pg, _store = helper(len(group.ranks), group.ranks.index(rank), group.ranks, c10d.Backend(group.backend), store,
                        group.name, **kwargs)
    c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(group.ranks)}
    return pg


def swap_references(mapping: dict[int, Any], olds: list[Any]) -> tuple[int, int]:
    """Replace each old object (``mapping``: ``id(old) -> new``) where a dict's value, a list's item or an
    object's attribute holds it; returns (how many were replaced, how many holders could not be changed).

    >>> class Old: pass
    >>> class Holder: pass
    >>> old, new, h = Old(), Old(), Holder(); h.group = old; box = [old]
    >>> swap_references({id(old): new}, [old]), h.group is new, box[0] is new, old is new  # (the globals too)
    ((3, 0), True, True, True)
    """
    import types

    replaced = stuck = 0
    own = {id(olds), id(mapping)}
    for old in olds:
        if old is None or id(old) not in mapping:
            continue
        new = mapping[id(old)]
        for holder in gc.get_referrers(old):
            if id(holder) in own or isinstance(holder, (types.FrameType, KeptGroup, Snapshot)):
                continue
            n = _replace_in(holder, old, new)
            if n is None:
                if not isinstance(holder, (types.CellType, types.MethodType)):
                    stuck += 1
            else:
                replaced += n
    return replaced, stuck


def _replace_in(holder: Any, old: Any, new: Any) -> int | None:
    """Replace ``old`` by ``new`` in one holder (a dict's values, a list, an object's ``__dict__`` or slots);
    how many, or None where it cannot be changed (a tuple, a C++ object)."""
    if isinstance(holder, dict):
        keys = [key for key, value in holder.items() if value is old]
        for key in keys:
            holder[key] = new
        return len(keys)
    if isinstance(holder, list):
        places = [i for i, value in enumerate(holder) if value is old]
        for i in places:
            holder[i] = new
        return len(places)
    count = 0
    attrs = getattr(holder, "__dict__", None)
    if isinstance(attrs, dict):  # (an object whose attributes live in it: what gc names as the referrer)
        for key in [key for key, value in attrs.items() if value is old]:
            attrs[key] = new  # (also a frozen dataclass's)
            count += 1
    for cls in type(holder).__mro__:
        for slot in cls.__dict__.get("__slots__", ()):
            if isinstance(slot, str) and getattr(holder, slot, None) is old:
                object.__setattr__(holder, slot, new)
                count += 1
    if count or type(holder).__name__ == "_World":  # (torch's registry: it let go of the old groups)
        return count
    return None


def is_live(group: Any) -> bool:
    """Whether a process group is one torch knows now (not one destroyed with an earlier default group)."""
    import torch.distributed.distributed_c10d as c10d

    return group is not None and group in c10d._world.pg_names


def fsdp_groups_live(model: Any) -> bool | None:
    """Whether every FSDP2 module in ``model`` uses live groups (after :func:`restore`); None: no FSDP2 module."""
    found = None
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        group = getattr(get_state(), "_fsdp_param_group", None) if get_state is not None else None
        if group is None:
            continue
        for info in (group.mesh_info, group.post_forward_mesh_info):
            for name in ("shard_process_group", "replicate_process_group"):
                pg = getattr(info, name, None) if info is not None else None
                if pg is not None:
                    if not is_live(pg):
                        return False
                    found = True
    return found


def _reattach_ddp(mapping: dict[int, Any], default: Any) -> int:
    """Give each ``DistributedDataParallel`` whose process group was made again a reducer on it (its old reducer
    holds the old group in C++). DDPs on the default group are the backend's (:meth:`Backend.reattach`)."""
    from torch.nn.parallel import DistributedDataParallel

    news = {id(pg) for pg in mapping.values()}
    count = 0
    for obj in gc.get_objects():
        if isinstance(obj, DistributedDataParallel):
            group = getattr(obj, "process_group", None)
            if group is not None and group is not default and id(group) in news:
                obj._update_process_group(group)
                count += 1
    return count
