"""What the "Distributed" sidebar shows and does, independent of tornado (testable on its own).

:class:`JdistManager` reads the same state the magics write, nothing of its own:

- clusters: the state files of :mod:`jdist.server.state` (written by
  :class:`jdist.cluster.DistributedCluster`); stale ones (kernel process gone) are deleted.
  Each rank's idle/busy/dead state comes from the cluster's ipyparallel controller through
  :func:`jdist.cluster.engine_states` (what ``%dist status`` uses), on a client of our own.
- notebook paths: the Jupyter server's session manager (kernel id -> notebook).
- runs: the run log folders (:func:`jdist.metrics.list_runs`, followed incrementally with
  :class:`jdist.metrics.RunReader`), the charts computed by :func:`jdist.dashboard.panel_data`
  as in the notebook dashboard.
- actions: interrupt (the kernel through the server's kernel manager while it runs a cell,
  it forwards SIGINT to the ranks; else SIGINT to the ranks through the controller),
  restart and stop (``%dist restart`` / ``%dist stop`` executed in the idle kernel, so its
  own cluster object stays consistent).

Blocking work (ipyparallel clients, file reading) runs in a small thread pool.

Example:
    >>> import asyncio, tempfile
    >>> m = JdistManager(runtime_dirs=[tempfile.mkdtemp()], run_dir=tempfile.mkdtemp())
    >>> asyncio.run(m.clusters())
    []
    >>> m.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import re
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from jdist.metrics import Run, RunReader, default_run_dir, list_runs

from . import state

#: Points per sparkline in the run list.
SPARK_POINTS = 60
#: Runs listed by default (every running one plus the most recent others).
DEFAULT_RUN_LIMIT = 12
#: Seconds to wait for a controller (connect, queue status, signal).
CONTROLLER_TIMEOUT_S = 10.0
_ID = re.compile(r"[A-Za-z0-9_.-]+")


class ActionError(Exception):
    """An action or lookup that cannot be done; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class _Controller:
    """Our ipyparallel client of one cluster's controller (created on first use, one call at a time)."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.lock = threading.Lock()
        self.client: Any = None

    def _connect(self) -> Any:
        if self.client is None:
            import ipyparallel as ipp

            self.client = ipp.Client(self.data["client_file"], timeout=CONTROLLER_TIMEOUT_S)
        return self.client

    def engine_states(self) -> dict[int, str]:
        from jdist.cluster import engine_states

        with self.lock:
            return engine_states(self._connect())

    def signal(self, sig: int, engine_ids: list[int]) -> None:
        with self.lock:
            self._connect().send_signal(sig, targets=engine_ids, block=True)

    def close(self) -> None:
        with self.lock:
            client, self.client = self.client, None
        if client is not None:
            try:
                client.close(linger=0)
            except Exception:
                pass


class _KernelWatch:
    """Follows one kernel's main-shell execution state from its IOPub status messages.

    The server's own ``execution_state`` also flips to idle when a comm message handled in a
    subshell ends (ipykernel 7 routes widget comms to subshells while a cell runs), so it says
    "idle" in the middle of a training cell. Here only the status of ``execute_request``
    messages of the main shell counts; until the first one, the server's state is used.
    """

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


class JdistManager:
    """Clusters, runs and actions for the server extension's REST handlers.

    ``runtime_dirs``: where kernels write cluster state files (the server's runtime dir);
    ``run_dir``: the run log root (default :func:`jdist.metrics.default_run_dir`); runs in
    the run dirs of running clusters' kernels are listed too. ``kernel_manager`` and
    ``session_manager`` are the Jupyter server's (None: no notebook names, no kernel
    actions; interrupt then signals the ranks).
    """

    def __init__(
        self,
        runtime_dirs: Iterable[str | os.PathLike] | None = None,
        run_dir: str | os.PathLike | None = None,
        kernel_manager: Any = None,
        session_manager: Any = None,
        log: logging.Logger | None = None,
    ):
        dirs = list(runtime_dirs) if runtime_dirs is not None else [None]
        self.state_dirs = list(dict.fromkeys(state.clusters_dir(d) for d in dirs))
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.log = log or logging.getLogger(__name__)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="jdist-manager")
        self._controllers: dict[str, _Controller] = {}
        self._readers: dict[Path, RunReader] = {}
        self._reader_lock = threading.Lock()
        self._detail_cache: dict[Path, tuple[Any, dict[str, Any]]] = {}
        self._watches: dict[str, _KernelWatch] = {}

    def close(self) -> None:
        for ctl in self._controllers.values():
            ctl.close()
        self._controllers.clear()
        for watch in self._watches.values():
            watch.close()
        self._watches.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        fut = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        return await asyncio.wait_for(fut, timeout) if timeout else await fut

    # -- clusters --------------------------------------------------------------------------
    def live_states(self) -> list[dict[str, Any]]:
        """State files of clusters whose kernel process runs; deletes the stale ones."""
        found: dict[str, dict[str, Any]] = {}
        for folder in self.state_dirs:
            for path, data in state.read_folder(folder):
                if state.is_stale(data):
                    self.log.info("jdist: removing the state of cluster %s: its kernel is gone", data.get("cluster_id"))
                    path.unlink(missing_ok=True)
                    continue
                found.setdefault(data["cluster_id"], data)
        for cid in set(self._controllers) - set(found):
            ctl = self._controllers.pop(cid)
            self._pool.submit(ctl.close)
        return list(found.values())

    async def _notebooks(self) -> dict[str, str]:
        """kernel id -> notebook path, from the server's sessions."""
        if self.session_manager is None:
            return {}
        try:
            sessions = await self.session_manager.list_sessions()
        except Exception as exc:
            self.log.warning("jdist: could not list sessions: %s", exc)
            return {}
        return {s["kernel"]["id"]: s.get("path") for s in sessions if s.get("kernel")}

    def watch_kernels(self) -> None:
        """Follow the execution state of every kernel of the server (call it periodically, in the
        server's event loop: new kernels get a watch before they run their first cell)."""
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

    def kernel_state(self, kernel_id: str | None) -> str | None:
        """``idle``/``busy``/``starting`` of a kernel of this server (main shell), None if not ours."""
        km = self._kernel(kernel_id)
        if km is None:
            return None
        watch = self._watches.get(kernel_id)
        if watch is None or watch.kernel is not km:
            self.watch_kernels()
            watch = self._watches.get(kernel_id)
        return (watch.state if watch is not None else None) or getattr(km, "execution_state", None)

    def _kernel(self, kernel_id: str | None) -> Any:
        """The server's KernelManager of ``kernel_id`` (None if this server does not manage it)."""
        if self.kernel_manager is None or not kernel_id:
            return None
        try:
            return self.kernel_manager.get_kernel(kernel_id)
        except KeyError:
            return None

    def _controller(self, data: dict[str, Any]) -> _Controller:
        ctl = self._controllers.get(data["cluster_id"])
        if ctl is None:
            ctl = self._controllers[data["cluster_id"]] = _Controller(data)
        return ctl

    async def _rank_states(self, data: dict[str, Any]) -> tuple[dict[int, str] | None, str | None]:
        """Engine id -> busy/idle (dead when missing) and None; or None (unknown) or {} (all dead)
        with a description of the problem."""
        if not state.process_alive(data.get("controller")):
            return {}, "the cluster's controller process is gone"
        try:
            return await self._run(self._controller(data).engine_states, timeout=CONTROLLER_TIMEOUT_S + 2), None
        except Exception as exc:  # connection refused, timeout...
            ctl = self._controllers.pop(data["cluster_id"], None)
            if ctl is not None:
                self._pool.submit(ctl.close)
            return None, f"the controller does not answer ({type(exc).__name__}: {exc})"

    async def clusters(self) -> list[dict[str, Any]]:
        """Every running jdist cluster of a live kernel, with its ranks' states."""
        datas = await self._run(self.live_states)
        notebooks = await self._notebooks()
        results = await asyncio.gather(*(self._rank_states(d) for d in datas))
        running = self._running_runs()
        return [self._cluster_view(d, states, problem, notebooks, running) for d, (states, problem) in zip(datas, results)]

    def _cluster_view(self, data: dict[str, Any], states: dict[int, str] | None, problem: str | None,
                      notebooks: dict[str, str], running: dict[str, str]) -> dict[str, Any]:
        kernel = data.get("kernel") or {}
        kid = kernel.get("id")
        km = self._kernel(kid)
        notebook = notebooks.get(kid) if kid else None
        notebook = notebook or kernel.get("notebook")
        cfg = data.get("config") or {}
        ranks = []
        for info in data.get("ranks", []):
            eid = info.get("engine_id")
            st = "unknown" if states is None else states.get(eid, "dead")
            ranks.append({k: info.get(k) for k in ("rank", "host", "pid", "device", "local_rank")} | {"engine_id": eid, "state": st})
        dead = sum(r["state"] == "dead" for r in ranks)
        return {
            "cluster_id": data["cluster_id"],
            "kernel_id": kid,
            "kernel_pid": kernel.get("pid"),
            "kernel_state": self.kernel_state(kid),
            "managed": km is not None,
            "notebook": notebook,
            "name": os.path.basename(notebook) if notebook else (f"kernel {kid[:8]}" if kid else f"pid {kernel.get('pid')}"),
            "backend": cfg.get("backend"),
            "n": cfg.get("n"),
            "gpus": bool(cfg.get("gpus")),
            "timeout": cfg.get("timeout"),
            "hosts": sorted({r["host"] for r in ranks if r.get("host")}),
            "devices": sorted({str(r["device"]) for r in ranks if r.get("device") is not None}),
            "ranks": ranks,
            "status": "dead" if ranks and dead == len(ranks) else "degraded" if dead or problem else "running",
            "problem": problem,
            "started_at": data.get("started_at"),
            "uptime_s": time.time() - data["started_at"] if data.get("started_at") else None,
            "current_run": running.get(data["cluster_id"]),
        }

    def _cluster_data(self, cluster_id: str) -> dict[str, Any]:
        for data in self.live_states():
            if data["cluster_id"] == cluster_id:
                return data
        raise ActionError(404, f"No running jdist cluster {cluster_id!r} (it stopped, or its kernel is gone).")

    # -- actions ---------------------------------------------------------------------------
    async def interrupt(self, cluster_id: str) -> dict[str, Any]:
        """Stop what the ranks run: through the kernel while it runs a cell, else SIGINT to the ranks."""
        data = await self._run(self._cluster_data, cluster_id)
        kid = (data.get("kernel") or {}).get("id")
        if self._kernel(kid) is not None and self.kernel_state(kid) == "busy":
            # the kernel is in a %%distributed cell: its runner forwards SIGINT to the ranks,
            # waits for them and reports stuck ranks, and the cell ends as interrupted
            await self.kernel_manager.interrupt_kernel(kid)
            return {"ok": True, "via": "kernel",
                    "message": "Interrupted the kernel: its running %%distributed cell sends SIGINT to every rank and ends as interrupted."}
        states, problem = await self._rank_states(data)
        if problem:
            raise ActionError(409, f"Cannot interrupt the ranks: {problem}.")
        busy = [r for r in data["ranks"] if (states or {}).get(r["engine_id"]) == "busy"]
        if not busy:
            raise ActionError(409, "Nothing to interrupt: every rank is idle.")
        engines = [r["engine_id"] for r in busy]
        await self._run(self._controller(data).signal, signal.SIGINT, engines, timeout=CONTROLLER_TIMEOUT_S + 2)
        ranks = ", ".join(str(r["rank"]) for r in busy)
        return {"ok": True, "via": "ranks", "message": f"Sent SIGINT to rank(s) {ranks}."}

    async def restart(self, cluster_id: str) -> dict[str, Any]:
        """``%dist restart`` in the cluster's (idle) kernel: new ranks with the same options."""
        data = await self._run(self._cluster_data, cluster_id)
        timeout = float((data.get("config") or {}).get("start_timeout") or 120) + 60
        return await self._kernel_action(data, "restart", timeout)

    async def stop(self, cluster_id: str) -> dict[str, Any]:
        """``%dist stop`` in the cluster's (idle) kernel."""
        data = await self._run(self._cluster_data, cluster_id)
        return await self._kernel_action(data, "stop", 60.0)

    async def _kernel_action(self, data: dict[str, Any], action: str, timeout: float) -> dict[str, Any]:
        kid = (data.get("kernel") or {}).get("id")
        km = self._kernel(kid)
        if km is None:
            raise ActionError(409, f"The kernel of this cluster is not run by this Jupyter server: "
                                   f"run %dist {action} in its notebook.")
        kstate = self.kernel_state(kid)
        if kstate != "idle":
            raise ActionError(409, f"The kernel is {kstate or 'not ready'}: {action} runs in the kernel "
                                   f"(%dist {action}) once it is idle. Interrupt the running cell first.")
        from jupyter_core.utils import ensure_async

        client = km.client()
        client.start_channels()
        try:
            mod = "__import__('jdist.server.kernel_side', fromlist=['run_action'])"
            msg_id = client.execute(
                f"{mod}.run_action({action!r}, {data['cluster_id']!r})",
                silent=True, store_history=False, allow_stdin=False,
                user_expressions={"result": f"{mod}.LAST"},
            )
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ActionError(504, f"%dist {action} did not finish within {timeout:.0f} s; it goes on in the kernel.")
                try:
                    reply = await ensure_async(client.get_shell_msg(timeout=remaining))
                except Exception:  # queue.Empty
                    continue
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    break
        finally:
            client.stop_channels()
        content = reply["content"]
        if content.get("status") != "ok":
            status = 409 if content.get("ename") == "ClusterChanged" else 500
            raise ActionError(status, f"%dist {action} failed: {content.get('ename')}: {content.get('evalue')}")
        result = (content.get("user_expressions") or {}).get("result", {})
        text = (result.get("data") or {}).get("text/plain", "")
        try:
            import ast

            text = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            pass
        return {"ok": True, "via": "kernel", "message": text or f"%dist {action} done."}

    # -- runs ------------------------------------------------------------------------------
    def _run_roots(self) -> list[Path]:
        roots = [self.run_dir]
        for data in self.live_states():
            if data.get("run_dir"):
                roots.append(Path(data["run_dir"]))
        return list(dict.fromkeys(p.resolve() for p in roots))

    def _run_paths(self) -> list[Path]:
        paths = [p for root in self._run_roots() for p in list_runs(root)]
        return sorted(paths, key=lambda p: p.name, reverse=True)

    def _read(self, path: Path) -> Run:
        with self._reader_lock:
            reader = self._readers.get(path)
            if reader is None:
                reader = self._readers[path] = RunReader(path)
            return reader.update()

    def _running_runs(self) -> dict[str, str]:
        """cluster id -> id of its newest running run (from the readers already open)."""
        out: dict[str, str] = {}
        for reader in sorted(self._readers.values(), key=lambda r: r.path.name):
            run = reader.run
            if run is not None and run.status == "running" and run.cluster_id:
                out[run.cluster_id] = run.run_id
        return out

    def _effective_status(self, run: Run, live: set[str]) -> str:
        """The run's status; a "running" run whose cluster is gone is "lost" (it never finished)."""
        if run.status == "running" and run.cluster_id and run.cluster_id not in live:
            return "lost"
        return run.status

    def _cluster_notebooks(self, live_data: list[dict[str, Any]], sessions: dict[str, str]) -> dict[str, str | None]:
        """cluster id -> notebook path (the session's, else the one the kernel was started for)."""
        out = {}
        for d in live_data:
            kernel = d.get("kernel") or {}
            out[d["cluster_id"]] = sessions.get(kernel.get("id")) or kernel.get("notebook")
        return out

    def _list_runs(self, limit: int, sessions: dict[str, str]) -> list[dict[str, Any]]:
        from jdist.dashboard import loss_metric, steps_done, thin

        live_data = self.live_states()
        live = {d["cluster_id"] for d in live_data}
        notebooks = self._cluster_notebooks(live_data, sessions)
        paths = self._run_paths()[: max(1, limit)]
        out = []
        for path in paths:
            try:
                run = self._read(path)
            except (OSError, ValueError, KeyError) as exc:
                self.log.debug("jdist: skipping run %s: %s", path, exc)
                continue
            name = loss_metric(run)
            loss = run.aggregate(name) if name else ([], [], [], [])
            st = run.aggregate("step_time_s")
            ls, lv = thin(loss[0], _finite(loss[1]), max_points=SPARK_POINTS)
            ss, sv = thin(st[0], _finite(st[1]), max_points=SPARK_POINTS)
            out.append({
                **self._run_head(run, live),
                "notebook": notebooks.get(run.cluster_id),
                "steps_done": steps_done(run),
                "loss_name": name,
                "last_loss": _num(loss[1][-1]) if loss[1] else None,
                "last_step_time_s": _num(st[1][-1]) if st[1] else None,
                "spark": {"loss": [ls, lv], "step_time": [ss, sv]},
            })
        # forget readers of runs no longer listed (their Run objects hold every record)
        keep = set(paths) | set(self._detail_cache)
        with self._reader_lock:
            for p in set(self._readers) - keep:
                del self._readers[p]
        return out

    def _run_head(self, run: Run, live: set[str]) -> dict[str, Any]:
        return {
            "run_id": run.run_id,
            "status": self._effective_status(run, live),
            "world_size": run.world_size,
            "backend": run.backend,
            "device_kind": run.device_kind,
            "started": run.started,
            "ended": run.ended,
            "records": len(run.records),
            "total_steps": run.total_steps,
            "cluster_id": run.cluster_id,
            "error": run.error,
        }

    async def runs(self, limit: int = DEFAULT_RUN_LIMIT) -> list[dict[str, Any]]:
        """The most recent runs (newest first) with sparkline data for loss and step time."""
        return await self._run(self._list_runs, limit, await self._notebooks())

    def _run_detail(self, run_id: str, sessions: dict[str, str]) -> dict[str, Any]:
        from jdist.dashboard import MAX_POINTS, panel_data, seconds_per_step, steps_done, thin

        if not _ID.fullmatch(run_id):
            raise ActionError(400, f"Bad run id {run_id!r}.")
        path = next((root / run_id for root in self._run_roots() if (root / run_id / "meta.json").exists()), None)
        if path is None:
            raise ActionError(404, f"No run {run_id!r} in the run log.")
        run = self._read(path)
        live_data = self.live_states()
        live = {d["cluster_id"] for d in live_data}
        key = (len(run.records), run.status, run.ended, run.total_steps, run.cluster_id in live)
        cached = self._detail_cache.get(path)
        if cached and cached[0] == key:
            return cached[1]
        d = asdict(panel_data(run))
        steps = d["loss_steps"]  # long series thinned as in the live dashboard (the band keeps its extremes)
        d["loss_steps"], d["loss_mean"] = thin(steps, d["loss_mean"], max_points=MAX_POINTS)
        _, d["loss_min"] = thin(steps, d["loss_min"], min, max_points=MAX_POINTS)
        _, d["loss_max"] = thin(steps, d["loss_max"], max, max_points=MAX_POINTS)
        d["throughput_steps"], d["throughput"] = thin(d["throughput_steps"], d["throughput"])
        per_step = seconds_per_step(run)
        done = steps_done(run)
        notebook = self._cluster_notebooks(live_data, sessions).get(run.cluster_id)
        detail = _clean({
            **self._run_head(run, live),
            "notebook": notebook,
            "code": run.code,
            "path": str(path),
            "steps_done": done,
            "eta_s": (run.total_steps - done) * per_step if per_step and run.total_steps and run.status == "running" else None,
            "summary": run.summary(),
            "panels": d,
        })
        self._detail_cache[path] = (key, detail)
        if len(self._detail_cache) > 8:  # the oldest opened run views
            self._detail_cache.pop(next(iter(self._detail_cache)))
        return detail

    async def run(self, run_id: str) -> dict[str, Any]:
        """One run with the four dashboard panels' data (as the notebook dashboard draws them)."""
        return await self._run(self._run_detail, run_id, await self._notebooks())


def _num(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value


def _finite(values: list[float]) -> list[float | None]:
    return [_num(v) for v in values]


def _clean(obj: Any) -> Any:
    """NaN/inf -> None, recursively (JSON has no NaN)."""
    if isinstance(obj, float):
        return _num(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj
