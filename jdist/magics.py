"""IPython magics: ``%%distributed`` runs a cell on every rank; ``%dist`` manages the cluster.

Thin layer: parses arguments, presents output and errors, and calls
:mod:`jdist.cluster` (lifecycle) and :mod:`jdist.runner` (cell execution).
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import replace
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import cluster as cl
from . import guard, recovery
from .runner import raise_for_result, run_cell


class UsageError(Exception):
    """Bad magic input: shown as one line that says the fix (no traceback)."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mjdist\x1b[0m: {self}"]


class CellSyntaxError(UsageError):
    """The cell does not parse: reported once, before anything is sent to the ranks."""

    def __init__(self, err: SyntaxError):
        self.err = err
        super().__init__(str(err))

    def _render_traceback_(self) -> list[str]:
        return ["The cell was not sent to the ranks:"] + "".join(
            traceback.format_exception_only(type(self.err), self.err)
        ).rstrip().splitlines()


def parse_targets(text: str | None) -> list[int] | None:
    """``"0,2"`` -> ``[0, 2]``; ``"1-3"`` -> ``[1, 2, 3]``; ``None``/``"all"`` -> None (all ranks).

    >>> parse_targets("0,2-3")
    [0, 2, 3]
    """
    if text is None or text.strip().lower() == "all":
        return None
    ranks: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(p) for p in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                ranks.extend(range(lo, hi + 1))
            else:
                ranks.append(int(part))
    except ValueError:
        raise UsageError(f"--targets {text!r} is not a rank list; use e.g. --targets 0 or --targets 0,2 or --targets 1-3.") from None
    if any(r < 0 for r in ranks):
        raise UsageError(f"--targets {text!r}: ranks are non-negative, e.g. --targets 0,1.")
    return sorted(set(ranks))


def _config_from(args: Any) -> cl.ClusterConfig:
    if args.n is not None and args.gpus is not None:
        raise UsageError("Give either -n N (CPU ranks) or --gpus N (one GPU per rank), not both.")
    n = args.gpus if args.gpus is not None else args.n
    try:
        cfg = cl.ClusterConfig(
            n=n,
            gpus=args.gpus is not None,
            backend=args.backend or "ddp",
            timeout=args.timeout if args.timeout is not None else 60.0,
            start_timeout=args.start_timeout,
            threads=args.threads,
            precision=args.precision or "fp32",
            watchdog=args.watchdog if args.watchdog is not None else 30.0,
            auto_restart=bool(args.auto_restart),
            port=args.port,
        )
        cfg.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return cfg


def _conflicts(running: cl.ClusterConfig, args: Any) -> list[str]:
    out = []
    if args.n is not None and (args.n != running.n or running.gpus):
        out.append(f"-n {args.n} (running: {'--gpus' if running.gpus else '-n'} {running.n})")
    if args.gpus is not None and (args.gpus != running.n or not running.gpus):
        out.append(f"--gpus {args.gpus} (running: {'--gpus' if running.gpus else '-n'} {running.n})")
    if args.backend is not None and args.backend != running.backend:
        out.append(f"--backend {args.backend} (running: {running.backend})")
    if args.timeout is not None and args.timeout != running.timeout:
        out.append(f"--timeout {args.timeout:g} (running: {running.timeout:g})")
    if args.port is not None and args.port != running.port:
        out.append(f"--port {args.port} (running: {running.port or 'none, a file store'})")
    return out


def _say(msg: str) -> None:
    print(msg, flush=True)


@magics_class
class DistributedMagics(Magics):
    """``%%distributed`` and ``%dist``."""

    @magic_arguments()
    @argument("-n", type=int, default=None, help="Number of CPU ranks (gloo). Starts a cluster if none runs.")
    @argument("--gpus", type=int, default=None, help="Number of ranks with one CUDA GPU each (NCCL).")
    @argument("--backend", default=None, help="Training backend on the ranks: ddp (default), fsdp or horovod.")
    @argument("--targets", default=None, help="Ranks to run this cell on: 0, 0,2, 1-3 or all (default: all).")
    @argument("--output", default="rank0", choices=["rank0", "all", "none"],
              help="Whose stdout/stderr to show: rank0 (live, default), all (every rank, lines labelled by rank), none.")
    @argument("--no-dashboard", action="store_true", help="Do not show the live dashboard for jdist.log metrics.")
    @argument("--restart", action="store_true", help="Restart the cluster first (with these options; rank state is lost).")
    @argument("--timeout", type=float, default=None, help="Process-group timeout in seconds (default 60).")
    @argument("--start-timeout", type=float, default=120.0, help="Seconds to wait for ranks to start (default 120).")
    @argument("--threads", type=int, default=None, help="torch threads per CPU rank (default: cores / ranks).")
    @argument("--precision", default=None, choices=["fp32", "bf16", "fp16"],
              help="Autocast precision of prepared models (fp16 adds a GradScaler; jdist.backward applies it). "
                   "Kept for later cells; changing it needs no restart.")
    @argument("--watchdog", type=float, default=None,
              help="Seconds without progress, with every running rank waiting in a collective, after which the "
                   "cell is reported as hung with each rank's stack and the ranks are released (default 30; 0: off).")
    @argument("--auto-restart", action="store_true",
              help="If the rank processes die, restart them at once, replay the set-up cells and restore the newest "
                   "jdist.checkpoint_every checkpoint (kept for later cells).")
    @argument("--port", type=int, default=None,
              help="Fixed TCP port for the process-group rendezvous (default: none; a private file store is used).")
    @argument("--run-dir", default=None, help="Folder for run logs (default: $JDIST_RUN_DIR or <jupyter data dir>/jdist/runs).")
    @cell_magic
    def distributed(self, line: str, cell: str) -> None:
        """Run the cell on every rank of an MPI-launched ipyparallel cluster.

        The first call starts the cluster (``-n 2`` CPU ranks, or ``--gpus 2``); later
        calls without options reuse it, and variables stay on the ranks between cells.
        On every rank ``rank``, ``world_size``, ``local_rank``, ``device`` and ``jdist``
        are defined; ``jdist.prepare(model)`` wraps for the backend and
        ``jdist.log(step=..., loss=...)`` feeds the live dashboard.

        Example::

            %%distributed -n 2 --backend ddp
            model = jdist.prepare(torch.nn.Linear(8, 1))
        """
        args = parse_argstring(self.distributed, line)
        self._check_syntax(cell)
        ranks = parse_targets(args.targets)
        cluster = self._ensure_cluster(args)
        try:
            cluster.engine_ids(ranks)
        except ValueError as exc:
            raise UsageError(f"--targets: {exc}") from None
        except cl.ClusterError as exc:
            raise UsageError(str(exc)) from None
        result = run_cell(
            cluster, cell, ranks=ranks, output=args.output, dashboard=not args.no_dashboard, run_dir=args.run_dir
        )
        notes = []
        if result.death is not None and cluster.config.auto_restart:
            _say(f"jdist: rank {result.death['rank']} died ({result.death['cause']}); restarting (--auto-restart)...")
            notes.append(recovery.restart(cluster, _say))
        elif not (result.failed or result.interrupted or result.death or result.hang) and result.run is None:
            cluster.history.append(("cell", cell, ranks))  # a set-up cell: replayed by %dist restart
        raise_for_result(result, cluster.config.n, notes)

    def _check_syntax(self, cell: str) -> None:
        try:
            compile(self.shell.transform_cell(cell), "<%%distributed cell>", "exec")
        except SyntaxError as err:
            raise CellSyntaxError(err) from None

    def _ensure_cluster(self, args: Any) -> cl.DistributedCluster:
        running = cl.current()
        if running is not None and not args.restart:
            conflicts = _conflicts(running.config, args)
            if conflicts:
                raise UsageError(
                    f"A cluster is running with different options: {'; '.join(conflicts)}. "
                    "Add --restart to replace it (rank state is lost), or drop these options to reuse it."
                )
            if args.precision is not None and args.precision != running.config.precision:
                running.set_precision(args.precision)
                _say(f"Precision is now {args.precision} on all ranks (prepared models included).")
            kernel_side = {}  # options the kernel applies itself: no restart needed
            if args.watchdog is not None:
                kernel_side["watchdog"] = args.watchdog
            if args.auto_restart:
                kernel_side["auto_restart"] = True
            if kernel_side:
                new = replace(running.config, **kernel_side)
                try:
                    new.validate()
                except ValueError as exc:
                    raise UsageError(str(exc)) from None
                running.config = new
            return running
        if running is not None:  # --restart: options not given are kept
            if args.n is None and args.gpus is None:
                args.n, args.gpus = (None, running.config.n) if running.config.gpus else (running.config.n, None)
            args.backend = args.backend or running.config.backend
            args.timeout = running.config.timeout if args.timeout is None else args.timeout
            args.precision = args.precision or running.config.precision
            args.watchdog = running.config.watchdog if args.watchdog is None else args.watchdog
            args.auto_restart = args.auto_restart or running.config.auto_restart
            args.port = running.config.port if args.port is None else args.port
        elif args.n is None and args.gpus is None:
            raise UsageError("No cluster is running: start one with %%distributed -n 2 (CPU ranks) or --gpus N.")
        cfg = _config_from(args)
        if running is not None:
            _say("Stopping the running cluster...")
            running.stop()
            cl.set_current(None)
        cluster = cl.DistributedCluster(cfg)
        if not args.no_dashboard:
            from . import dashboard

            threading.Thread(target=dashboard.preload, name="jdist-preload", daemon=True).start()
        try:
            cluster.start(_say)
        except cl.ClusterError as exc:
            raise UsageError(str(exc)) from None
        cl.set_current(cluster)
        return cluster

    @magic_arguments()
    @argument("command", choices=["status", "stacks", "stop", "restart", "pull", "push"],
              help="status: ranks and state; stacks: where each rank is (Python stack); stop; restart (replays "
                   "set-up cells and restores the newest checkpoint); pull NAME; push NAME.")
    @argument("name", nargs="?", default=None, help="Variable name for pull/push.")
    @argument("--fresh", action="store_true", help="restart: start empty ranks (no replay, no restore).")
    @argument("--rank", type=int, default=None, help="pull/push: only this rank (pull returns the value itself).")
    @line_magic
    def dist(self, line: str) -> Any:
        """Manage the jdist cluster of this kernel.

        ``%dist status``       ranks, hosts, devices, backend, busy/idle
        ``%dist stacks``       each rank's Python stack: which line it runs or waits on
        ``%dist stop``         stop the cluster
        ``%dist restart``      restart it with the same options, replay the set-up cells (those
                               that logged nothing) and restore the newest jdist.checkpoint_every
                               checkpoint; ``--fresh``: empty ranks
        ``%dist pull NAME``    set NAME in the notebook to [value on rank 0, rank 1, ...];
                               ``--rank R`` for the value of one rank
        ``%dist push NAME``    send the notebook's NAME to every rank (or ``--rank R``)
        """
        args = parse_argstring(self.dist, line)
        if args.command in ("pull", "push") and not args.name:
            raise UsageError(f"%dist {args.command} needs a variable name, e.g. %dist {args.command} model_state")
        cluster = cl.current()
        if cluster is None:
            if args.command == "stop":
                _say("No jdist cluster is running.")
                return None
            raise UsageError("No jdist cluster is running: start one with %%distributed -n 2.")
        ranks = None if args.rank is None else [args.rank]
        try:
            if args.command == "status":
                _say(format_status(cluster.status()))
            elif args.command == "stop":
                cluster.stop()
                cl.set_current(None)
                _say("Cluster stopped.")
            elif args.command == "stacks":
                _say(format_stacks(cluster.stacks(ranks), cluster.config.backend == "ddp"))
            elif args.command == "restart":
                _say(recovery.restart(cluster, _say, restore=not args.fresh))
            elif args.command == "pull":
                return self._pull(cluster, args.name, ranks)
            elif args.command == "push":
                if args.name not in self.shell.user_ns:
                    raise UsageError(f"%dist push {args.name}: no variable {args.name!r} in the notebook.")
                cluster.push(args.name, self.shell.user_ns[args.name], ranks)
                cluster.history.append(("push", args.name, self.shell.user_ns[args.name], ranks))
                _say(f"Pushed {args.name} to {'rank ' + str(args.rank) if ranks else 'all ranks'}.")
        except (ValueError, cl.ClusterError) as exc:
            raise UsageError(str(exc)) from None
        return None

    def _pull(self, cluster: cl.DistributedCluster, name: str, ranks: list[int] | None) -> None:
        from ipyparallel.error import CompositeError, RemoteError

        try:
            values = cluster.pull(name, ranks)
        except RemoteError as exc:
            ename, evalue = exc.ename, exc.evalue
            if isinstance(exc, CompositeError) and exc.elist:
                ename, evalue = exc.elist[0][:2]
            if ename == "NameError":
                raise UsageError(f"%dist pull {name}: {evalue}. Define it in a %%distributed cell first.") from None
            raise UsageError(
                f"%dist pull {name}: the value could not be sent back ({ename}: {evalue}). "
                "Pull something picklable, e.g. a state_dict or tensor."
            ) from None
        self.shell.user_ns[name] = values[0] if ranks else values
        where = f"rank {ranks[0]}" if ranks else f"{len(values)} ranks (list in rank order)"
        _say(f"{name} <- {where}")


def format_stacks(stacks: dict[int, list[tuple[str, int, str]]], ddp: bool = False) -> str:
    """``%dist stacks`` text: per rank a one-line summary, then its stack (outermost first)."""
    out = []
    for rank, frames in sorted(stacks.items()):
        out.append(f"rank {rank}: {guard.summary(frames, ddp)}")
        if frames:
            out.append(guard.format_stack(frames))
    return "\n".join(out)


def format_status(status: dict[str, Any]) -> str:
    """Human-readable ``%dist status`` text."""
    cfg = status["config"]
    kind = "GPU" if cfg["gpus"] else "CPU"
    lines = [
        f"jdist cluster {status['cluster_id']}: {cfg['n']} {kind} rank(s), backend {cfg['backend']}, "
        f"precision {cfg.get('precision', 'fp32')}, process-group timeout {cfg['timeout']:g} s, "
        f"up {status['uptime_s']:.0f} s",
        f"{'rank':>4}  {'host':<16} {'pid':>8}  {'device':<8} {'state':<5}",
    ]
    for r in status["ranks"]:
        lines.append(f"{r['rank']:>4}  {r['host']:<16} {r['pid']:>8}  {r['device']:<8} {r['state']:<5}")
    return "\n".join(lines)
