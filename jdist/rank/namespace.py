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


class RankExit:
    """``exit``/``quit`` on a rank: raise ``SystemExit(code)`` as Python's own do in a script.

    IPython's versions would end the engine process (the rank) after the cell, so the next cell
    would find it dead; and inside a ``%run`` script IPython hides them (``NameError``). On a rank
    they end the cell or script, which the kernel reports as an exit with its code; the rank stays.
    A bare ``exit`` in a cell calls it too (IPython's autocall).

    >>> RankExit("exit")(3)
    Traceback (most recent call last):
    SystemExit: 3
    """

    rewrite = False  # IPyAutocall's attribute: no "------> exit()" line

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() to end the cell or script on this rank (the rank stays; %dist stop ends it)."

    def __call__(self, code: Any = None) -> None:
        raise SystemExit(code)


def install_exit(shell: Any) -> None:
    """``exit``/``quit`` as :class:`RankExit` in the cell namespace and in scripts run with
    ``%run``, and no "To exit: use 'exit', 'quit', or Ctrl-D." warning after a ``SystemExit``."""
    import warnings

    from IPython.core.autocall import IPyAutocall

    autocall = type("RankExitAutocall", (RankExit, IPyAutocall), {})
    for name in ("exit", "quit"):
        obj = autocall(name)
        obj.set_ip(shell)
        shell.user_ns[name] = obj
        shell.user_ns_hidden[name] = obj
        shell.builtin_trap.auto_builtins[name] = obj  # builtins while a cell runs: what %run scripts see
    warnings.filterwarnings("ignore", message="To exit: use 'exit', 'quit', or Ctrl-D", category=UserWarning)
