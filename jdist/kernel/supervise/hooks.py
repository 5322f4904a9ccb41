"""Hooks: features that act inside a running cell (the debuggers) without living in the supervisor's loop.

A :class:`CellHook` is polled like the detectors: :meth:`~CellHook.before` may change the code sent (the
Debugger panel pads it), :meth:`~CellHook.on_message` sees each data message first and says whether it took
it, :meth:`~CellHook.after` cleans up once the ranks stopped (also after a fault). A hook that pauses a
rank calls :meth:`CellSupervisor.pause <jdist.kernel.supervise.CellSupervisor.pause>`: a paused rank is no
hang. The debuggers' hooks: :mod:`jdist.kernel.debug.hooks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .supervisor import CellSupervisor


class CellHook(Protocol):
    def before(self, sup: CellSupervisor, code: str) -> str:
        """Before the cell is sent; returns the code to send."""

    def on_message(self, sup: CellSupervisor, rank: int, msg: dict[str, Any]) -> bool:
        """A data message of rank ``rank``; True if the hook took it (nobody else sees it)."""

    def after(self, sup: CellSupervisor) -> None:
        """The ranks' parts ended (finished, failed, released or interrupted), before the drain."""
