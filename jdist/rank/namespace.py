"""The rank's cell namespace (the engine's IPython ``user_ns``): where cells' variables live."""

from __future__ import annotations

from typing import Any


def user_ns() -> dict[str, Any]:
    """The namespace ``%%distributed`` cells run in ({} outside IPython)."""
    from IPython import get_ipython

    shell = get_ipython()
    return shell.user_ns if shell is not None else {}


def names_of_objects() -> dict[int, str]:
    """id(value) -> variable name, for the namespace's public variables."""
    return {id(v): k for k, v in user_ns().items() if not k.startswith("_")}


def get(name: str) -> Any:
    """The value of ``name``; NameError saying it is not defined on this rank."""
    ns = user_ns()
    if name not in ns:
        raise NameError(f"name {name!r} is not defined on this rank")
    return ns[name]
