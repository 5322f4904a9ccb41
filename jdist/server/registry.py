"""The clusters the server can see: the kernels' state files, and a client of each controller.

Kernels write one state file per running cluster (:mod:`jdist.kernel.statefile`, format
:class:`jdist.protocol.ClusterState`). A file whose kernel process is gone (killed, or
restarted by the server: same kernel id, new process) is stale: it is never listed, and
:meth:`ClusterRegistry.collect_garbage` (run periodically by the server) deletes it.

Example:
    >>> import tempfile
    >>> ClusterRegistry([tempfile.mkdtemp()]).live()
    []
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterable

from jdist.common.paths import clusters_dir
from jdist.common.procs import alive
from jdist.protocol import STATE_VERSION, ClusterState

#: Seconds to wait for a controller (connect, queue status, signal).
CONTROLLER_TIMEOUT_S = 10.0


def read_folder(folder: Path) -> list[tuple[Path, ClusterState]]:
    """Every readable state file of the current format in a ``.../jdist/clusters`` folder,
    oldest cluster first: ``(path, data)``."""
    if not folder.is_dir():
        return []
    out = []
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile, or being replaced
        if isinstance(data, dict) and data.get("version") == STATE_VERSION:
            out.append((path, data))
    return sorted(out, key=lambda item: item[1].get("started_at") or 0)


def is_stale(data: ClusterState | dict[str, Any]) -> bool:
    """True when the owning kernel process is gone (the cluster can no longer be used from it)."""
    return not alive(data.get("kernel"))


class Controller:
    """Our ipyparallel client of one cluster's controller (created on first use, one call at a time)."""

    def __init__(self, data: ClusterState):
        self.data = data
        self.lock = threading.Lock()
        self.client: Any = None

    def _connect(self) -> Any:
        if self.client is None:
            import ipyparallel as ipp

            self.client = ipp.Client(self.data["client_file"], timeout=CONTROLLER_TIMEOUT_S)
        return self.client

    def engine_states(self) -> dict[int, str]:
        from jdist.common.controller import engine_states

        with self.lock:
            return engine_states(self._connect())

    def signal(self, sig: int, engine_ids: list[int]) -> None:
        with self.lock:
            sent = self._connect().send_signal(sig, targets=engine_ids, block=False)
        try:  # outside the lock: an engine whose nanny is gone never answers (its rank's death is reported)
            sent.result(CONTROLLER_TIMEOUT_S)
        except TimeoutError:
            pass

    def close(self) -> None:
        with self.lock:
            client, self.client = self.client, None
        if client is not None:
            try:
                client.close(linger=0)
            except Exception:
                pass


class ClusterRegistry:
    """State files under ``runtime_dirs`` and one :class:`Controller` per live cluster (thread-safe)."""

    def __init__(self, runtime_dirs: Iterable[str | os.PathLike | None], log: logging.Logger | None = None):
        self.state_dirs = list(dict.fromkeys(clusters_dir(d) for d in runtime_dirs))
        self.log = log or logging.getLogger(__name__)
        self._lock = threading.Lock()
        self._controllers: dict[str, Controller] = {}

    def _all(self) -> list[tuple[Path, ClusterState]]:
        return [item for folder in self.state_dirs for item in read_folder(folder)]

    def live(self) -> list[ClusterState]:
        """State of every cluster whose kernel process runs (first state file of an id wins)."""
        found: dict[str, ClusterState] = {}
        for _, data in self._all():
            if not is_stale(data):
                found.setdefault(data["cluster_id"], data)
        return list(found.values())

    def find(self, cluster_id: str) -> ClusterState | None:
        return next((d for d in self.live() if d["cluster_id"] == cluster_id), None)

    def collect_garbage(self) -> None:
        """Delete stale state files; close the controllers of clusters that are gone."""
        for path, data in self._all():
            if is_stale(data):
                self.log.info("jdist: removing the state of cluster %s: its kernel is gone", data.get("cluster_id"))
                path.unlink(missing_ok=True)
        live = {d["cluster_id"] for d in self.live()}
        with self._lock:
            gone = [self._controllers.pop(cid) for cid in set(self._controllers) - live]
        for ctl in gone:
            ctl.close()

    def controller(self, data: ClusterState) -> Controller:
        with self._lock:
            ctl = self._controllers.get(data["cluster_id"])
            if ctl is None:
                ctl = self._controllers[data["cluster_id"]] = Controller(data)
            return ctl

    def forget_controller(self, cluster_id: str) -> None:
        """Drop a controller client that failed (a new one is made on the next use)."""
        with self._lock:
            ctl = self._controllers.pop(cluster_id, None)
        if ctl is not None:
            ctl.close()

    def close(self) -> None:
        with self._lock:
            controllers, self._controllers = list(self._controllers.values()), {}
        for ctl in controllers:
            ctl.close()
