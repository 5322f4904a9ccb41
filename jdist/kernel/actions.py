"""Runs in the kernel: the server extension's restart/stop requests, as ``%dist`` does them.

The server executes ``run_action("restart" | "stop", cluster_id)`` in the idle kernel that owns
the cluster (silently, without history), so the kernel's own
:class:`jdist.kernel.cluster.ClusterSession` and ``jdist.kernel.cluster.current()`` stay consistent with
what the sidebar shows. The outcome text is left in :data:`LAST` for the reply.
"""

from __future__ import annotations

import contextlib
import io

#: The text of the last action (what ``%dist`` printed), read back by the server.
LAST = ""


def run_action(action: str, cluster_id: str) -> str:
    """``%dist restart`` or ``%dist stop`` if ``cluster_id`` is the kernel's current cluster."""
    global LAST
    from IPython import get_ipython

    from jdist.errors import ClusterChanged

    from . import cluster as cl

    if action not in ("restart", "stop"):
        raise ValueError(f"unknown action {action!r}")
    current = cl.current()
    if current is None or current.cluster_id != cluster_id:
        raise ClusterChanged(f"cluster {cluster_id} is no longer running in this kernel")
    ip = get_ipython()
    if "dist" not in ip.magics_manager.magics["line"]:
        ip.extension_manager.load_extension("jdist")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ip.run_line_magic("dist", action)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    LAST = lines[-1] if lines else f"%dist {action} done."
    return LAST
