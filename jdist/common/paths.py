"""Where jdist's shared files live (kernel and server agree on them).

Example:
    >>> clusters_dir("/run/user/1000/jupyter").as_posix()
    '/run/user/1000/jupyter/jdist/clusters'
"""

from __future__ import annotations

import os
from pathlib import Path


def clusters_dir(runtime_dir: str | os.PathLike | None = None) -> Path:
    """Where cluster state files go: ``<runtime dir>/jdist/clusters`` (default: ``jupyter_runtime_dir()``)."""
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    return Path(runtime_dir) / "jdist" / "clusters"
