"""The execution state of the server's kernels, as the sidebar needs it.

The server's own ``execution_state`` also flips to idle when a comm message handled in a
subshell ends (ipykernel 7 routes widget comms to subshells while a cell runs), so it says
"idle" in the middle of a training cell. :class:`KernelWatcher` follows each kernel's IOPub
status messages instead: only the status of ``execute_request`` messages of the main shell
counts; until the first one, the server's state is used.
"""

from __future__ import annotations

import logging
from typing import Any


class _KernelWatch:
    """Follows one kernel's main-shell execution state from its IOPub status messages."""

    def __init__(self, kernel: Any):
        from jupyter_client.session import Session

        self.kernel = kernel
        self.state: str | None = None
        self.session = Session(config=kernel.session.config, key=kernel.session.key)
        self.stream = kernel.connect_iopub()
        self.stream.on_recv(self._on_recv)

    def _on_recv(self, msg_list: list[bytes]) -> None:
        try:
            _, fed = self.session.feed_identities(msg_list)
            msg = self.session.deserialize(fed, content=False)
            if msg["header"]["msg_type"] != "status":
                return
            parent = msg.get("parent_header") or {}
            content = self.session.deserialize(fed)["content"]
        except Exception:
            return
        state = content.get("execution_state")
        if not parent and state == "starting":  # a (re)started kernel process
            self.state = "idle"
        elif parent.get("msg_type") == "execute_request" and not parent.get("subshell_id"):
            self.state = state

    def close(self) -> None:
        try:
            self.stream.close()
        except Exception:
            pass


class KernelWatcher:
    """Watches every kernel of the server's kernel manager (call :meth:`refresh` periodically on
    the server's event loop: new kernels get a watch before they run their first cell)."""

    def __init__(self, kernel_manager: Any, log: logging.Logger | None = None):
        self.kernel_manager = kernel_manager
        self.log = log or logging.getLogger(__name__)
        self._watches: dict[str, _KernelWatch] = {}

    def refresh(self) -> None:
        if self.kernel_manager is None:
            return
        ids = set(self.kernel_manager.list_kernel_ids())
        for kid in set(self._watches) - ids:
            self._watches.pop(kid).close()
        for kid in ids - set(self._watches):
            try:
                self._watches[kid] = _KernelWatch(self.kernel_manager.get_kernel(kid))
            except Exception as exc:  # e.g. a kernel still starting
                self.log.debug("jdist: cannot watch kernel %s yet: %s", kid, exc)

    def kernel(self, kernel_id: str | None) -> Any:
        """The server's KernelManager of ``kernel_id`` (None if this server does not manage it)."""
        if self.kernel_manager is None or not kernel_id:
            return None
        try:
            return self.kernel_manager.get_kernel(kernel_id)
        except KeyError:
            return None

    def state(self, kernel_id: str | None) -> str | None:
        """``idle``/``busy``/``starting`` of a kernel of this server (main shell), None if not ours."""
        km = self.kernel(kernel_id)
        if km is None:
            return None
        watch = self._watches.get(kernel_id)  # type: ignore[arg-type]
        if watch is None or watch.kernel is not km:
            self.refresh()
            watch = self._watches.get(kernel_id)  # type: ignore[arg-type]
        return (watch.state if watch is not None else None) or getattr(km, "execution_state", None)

    def close(self) -> None:
        for watch in self._watches.values():
            watch.close()
        self._watches.clear()
