"""jdist's Jupyter server extension: REST endpoints behind the JupyterLab "Distributed" sidebar.

Enabled automatically by ``jupyter-config/jupyter_server_config.d/jdist.json`` (installed with
the package). :mod:`~jdist.server.manager` holds the logic (over :mod:`~jdist.server.registry`,
:mod:`~jdist.server.kernels` and :mod:`~jdist.server.runs`); :mod:`~jdist.server.handlers` the
HTTP layer. Importing this package does not import jupyter_server.
"""

from __future__ import annotations

from typing import Any

from jdist import __version__ as __version__  # shown by `jupyter server extension list`


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jdist.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_core.paths import jupyter_runtime_dir
    from tornado.ioloop import PeriodicCallback

    from .handlers import setup_handlers
    from .manager import JdistManager

    km = serverapp.kernel_manager
    dirs = [serverapp.runtime_dir, getattr(km, "connection_dir", None) or serverapp.runtime_dir, jupyter_runtime_dir()]
    manager = JdistManager(runtime_dirs=dirs, kernel_manager=km, session_manager=serverapp.session_manager,
                           log=serverapp.log)
    setup_handlers(serverapp.web_app, manager)
    # watch each kernel's execution state from its start on; drop the state of dead kernels' clusters
    periodic = PeriodicCallback(manager.periodic, 1000)
    periodic.start()
    serverapp.web_app.settings["jdist_periodic"] = periodic
    serverapp.log.info("jdist server extension loaded: clusters from %s, runs from %s",
                       ", ".join(map(str, manager.state_dirs)), manager.run_dir)


def _unload_jupyter_server_extension(serverapp: Any) -> None:
    settings = serverapp.web_app.settings
    periodic = settings.pop("jdist_periodic", None)
    if periodic is not None:
        periodic.stop()
    manager = settings.pop("jdist_manager", None)
    if manager is not None:
        manager.close()
