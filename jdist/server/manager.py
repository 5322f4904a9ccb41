"""What the "Distributed" sidebar shows and does, independent of tornado (testable on its own).

:class:`JdistManager` reads the same state the kernel side writes, nothing of its own:

- clusters: :class:`~jdist.server.registry.ClusterRegistry` (the kernels' state files; a
  client of each controller for the ranks' idle/busy/dead state, as ``%dist status``);
- kernels: :class:`~jdist.server.kernels.KernelWatcher` (busy/idle of the server's kernels);
- notebook paths: the Jupyter server's session manager (kernel id -> notebook);
- runs: :class:`~jdist.server.runs.RunIndex` (the run folders, with the dashboard's panels);
- sweeps: :class:`~jdist.server.sweeps.SweepIndex` (``jdist.tune``'s folders, with their view);
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
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterable

from jdist.metrics import default_run_dir
from jdist.protocol import (ActionResult, ClusterModel, ClusterState, RankModel, RunDetailModel, RunSummaryModel,
                            SweepDetailModel, SweepSummaryModel)

from .kernels import KernelWatcher
from .registry import CONTROLLER_TIMEOUT_S, ClusterRegistry
from .runs import RunIndex
from .sweeps import SweepIndex

#: Runs listed by default (every running one plus the most recent others).
DEFAULT_RUN_LIMIT = 12


class ActionError(Exception):
    """An action or lookup that cannot be done; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


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
        self.log = log or logging.getLogger(__name__)
        self.registry = ClusterRegistry(list(runtime_dirs) if runtime_dirs is not None else [None], self.log)
        self.kernels = KernelWatcher(kernel_manager, self.log)
        self.runs_index = RunIndex(run_dir if run_dir is not None else default_run_dir())
        self.sweeps_index = SweepIndex(self.runs_index.run_dir)
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="jdist-manager")

    @property
    def state_dirs(self) -> list[Path]:
        return self.registry.state_dirs

    @property
    def run_dir(self) -> Path:
        return self.runs_index.run_dir

    def periodic(self) -> None:
        """Called every second on the server's event loop: watch new kernels; drop stale clusters."""
        self.kernels.refresh()
        self._pool.submit(self.registry.collect_garbage)

    def close(self) -> None:
        self.registry.close()
        self.kernels.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        fut = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        return await asyncio.wait_for(fut, timeout) if timeout else await fut

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

    @staticmethod
    def _cluster_notebooks(live: list[ClusterState], sessions: dict[str, str]) -> dict[str, str | None]:
        """cluster id -> notebook path (the session's, else the one the kernel was started for)."""
        return {d["cluster_id"]: sessions.get(d["kernel"].get("id") or "") or d["kernel"].get("notebook")
                for d in live}

    # -- clusters --------------------------------------------------------------------------
    async def _rank_states(self, data: ClusterState) -> tuple[dict[int, str] | None, str | None]:
        """Engine id -> busy/idle (dead when missing) and None; or None (unknown) or {} (all dead)
        with a description of the problem."""
        from jdist.common.procs import alive

        if not alive(data.get("controller")):
            return {}, "the cluster's controller process is gone"
        try:
            ctl = self.registry.controller(data)
            return await self._run(ctl.engine_states, timeout=CONTROLLER_TIMEOUT_S + 2), None
        except Exception as exc:  # connection refused, timeout...
            self._pool.submit(self.registry.forget_controller, data["cluster_id"])
            return None, f"the controller does not answer ({type(exc).__name__}: {exc})"

    async def clusters(self) -> list[ClusterModel]:
        """Every running jdist cluster of a live kernel, with its ranks' states."""
        datas = await self._run(self.registry.live)
        notebooks = await self._notebooks()
        results = await asyncio.gather(*(self._rank_states(d) for d in datas))
        running = await self._run(self.runs_index.running)
        return [self._cluster_view(d, states, problem, notebooks, running) for d, (states, problem) in zip(datas, results)]

    def _cluster_view(self, data: ClusterState, states: dict[int, str] | None, problem: str | None,
                      notebooks: dict[str, str], running: dict[str, str]) -> ClusterModel:
        kernel = data["kernel"]
        kid = kernel.get("id")
        notebook = (notebooks.get(kid) if kid else None) or kernel.get("notebook")
        cfg = data["config"]
        ranks = []
        paused = set(data.get("paused") or ())
        for info in data["ranks"]:
            eid = info.get("engine_id")
            st = "unknown" if states is None else states.get(eid, "dead")
            if st == "busy" and info["rank"] in paused:
                st = "paused"
            ranks.append(RankModel(rank=info["rank"], host=info["host"], pid=info["pid"], device=info["device"],
                                   local_rank=info.get("local_rank"), engine_id=eid, state=st))
        dead = sum(r["state"] == "dead" for r in ranks)
        started = data.get("started_at")
        return ClusterModel(
            cluster_id=data["cluster_id"],
            kernel_id=kid,
            kernel_pid=kernel.get("pid"),
            kernel_state=self.kernels.state(kid),
            managed=self.kernels.kernel(kid) is not None,
            notebook=notebook,
            name=os.path.basename(notebook) if notebook else (f"kernel {kid[:8]}" if kid else f"pid {kernel.get('pid')}"),
            launcher=data["launcher"],
            backend=cfg.get("backend"),
            n=cfg.get("n"),
            gpus=bool(cfg.get("gpus")),
            timeout=cfg.get("timeout"),
            hosts=sorted({r["host"] for r in ranks if r.get("host")}),
            devices=sorted({str(r["device"]) for r in ranks if r.get("device") is not None}),
            ranks=ranks,
            options=data.get("options") or [],
            status="dead" if ranks and dead == len(ranks) else "degraded" if dead or problem else "running",
            problem=problem,
            started_at=started,
            uptime_s=time.time() - started if started else None,
            current_run=running.get(data["cluster_id"]),
        )

    def _cluster_data(self, cluster_id: str) -> ClusterState:
        data = self.registry.find(cluster_id)
        if data is None:
            raise ActionError(404, f"No running jdist cluster {cluster_id!r} (it stopped, or its kernel is gone).")
        return data

    # -- actions ---------------------------------------------------------------------------
    async def interrupt(self, cluster_id: str) -> ActionResult:
        """Stop what the ranks run: through the kernel while it runs a cell, else SIGINT to the ranks."""
        data = await self._run(self._cluster_data, cluster_id)
        kid = data["kernel"].get("id")
        if self.kernels.kernel(kid) is not None and self.kernels.state(kid) == "busy":
            # the kernel is in a %%distributed cell: its supervisor forwards SIGINT to the ranks,
            # waits for them and reports stuck ranks, and the cell ends as interrupted
            await self.kernel_manager.interrupt_kernel(kid)
            return ActionResult(ok=True, via="kernel", message="Interrupted the kernel: its running %%distributed "
                                "cell sends SIGINT to every rank and ends as interrupted.")
        states, problem = await self._rank_states(data)
        if problem:
            raise ActionError(409, f"Cannot interrupt the ranks: {problem}.")
        busy = [r for r in data["ranks"] if (states or {}).get(r["engine_id"]) == "busy"]
        if not busy:
            raise ActionError(409, "Nothing to interrupt: every rank is idle.")
        engines = [r["engine_id"] for r in busy]
        ctl = self.registry.controller(data)
        await self._run(ctl.signal, signal.SIGINT, engines, timeout=CONTROLLER_TIMEOUT_S + 2)
        ranks = ", ".join(str(r["rank"]) for r in busy)
        return ActionResult(ok=True, via="ranks", message=f"Sent SIGINT to rank(s) {ranks}.")

    async def restart(self, cluster_id: str) -> ActionResult:
        """``%dist restart`` in the cluster's (idle) kernel: new ranks with the same options."""
        data = await self._run(self._cluster_data, cluster_id)
        timeout = float(data["config"].get("start_timeout") or 120) + 60
        return await self._kernel_action(data, "restart", timeout)

    async def stop(self, cluster_id: str) -> ActionResult:
        """``%dist stop`` in the cluster's (idle) kernel."""
        data = await self._run(self._cluster_data, cluster_id)
        return await self._kernel_action(data, "stop", 60.0)

    async def _kernel_action(self, data: ClusterState, action: str, timeout: float) -> ActionResult:
        kid = data["kernel"].get("id")
        km = self.kernels.kernel(kid)
        if km is None:
            raise ActionError(409, f"The kernel of this cluster is not run by this Jupyter server: "
                                   f"run %dist {action} in its notebook.")
        kstate = self.kernels.state(kid)
        if kstate != "idle":
            raise ActionError(409, f"The kernel is {kstate or 'not ready'}: {action} runs in the kernel "
                                   f"(%dist {action}) once it is idle. Interrupt the running cell first.")
        client = km.client()  # the server's: a jupyter_client AsyncKernelClient
        client.start_channels()
        mod = "__import__('jdist.kernel.actions', fromlist=['run_action'])"
        try:
            reply = await client.execute_interactive(
                f"{mod}.run_action({action!r}, {data['cluster_id']!r})", silent=True, store_history=False,
                allow_stdin=False, user_expressions={"result": f"{mod}.LAST"}, timeout=timeout,
                output_hook=lambda msg: None)  # the action's output is the reply's result, not the server's stdout
        except TimeoutError:
            raise ActionError(504, f"%dist {action} did not finish within {timeout:.0f} s; it goes on in the kernel.") from None
        except Exception as exc:
            raise ActionError(500, f"%dist {action}: lost the kernel's reply ({type(exc).__name__}: {exc}).") from None
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
        return ActionResult(ok=True, via="kernel", message=text or f"%dist {action} done.")

    # -- runs ------------------------------------------------------------------------------
    def _run_context(self, sessions: dict[str, str]) -> tuple[list[str], set[str], dict[str, str | None]]:
        live = self.registry.live()
        return ([d["run_dir"] for d in live if d.get("run_dir")], {d["cluster_id"] for d in live},
                self._cluster_notebooks(live, sessions))

    def _list_runs(self, limit: int, sessions: dict[str, str]) -> list[RunSummaryModel]:
        roots, live, notebooks = self._run_context(sessions)
        return self.runs_index.summaries(roots, limit, live, notebooks)

    async def runs(self, limit: int = DEFAULT_RUN_LIMIT) -> list[RunSummaryModel]:
        """The most recent runs (newest first) with sparkline data for loss and step time."""
        return await self._run(self._list_runs, limit, await self._notebooks())

    def _run_detail(self, run_id: str, sessions: dict[str, str]) -> RunDetailModel:
        roots, live, notebooks = self._run_context(sessions)
        try:
            detail = self.runs_index.detail(run_id, roots, live, notebooks)
        except ValueError as exc:
            raise ActionError(400, str(exc)) from None
        if detail is None:
            raise ActionError(404, f"No run {run_id!r} in the run log.")
        return detail

    async def run(self, run_id: str) -> RunDetailModel:
        """One run with the dashboard's panels (as the notebook dashboard draws them)."""
        return await self._run(self._run_detail, run_id, await self._notebooks())

    # -- sweeps ----------------------------------------------------------------------------
    def _list_sweeps(self, limit: int, sessions: dict[str, str]) -> list[SweepSummaryModel]:
        roots, live, notebooks = self._run_context(sessions)
        return self.sweeps_index.summaries(roots, limit, live, notebooks)

    async def sweeps(self, limit: int = DEFAULT_RUN_LIMIT) -> list[SweepSummaryModel]:
        """The sweeps started last (newest first): status, trials per state, best so far."""
        return await self._run(self._list_sweeps, limit, await self._notebooks())

    def _sweep_detail(self, name: str, sessions: dict[str, str]) -> SweepDetailModel:
        roots, live, notebooks = self._run_context(sessions)
        try:
            detail = self.sweeps_index.detail(name, roots, live, notebooks)
        except ValueError as exc:
            raise ActionError(400, str(exc)) from None
        if detail is None:
            raise ActionError(404, f"No sweep {name!r} in the run log's sweeps folder.")
        return detail

    async def sweep(self, name: str) -> SweepDetailModel:
        """One sweep with its view (the HTML and SVG the notebook shows)."""
        return await self._run(self._sweep_detail, name, await self._notebooks())
