"""``--mesh NAME=SIZE,...``: a device mesh's dimensions, read and checked against the world size (pure).

The kernel checks the option with it before anything starts; the ranks build their ``mesh`` from what it
returns (:mod:`jdist.rank.mesh.api`). One size may be ``-1``: the ranks left over.

>>> parse_mesh("pp=2,dp=-1,tp=2", 8)
(('pp', 2), ('dp', 2), ('tp', 2))
>>> parse_mesh("dp=2,tp=3", 4)
Traceback (most recent call last):
...
ValueError: --mesh dp=2,tp=3 is 6 ranks, but the cluster has 4: e.g. --mesh dp=2,tp=2 (or dp=-1,tp=2).
"""

from __future__ import annotations

import math

Dims = tuple[tuple[str, int], ...]


def format_mesh(dims: Dims) -> str:
    """``(("dp", 2), ("tp", 2))`` -> ``"dp=2,tp=2"``."""
    return ",".join(f"{name}={size}" for name, size in dims)


def suggest(names: list[str], sizes: list[int], world_size: int) -> Dims:
    """A mesh with these names that fits ``world_size``: from the last dimension back, each keeps the largest
    divisor of what is left that is not above its size; the first takes the rest.

    >>> suggest(["dp", "tp"], [2, 3], 4), suggest(["pp", "dp", "tp"], [2, 2, 2], 4)
    ((('dp', 2), ('tp', 2)), (('pp', 1), ('dp', 2), ('tp', 2)))
    """
    left = world_size
    out: list[tuple[str, int]] = []
    for name, size in reversed(list(zip(names[1:], sizes[1:]))):
        fit = max(d for d in range(1, left + 1) if left % d == 0 and d <= max(size, 1))
        out.append((name, fit))
        left //= fit
    out.append((names[0], left))
    return tuple(reversed(out))


def parse_mesh(text: str, world_size: int) -> Dims:
    """The dimensions of ``text`` (``NAME=SIZE`` pairs, commas between them), their product ``world_size``;
    a ValueError of one line naming the world size and a form that fits otherwise.

    >>> parse_mesh("tp=-1", 4)
    (('tp', 4),)
    >>> parse_mesh("dp=2,dp=2", 4)
    Traceback (most recent call last):
    ...
    ValueError: --mesh dp=2,dp=2 names dp twice: give each dimension once, e.g. --mesh dp=2,tp=2 for the cluster's 4 ranks.
    >>> parse_mesh("dp2", 4)
    Traceback (most recent call last):
    ...
    ValueError: --mesh 'dp2': give NAME=SIZE pairs separated by commas (one size may be -1, the rest), e.g. --mesh dp=2,tp=2 for the cluster's 4 ranks.
    """
    example = format_mesh(suggest(["dp", "tp"], [world_size, 2], world_size)) if world_size > 1 else "dp=1"
    form = (f"give NAME=SIZE pairs separated by commas (one size may be -1, the rest), e.g. --mesh {example} "
            f"for the cluster's {world_size} ranks.")
    names: list[str] = []
    sizes: list[int] = []
    for part in str(text).replace(" ", "").split(","):
        name, eq, size = part.partition("=")
        try:
            value = int(size)
        except ValueError:
            value = 0
        if not eq or not name.isidentifier() or not (value >= 1 or value == -1):
            raise ValueError(f"--mesh {text!r}: {form}")
        if name in names:
            raise ValueError(f"--mesh {text} names {name} twice: give each dimension once, e.g. --mesh "
                             f"{format_mesh(suggest(['dp', 'tp'], [world_size, 2], world_size))} for the cluster's "
                             f"{world_size} ranks.")
        names.append(name)
        sizes.append(value)
    rest = [i for i, size in enumerate(sizes) if size == -1]
    known = math.prod(size for size in sizes if size != -1)
    if len(rest) > 1:
        raise ValueError(f"--mesh {text}: only one size may be -1 (the rest of the {world_size} ranks), e.g. --mesh "
                         f"{format_mesh(_with_rest(suggest(names, [s if s > 0 else 2 for s in sizes], world_size)))}.")
    if rest:
        if world_size % known:
            fit = suggest(names, [s if s != -1 else world_size for s in sizes], world_size)
            raise ValueError(f"--mesh {text}: the other sizes ({known} ranks) do not divide the cluster's {world_size}: "
                             f"e.g. --mesh {format_mesh(fit)}.")
        sizes[rest[0]] = world_size // known
    if math.prod(sizes) != world_size:
        fit = suggest(names, sizes, world_size)
        raise ValueError(f"--mesh {text} is {math.prod(sizes)} ranks, but the cluster has {world_size}: e.g. --mesh "
                         f"{format_mesh(fit)} (or {format_mesh(_with_rest(fit))}).")
    return tuple(zip(names, sizes))


def _with_rest(dims: Dims) -> Dims:
    """The same mesh with ``-1`` for the first size."""
    return ((dims[0][0], -1),) + tuple(dims[1:])
