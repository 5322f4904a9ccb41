"""The cluster state files that connect a kernel's jdist cluster to the Jupyter server.

The kernel side (:meth:`jdist.cluster.DistributedCluster.start`) writes one JSON file per
running cluster, ``<jupyter runtime dir>/jdist/clusters/<cluster id>.json`` (mode 0600: it
names the controller's connection file), and removes it on stop. The server side
(:mod:`jdist.server.manager`) reads them. A file whose kernel process is gone (killed, or
restarted by the server: same kernel id, new process) is stale: :func:`read_all` says so
and the manager deletes it.

Example:
    >>> import tempfile
    >>> read_all(tempfile.mkdtemp())
    []
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Bumped when the file format changes incompatibly; readers skip other versions.
VERSION = 1


def clusters_dir(runtime_dir: str | os.PathLike | None = None) -> Path:
    """``<runtime dir>/jdist/clusters`` (``runtime_dir`` default: ``jupyter_runtime_dir()``)."""
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    return Path(runtime_dir) / "jdist" / "clusters"


def process_identity(pid: int) -> dict[str, Any]:
    """``{"pid", "create_time"}`` of a process: a PID alone can be reused by another process."""
    import psutil

    return {"pid": pid, "create_time": psutil.Process(pid).create_time()}


def process_alive(ident: dict[str, Any] | None) -> bool:
    """Whether the process of :func:`process_identity` still runs (same PID and start time, not a zombie).

    >>> process_alive(process_identity(os.getpid()))
    True
    >>> process_alive({"pid": os.getpid(), "create_time": 1.0})
    False
    """
    import psutil

    if not ident or not ident.get("pid"):
        return False
    try:
        proc = psutil.Process(ident["pid"])
        if abs(proc.create_time() - float(ident.get("create_time") or 0)) > 1.0:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def kernel_identity() -> dict[str, Any]:
    """The running kernel's id (from its connection file name), connection file and notebook.

    Outside a Jupyter kernel the id, file and notebook are None. ``notebook`` is the path the
    server started the kernel for (``JPY_SESSION_NAME``); the server's session manager knows
    the current one (after renames).
    """
    ident: dict[str, Any] = {"id": None, "connection_file": None, "notebook": os.environ.get("JPY_SESSION_NAME")}
    ident.update(process_identity(os.getpid()))
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


def describe(cluster: Any) -> dict[str, Any]:
    """The state file contents for a started :class:`jdist.cluster.DistributedCluster`."""
    from jdist import __version__
    from jdist.metrics import default_run_dir

    ipp_cluster = cluster.cluster
    security = Path(ipp_cluster.profile_dir) / "security"
    controller = ipp_cluster.controller.process
    return {
        "version": VERSION,
        "jdist": __version__,
        "cluster_id": ipp_cluster.cluster_id,
        "host": socket.gethostname(),
        "kernel": kernel_identity(),
        "python": sys.executable,
        "controller": {"pid": controller.pid, "create_time": controller.create_time()},
        "client_file": str(security / f"ipcontroller-{ipp_cluster.cluster_id}-client.json"),
        "cluster_file": str(ipp_cluster.cluster_file),
        "config": asdict(cluster.config),
        "ranks": [{**info, "engine_id": cluster._engine_of_rank.get(info["rank"])} for info in cluster.ranks],
        "started_at": cluster.started_at,
        "written_at": time.time(),
        "run_dir": str(default_run_dir()),
    }


def write(cluster: Any, runtime_dir: str | os.PathLike | None = None) -> Path | None:
    """Write the state file of ``cluster`` (atomically, mode 0600); None if that failed.

    Best effort: a cluster works without it (it is then not listed by the server extension).
    The file is also removed when this process exits normally.
    """
    try:
        if runtime_dir is None:
            # next to the kernel's connection file: the runtime dir of the server that started it
            conn = kernel_identity().get("connection_file")
            runtime_dir = Path(conn).parent if conn else None
        folder = clusters_dir(runtime_dir)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = describe(cluster)
        path = folder / f"{data['cluster_id']}.json"
        tmp = folder / f".{data['cluster_id']}.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, default=str)
        tmp.replace(path)
        atexit.register(_unlink, path)
        return path
    except Exception as exc:
        log.warning("jdist: could not write the cluster state file for the Jupyter sidebar: %s", exc)
        return None


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def read_all(runtime_dir: str | os.PathLike | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every readable state file of the current format, oldest cluster first: ``(path, data)``."""
    return read_folder(clusters_dir(runtime_dir))


def read_folder(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """:func:`read_all` for a ``.../jdist/clusters`` folder."""
    if not folder.is_dir():
        return []
    out = []
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile, or being replaced
        if isinstance(data, dict) and data.get("version") == VERSION:
            out.append((path, data))
    return sorted(out, key=lambda item: item[1].get("started_at") or 0)


def is_stale(data: dict[str, Any]) -> bool:
    """True when the owning kernel process is gone (the cluster can no longer be used from it)."""
    return not process_alive(data.get("kernel"))
