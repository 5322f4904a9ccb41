"""The cluster state file that connects a kernel's jdist cluster to the Jupyter server.

When a cluster starts, the kernel writes one JSON file (:class:`jdist.protocol.ClusterState`),
``<jupyter runtime dir>/jdist/clusters/<cluster id>.json`` with mode 0600 (it names the
controller's connection file), next to the kernel's own connection file, i.e. into the runtime
dir of the server that started the kernel. It is removed when the cluster stops and when the
kernel exits. The server extension reads these files (:mod:`jdist.server.registry`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from jupyter_core.paths import secure_write

from jdist.paths import clusters_dir
from jdist.procs import identity
from jdist.protocol import STATE_VERSION, ClusterState, KernelIdentity, RankEntry

if TYPE_CHECKING:
    from .cluster import ClusterSession

log = logging.getLogger(__name__)

_written: set[Path] = set()  # state files of this process, removed at exit if still there


def kernel_identity() -> KernelIdentity:
    """The running kernel's id (from its connection file name), connection file, notebook and process.

    Outside a Jupyter kernel the id, file and notebook are None. ``notebook`` is the path the
    server started the kernel for (``JPY_SESSION_NAME``); the server's session manager knows
    the current one (after renames).
    """
    proc = identity(os.getpid())
    ident = KernelIdentity(id=None, connection_file=None, notebook=os.environ.get("JPY_SESSION_NAME"),
                           pid=proc["pid"], create_time=proc["create_time"])
    try:
        from ipykernel.kernelapp import IPKernelApp

        if IPKernelApp.initialized():
            from ipykernel.connect import get_connection_file

            path = get_connection_file()
            ident["connection_file"] = path
            match = re.fullmatch(r"kernel-(.+)\.json", os.path.basename(path))
            ident["id"] = match.group(1) if match else None
    except Exception as exc:  # not a kernel, or an ipykernel without these
        log.debug("no kernel identity: %s", exc)
    return ident


def state_of(cluster: ClusterSession) -> ClusterState:
    """The state file contents for a started cluster."""
    from jdist import __version__
    from jdist.metrics import default_run_dir

    from jdist.plugins import option_table

    ipp = cluster.ipp
    controller = ipp.controller.process
    return ClusterState(
        version=STATE_VERSION,
        jdist=__version__,
        cluster_id=ipp.cluster_id,
        host=socket.gethostname(),
        launcher=cluster.config.launcher,
        kernel=kernel_identity(),
        python=sys.executable,
        controller=identity(controller.pid),
        client_file=str(ipp.controller.connection_files["client"]),
        cluster_file=str(ipp.cluster_file),
        config=cluster.config.as_dict(),
        options=option_table().describe(cluster.config),  # type: ignore[typeddict-item]
        ranks=[RankEntry(**info, engine_id=cluster.engine_of(info["rank"])) for info in cluster.ranks],
        started_at=cluster.started_at or time.time(),
        written_at=time.time(),
        run_dir=str(default_run_dir()),
        paused=sorted(cluster.paused),
    )


def write(cluster: ClusterSession, runtime_dir: str | os.PathLike | None = None) -> Path | None:
    """Write the state file of ``cluster`` (atomically, mode 0600); None if that failed.

    Best effort: a cluster works without it (it is then not listed by the server extension).
    """
    try:
        if runtime_dir is None:
            conn = kernel_identity().get("connection_file")
            runtime_dir = Path(conn).parent if conn else None
        folder = clusters_dir(runtime_dir)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = state_of(cluster)
        path = folder / f"{data['cluster_id']}.json"
        tmp = folder / f".{data['cluster_id']}.json.tmp"
        with secure_write(str(tmp)) as fh:  # 0600 (Jupyter's own way); renamed whole: readers never see half
            json.dump(data, fh, indent=1, default=str)
        tmp.replace(path)
        if not _written:
            atexit.register(_remove_all)
        _written.add(path)
        return path
    except Exception as exc:
        log.warning("jdist: could not write the cluster state file for the Jupyter sidebar: %s", exc)
        return None


def remove(path: Path | None) -> None:
    """Remove a state file this process wrote (missing is fine)."""
    if path is None:
        return
    _written.discard(path)
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def forget(path: Path | None) -> None:
    """Leave a state file this process wrote to the process that took its cluster over (it
    rewrote the file: same cluster id, same name)."""
    if path is not None:
        _written.discard(path)


def _remove_all() -> None:
    for path in list(_written):
        remove(path)
