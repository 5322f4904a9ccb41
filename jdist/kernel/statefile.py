"""The cluster state file that connects a kernel's jdist cluster to the Jupyter server.

When a cluster starts, the kernel writes one JSON file (:class:`jdist.protocol.ClusterState`),
``<jupyter runtime dir>/jdist/clusters/<cluster id>.json`` with mode 0600 (it names the
controller's connection file), next to the kernel's own connection file, i.e. into the runtime
dir of the server that started the kernel. It is removed when the cluster stops and when the
kernel exits. The server extension reads these files (:mod:`jdist.server.registry`). This module knows
the file, not the cluster: what goes in it is :meth:`ClusterSession.state
<jdist.kernel.cluster.ClusterSession.state>`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
from pathlib import Path

from jupyter_core.paths import secure_write

from jdist.common.paths import clusters_dir
from jdist.common.procs import identity
from jdist.protocol import ClusterState, KernelIdentity

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


def write(data: ClusterState, runtime_dir: str | os.PathLike | None = None) -> Path | None:
    """Write a cluster's state file (``data``: :meth:`ClusterSession.state
    <jdist.kernel.cluster.ClusterSession.state>`; atomically, mode 0600); None if that failed.

    Best effort: a cluster works without it (it is then not listed by the server extension).
    """
    try:
        if runtime_dir is None:
            conn = kernel_identity().get("connection_file")
            runtime_dir = Path(conn).parent if conn else None
        folder = clusters_dir(runtime_dir)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
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
