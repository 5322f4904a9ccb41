"""The debuggers inside a running cell, as :class:`~jdist.kernel.supervise.hooks.CellHook` objects.

The cell supervisor knows nothing of debuggers: it hands each data message to its hooks first
(:meth:`CellHook.on_message`), and keeps the ranks a hook says are paused out of the hang watchdog
(:meth:`jdist.kernel.supervise.CellSupervisor.pause`).

- :class:`PdbHook` (``--debug-ranks R``): ``breakpoint()`` on rank R stops there; pdb's text appears in
  the notebook with an input box, the line typed goes back to the rank on its control channel.
- :class:`DapHook`: JupyterLab's Debugger panel has breakpoints in this cell
  (:mod:`jdist.kernel.debug.dapbridge`); the cell is sent padded as the panel names it, and each
  rank's stop and continue reach the panel.
"""

from __future__ import annotations

import builtins
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from jdist.protocol import DEBUG_REPLY

from . import dapbridge

if TYPE_CHECKING:
    from ..supervise.supervisor import CellSupervisor

#: What a pdb line that ends the stop looks like (the rank goes on or leaves pdb).
LEAVES_PDB = ("c", "cont", "continue", "q", "quit", "exit")


class PdbHook:
    """``breakpoint()`` / ``pdb.set_trace()`` stop on ``ranks`` with a prompt in the notebook; ``ask``: how
    a line is read (default: ``input``, looked up when asked: the notebook's input box)."""

    def __init__(self, ranks: Sequence[int], ask: Callable[[str], str] | None = None):
        self.ranks = list(ranks)
        self.ask = ask

    def before(self, sup: CellSupervisor, code: str) -> str:
        sup.cluster.call("debug_arm", self.ranks)
        return code

    def on_message(self, sup: CellSupervisor, rank: int, msg: dict[str, Any]) -> bool:
        if msg["kind"] != "debug":
            return False
        self.prompt(sup, rank, msg)
        return True

    def prompt(self, sup: CellSupervisor, rank: int, msg: dict[str, Any]) -> None:
        """Rank ``rank`` waits in pdb: show what pdb wrote, ask for a line in the notebook, send it back on the
        engine's control channel. While the input box is open nothing else is polled (no hang is declared
        for the ranks waiting for this one)."""
        text = msg["text"].removesuffix("(Pdb) ")
        if sup.releasing:  # interrupted or released: no more input boxes, the rank's pdb is told to quit
            sup.cluster.reply(rank, DEBUG_REPLY, {"seq": msg["seq"], "line": "q"})
            return
        if rank not in sup.paused:
            sup.pause(rank, True)
            sup.say_paused(rank, "at breakpoint()", "c continues, q stops the cell on this rank")
        if text.strip():  # several ranks in pdb: each answer labelled, as their prompts are
            lines = text.rstrip("\n").splitlines()
            print("\n".join(f"[rank {rank}] {line}" for line in lines) if len(self.ranks) > 1 else "\n".join(lines))
        try:
            line = (self.ask or builtins.input)(f"(Pdb r{rank}) ")
        except (EOFError, NotImplementedError):  # no input box (a frontend without stdin)
            print(f"jdist: no input box here (this frontend does not allow input): rank {rank} continues.")
            line = "c"
        sup.cluster.reply(rank, DEBUG_REPLY, {"seq": msg["seq"], "line": line})
        if line.strip() in LEAVES_PDB:
            sup.pause(rank, False)
        sup.last_progress = time.monotonic()

    def after(self, sup: CellSupervisor) -> None:
        if not sup.cluster.dead_ranks():
            try:
                sup.cluster.call("debug_arm", None, timeout=10)
            except Exception:  # the ranks are stuck or gone: the cell's report says so
                pass


class DapHook:
    """The Debugger panel's breakpoints in this cell (``raw``: the cell as typed, by which the panel names
    it) stop ``debug_ranks`` (default: the cell's lowest rank)."""

    def __init__(self, raw: str, debug_ranks: Sequence[int] = ()):
        self.raw = raw
        self.debug_ranks = list(debug_ranks)
        self.bridge: Any = None  # the DapBridge, while the panel has breakpoints in this cell
        self.told: set[int] = set()  # ranks whose stop the notebook was told of

    def before(self, sup: CellSupervisor, code: str) -> str:
        bridge = dapbridge.current()
        if bridge is None:
            return code
        padded = bridge.prepare(sup.cluster, code, self.raw, sup.ranks, self.debug_ranks)
        if padded is None:
            return code
        self.bridge = bridge
        return padded

    def on_message(self, sup: CellSupervisor, rank: int, msg: dict[str, Any]) -> bool:
        if msg["kind"] != "dap":
            return False
        if self.bridge is None:
            return True
        stopped = self.bridge.on_event(rank, msg["event"])
        if stopped and rank not in sup.paused:
            sup.pause(rank, True)
            if rank not in self.told:  # once per cell: each step stops the rank again
                self.told.add(rank)
                sup.say_paused(rank, "at a breakpoint (the Debugger panel shows its stack and variables)",
                               "continue in the panel goes on")
        elif not stopped and rank in sup.paused:
            sup.pause(rank, False)
        return True

    def after(self, sup: CellSupervisor) -> None:
        if self.bridge is not None:
            self.bridge.finish(sup.cluster, sup.ranks)


def debug_hooks(debug_ranks: Sequence[int] | None, raw: str | None,
                ask: Callable[[str], str] | None = None) -> list[Any]:
    """The hooks of a notebook cell: pdb prompts on ``debug_ranks`` (if any), the Debugger panel (if ``raw``)."""
    hooks: list[Any] = []
    if debug_ranks:
        hooks.append(PdbHook(debug_ranks, ask))
    if raw is not None:
        hooks.append(DapHook(raw, debug_ranks or ()))
    return hooks
