"""Thin tornado handlers over :class:`jdist.server.manager.JdistManager` (authenticated REST).

Routes, under the server's base URL:

- ``GET  jdist/api/clusters``: running clusters with per-rank state
- ``POST jdist/api/clusters/<cluster id>/interrupt|restart|stop``
- ``GET  jdist/api/runs?limit=N``: recent runs with sparkline series
- ``GET  jdist/api/runs/<run id>``: one run with the dashboard panels' data
- ``GET  jdist/api/sweeps?limit=N``: recent ``jdist.tune`` sweeps (trials per state, best so far)
- ``GET  jdist/api/sweeps/<name>``: one sweep with its view (the notebook's HTML and SVG)
"""

from __future__ import annotations

import json
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .manager import DEFAULT_RUN_LIMIT, ActionError, JdistManager

_ID = r"[A-Za-z0-9_.-]+"


class _Base(APIHandler):
    @property
    def manager(self) -> JdistManager:
        return self.settings["jdist_manager"]

    def reply(self, data: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data, allow_nan=False))

    def limit(self) -> int:
        """``?limit=N`` (default :data:`DEFAULT_RUN_LIMIT`, within 1-200)."""
        try:
            limit = int(self.get_query_argument("limit", str(DEFAULT_RUN_LIMIT)))
        except ValueError:
            raise tornado.web.HTTPError(400, "limit must be an integer") from None
        return min(max(limit, 1), 200)

    async def call(self, coro: Any) -> None:
        try:
            self.reply(await coro)
        except ActionError as exc:
            self.set_status(exc.status)
            self.reply({"ok": False, "message": exc.message})


class ClustersHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        await self.call(_wrap("clusters", self.manager.clusters()))


class ClusterActionHandler(_Base):
    @tornado.web.authenticated
    async def post(self, cluster_id: str, action: str) -> None:
        await self.call(getattr(self.manager, action)(cluster_id))


class RunsHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        await self.call(_wrap("runs", self.manager.runs(self.limit())))


class RunHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        await self.call(self.manager.run(run_id))


class SweepsHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        await self.call(_wrap("sweeps", self.manager.sweeps(self.limit())))


class SweepHandler(_Base):
    @tornado.web.authenticated
    async def get(self, name: str) -> None:
        await self.call(self.manager.sweep(name))


async def _wrap(key: str, coro: Any) -> dict[str, Any]:
    return {key: await coro}


def setup_handlers(web_app: Any, manager: JdistManager) -> None:
    base = url_path_join(web_app.settings["base_url"], "jdist", "api")
    web_app.settings["jdist_manager"] = manager
    web_app.add_handlers(".*$", [
        (url_path_join(base, "clusters"), ClustersHandler),
        (url_path_join(base, "clusters", f"({_ID})", "(interrupt|restart|stop)"), ClusterActionHandler),
        (url_path_join(base, "runs"), RunsHandler),
        (url_path_join(base, "runs", f"({_ID})"), RunHandler),
        (url_path_join(base, "sweeps"), SweepsHandler),
        (url_path_join(base, "sweeps", f"({_ID})"), SweepHandler),
    ])
