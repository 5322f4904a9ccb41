"""IPython magics: ``%%distributed`` runs a cell on every rank; ``%dist`` manages the cluster.

Thin: the arguments come from the option table (:func:`jdist.plugins.option_table`: each option
defined once, with its scope, by jdist or the plugin that owns it), the work from
:mod:`jdist.kernel.cluster` (lifecycle), :mod:`jdist.kernel.supervise` (cell execution) and
:mod:`jdist.kernel.recovery`. Bad input is one ``UsageError: ...`` line that names the fix;
faults are jdist's own one-line errors (:mod:`jdist.errors`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import threading
import traceback
from typing import Any, Callable

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from jdist.common.stacks import COLLECTIVE_PATHS, Frame, format_stack, summary
from jdist.errors import remote_errors, usage_error
from jdist.options import CellOptions, OptionTable
from jdist.plugins import backend_spec, option_table

from . import cluster as cl
from . import recovery, sinks
from .probes import probe
from .supervise import raise_for_result, run_cell


class CellSyntaxError(Exception):
    """The cell does not parse: reported once, before anything is sent to the ranks."""

    def __init__(self, err: SyntaxError):
        self.err = err
        super().__init__(str(err))

    def _render_traceback_(self) -> list[str]:
        return ["The cell was not sent to the ranks:"] + "".join(
            traceback.format_exception_only(type(self.err), self.err)
        ).rstrip().splitlines()


def parse_targets(text: str | None, flag: str = "--targets") -> list[int] | None:
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
        raise usage_error(f"{flag} {text!r} is not a rank list; use e.g. {flag} 0 or {flag} 0,2 "
                          f"or {flag} 1-3.") from None
    if any(r < 0 for r in ranks):
        raise usage_error(f"{flag} {text!r}: ranks are non-negative, e.g. {flag} 0,1.")
    return sorted(set(ranks))


def parse_line(magic: Any, line: str) -> argparse.Namespace:
    """A magic's ``line`` split as a shell splits it (quotes group words and are removed), then parsed.

    IPython's own ``parse_argstring`` keeps the quotes: ``--slurm "-p gpu -t 60"`` gave srun the one argument
    ``-p gpu -t 60`` with its quotes, and ``--slurm="-t 60"`` failed.

    >>> @magic_arguments()
    ... @argument("--slurm")
    ... def f(line): pass
    >>> parse_line(f, '--slurm "-p gpu -t 60"').slurm
    '-p gpu -t 60'
    """
    try:
        words = shlex.split(line)
    except ValueError as exc:  # "No closing quotation"
        raise usage_error(f"{line.strip()}: {exc}; close the quotes around an option's value, e.g. "
                          '--slurm "-p gpu -t 60".') from None
    return magic.parser.parse_args(words)


def _say(msg: str) -> None:
    print(msg, flush=True)


def _with_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``@argument`` for every option of the table, in order (decorators apply bottom-up)."""
    for flags, kwargs in reversed(option_table().parser_arguments()):
        fn = argument(*flags, **kwargs)(fn)
    return magic_arguments()(fn)


@magics_class
class DistributedMagics(Magics):
    """``%%distributed`` and ``%dist``."""

    @_with_options
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
        args = parse_line(self.distributed, line)
        table = option_table()
        opts = table.cell_options(args)
        self._check_syntax(cell)
        problem = sinks.unavailable(opts)
        if problem:
            raise usage_error(problem)
        ranks = parse_targets(opts.targets)
        debug_ranks = parse_targets(opts.debug_ranks, "--debug-ranks") if opts.debug_ranks else None
        cluster = self._ensure_cluster(table, args, opts)
        try:
            cluster.engine_ids(ranks)
        except ValueError as exc:
            raise usage_error(f"--targets: {exc}") from None
        if opts.debug_ranks:
            cell_ranks = list(range(cluster.config.n)) if ranks is None else ranks
            debug_ranks = cell_ranks if debug_ranks is None else debug_ranks  # all: every rank of the cell
            if max(debug_ranks) >= cluster.config.n:
                raise usage_error(f"--debug-ranks: rank {max(debug_ranks)} does not exist (ranks 0-{cluster.config.n - 1}).")
            outside = sorted(set(debug_ranks) - set(cell_ranks))
            if outside:
                raise usage_error(f"--debug-ranks {opts.debug_ranks}: rank(s) {', '.join(map(str, outside))} do not run "
                                  f"this cell (--targets {opts.targets}); stop on ranks it runs on, or widen --targets.")
        raw = self.shell.history_manager.input_hist_raw
        result = run_cell(cluster, cell, opts, ranks=ranks, debug_ranks=debug_ranks, raw=raw[-1] if raw else None)
        notes = []
        world = cluster.config.n
        if result.death is not None and cluster.config.elastic:
            from .resize import go_on_after_loss

            notes.append(go_on_after_loss(cluster, result.death, _say))
        elif result.death is not None and cluster.config.auto_restart:
            _say(f"jdist: rank {result.death.rank} died ({result.death.cause}); restarting (--auto-restart)...")
            notes.append(recovery.restart(cluster, _say))
        elif result.unusable:
            _say("jdist: the ranks' collectives cannot be used again in their processes; restarting the ranks...")
            notes.append(recovery.restart(cluster, _say))
        raise_for_result(result, world, notes)

    def _check_syntax(self, cell: str) -> None:
        try:
            compile(self.shell.transform_cell(cell), "<%%distributed cell>", "exec")
        except SyntaxError as err:
            raise CellSyntaxError(err) from None

    def _ensure_cluster(self, table: OptionTable, args: Any, opts: CellOptions) -> cl.ClusterSession:
        running = cl.current()
        old = running.config if running is not None else None
        try:
            plan = table.plan(table.requested(args), old, bool(opts.restart))
            if plan.action != "reuse":
                probe(plan.config, old)
        except ValueError as exc:
            raise usage_error(str(exc)) from None
        if plan.action == "reuse":
            assert running is not None
            if plan.live:
                for message in running.apply_live(plan.live):
                    _say(message)
            return running
        if running is not None:
            _say("Stopping the running cluster...")
            running.stop()
            cl.set_current(None)
        cluster = cl.ClusterSession(plan.config)
        if not opts.no_dashboard:
            from .dashboard import preload

            threading.Thread(target=preload, name="jdist-preload", daemon=True).start()
        cluster.start(_say)
        cl.set_current(cluster)
        return cluster

    @magic_arguments()
    @argument("command", choices=["status", "stacks", "stop", "restart", "resize", "pull", "push", "attach", "debug",
                                  "doctor"],
              help="status: ranks and state; stacks: where each rank is (Python stack); stop; restart (replays "
                   "set-up cells and restores the newest checkpoint); pull NAME; push NAME; attach RUN (the ranks "
                   "of a jdist run --keep); debug: pdb on a failed cell's traceback (post-mortem); doctor: what a "
                   "bug report needs (versions, devices, environment, network, clocks, collectives), saved too.")
    @argument("name", nargs="?", default=None, help="Variable name for pull/push; run id for attach.")
    @argument("--fresh", action="store_true", help="restart: start empty ranks (no replay, no restore).")
    @argument("-n", type=int, default=None, dest="size", metavar="M",
              help="resize: the new number of ranks (CPU ranks, or GPUs on a --gpus cluster).")
    @argument("--gpus", type=int, default=None, metavar="M", help="resize: the new number of GPU ranks.")
    @argument("--hosts", default=None, metavar="HOST:N,...",
              help="resize: the hosts of an ssh cluster and ranks on each (-n defaults to their sum).")
    @argument("--keep-global-batch", action="store_true",
              help="resize: keep the samples per step by changing the gradient accumulation (else the global batch "
                   "scales with the ranks).")
    @argument("--dir", default=None, metavar="PATH",
              help="resize: the folder for the state in transit (default: the run folder; several hosts need one "
                   "they share).")
    @argument("--rank", type=int, default=None, help="pull/push: only this rank (pull returns the value itself); "
                                                      "debug: this rank.")
    @argument("--ranks", default=None, help="debug: these ranks (e.g. 0,1), each command sent to each.")
    @line_magic
    def dist(self, line: str) -> Any:
        """Manage the jdist cluster of this kernel.

        ``%dist status``       ranks, hosts, devices, backend, busy/idle
        ``%dist stacks``       each rank's Python stack: which line it runs or waits on
        ``%dist stop``         stop the cluster
        ``%dist restart``      restart it with the same options, replay the set-up cells (those
                               that logged nothing) and restore the newest jdist.checkpoint_every
                               checkpoint; ``--fresh``: empty ranks
        ``%dist resize -n M``  M ranks instead, keeping the training as it is now: prepared models,
                               optimizers, schedulers and loaders (resharded), the variables alike on
                               every rank; the set-up cells replayed
        ``%dist pull NAME``    set NAME in the notebook to [value on rank 0, rank 1, ...];
                               ``--rank R`` for the value of one rank
        ``%dist push NAME``    send the notebook's NAME to every rank (or ``--rank R``)
        ``%dist attach RUN``   take over the ranks of ``jdist run --keep`` (run id or a unique
                               prefix), with the script's globals; they are this kernel's from then on
        ``%dist debug``        after a failed cell: pdb on the traceback of the rank that failed
                               first (``--rank R``, ``--ranks 0,1``), typed in the notebook; ``q`` ends
        ``%dist doctor``       one report for a bug report: every rank's versions, libraries, devices,
                               environment, network, clock offset and newest collectives; saved in the
                               run folder
        """
        args = parse_line(self.dist, line)
        if args.command in ("pull", "push") and not args.name:
            raise usage_error(f"%dist {args.command} needs a variable name, e.g. %dist {args.command} model_state")
        if args.command == "attach":
            return self._dist_attach(args)
        if args.command == "resize":
            return self._dist_resize(args)
        cluster = cl.current()
        if cluster is None:
            if args.command == "stop":
                _say("No jdist cluster is running.")
                return None
            raise usage_error("No jdist cluster is running: start one with %%distributed -n 2.")
        ranks = None if args.rank is None else [args.rank]
        handler = getattr(self, f"_dist_{args.command}")
        try:
            return handler(cluster, args, ranks)
        except ValueError as exc:
            raise usage_error(str(exc)) from None

    def _dist_attach(self, args: Any) -> None:
        from . import attach

        if not args.name:
            raise usage_error("%dist attach needs the run id that jdist run --keep printed, e.g. %dist attach 20261125")
        if cl.current() is not None:
            raise usage_error("This kernel has a cluster already: %dist stop it first, then %dist attach.")
        try:
            cluster = attach.attach(args.name)
        except ValueError as exc:
            raise usage_error(f"%dist attach: {exc}") from None
        cl.set_current(cluster)
        _say(f"Attached {cluster.config.n} rank(s), backend {cluster.backend_label()}: the script's variables are on "
             "the ranks; %%distributed cells run there now, and %dist stop ends them.")

    def _dist_debug(self, cluster: cl.ClusterSession, args: Any, ranks: list[int] | None) -> None:
        from ipyparallel.error import RemoteError

        from .debug import postmortem as debug

        if args.ranks is not None:
            ranks = parse_targets(args.ranks, "--ranks")
        if ranks and max(ranks) >= cluster.config.n:
            raise usage_error(f"%dist debug: rank {max(ranks)} does not exist (ranks 0-{cluster.config.n - 1}).")
        try:
            debug.post_mortem(cluster, ranks, input, _say)
        except RemoteError as exc:
            raise usage_error(f"%dist debug: {remote_errors(exc)}") from None

    def _dist_doctor(self, cluster: cl.ClusterSession, args: Any, ranks: list[int] | None) -> None:
        from .doctor import doctor

        text, path = doctor(cluster)
        _say(f"{text}\n(saved: {path})")

    def _dist_status(self, cluster: cl.ClusterSession, args: Any, ranks: list[int] | None) -> None:
        _say(format_status(cluster.status()))

    def _dist_stop(self, cluster: cl.ClusterSession, args: Any, ranks: list[int] | None) -> None:
        cluster.stop()
        cl.set_current(None)
        _say("Cluster stopped.")

    def _dist_stacks(self, cluster: cl.ClusterSession, args: Any, ranks: list[int] | None) -> None:
        spec = backend_spec(cluster.config.backend)
        _say(format_stacks(cluster.stacks(ranks), spec.backward_waits, spec.collective_paths))

    def _dist_resize(self, args: Any) -> None:
        from . import resize

        if args.size is not None and args.gpus is not None:
            raise usage_error("%dist resize takes -n M or --gpus M, not both.")
        size = args.size if args.size is not None else args.gpus
        cluster = cl.current()
        try:
            changes = resize.launcher_changes(cluster, hosts=args.hosts)
            if size is None and changes.get("hosts"):
                from .launch.remote import parse_hosts

                size = sum(count for _, count in parse_hosts(changes["hosts"]))
            if size is None:
                raise ValueError("%dist resize needs the new number of ranks: %dist resize -n 4 (or --gpus 4, or "
                                 "--hosts node1:2,node2:2 on an ssh cluster).")
            resize.check(cluster, size, changes)
            assert cluster is not None
            if args.gpus is not None and not cluster.config.gpus:
                raise ValueError(f"%dist resize --gpus {size}: this cluster runs CPU ranks; resize it with -n {size}.")
            _say(resize.resize(cluster, size, _say, args.dir, args.keep_global_batch, changes))
        except ValueError as exc:
            raise usage_error(str(exc)) from None

    def _dist_restart(self, cluster: cl.ClusterSession, args: Any, ranks: list[int] | None) -> None:
        _say(recovery.restart(cluster, _say, restore=not args.fresh))

    def _dist_push(self, cluster: cl.ClusterSession, args: Any, ranks: list[int] | None) -> None:
        if args.name not in self.shell.user_ns:
            raise usage_error(f"%dist push {args.name}: no variable {args.name!r} in the notebook.")
        cluster.push(args.name, self.shell.user_ns[args.name], ranks)
        _say(f"Pushed {args.name} to {'rank ' + str(args.rank) if ranks else 'all ranks'}.")

    def _dist_pull(self, cluster: cl.ClusterSession, args: Any, ranks: list[int] | None) -> None:
        from ipyparallel.error import CompositeError, RemoteError

        name = args.name
        try:
            values = cluster.pull(name, ranks)
        except RemoteError as exc:
            ename, evalue = exc.ename, exc.evalue
            if isinstance(exc, CompositeError) and exc.elist:
                ename, evalue = exc.elist[0][:2]
            if ename == "NameError":
                raise usage_error(f"%dist pull {name}: {evalue}. Define it in a %%distributed cell first.") from None
            raise usage_error(
                f"%dist pull {name}: the value could not be sent back ({ename}: {evalue}). "
                "Pull something picklable, e.g. a state_dict or tensor."
            ) from None
        self.shell.user_ns[name] = values[0] if ranks else values
        where = f"rank {ranks[0]}" if ranks else f"{len(values)} ranks (list in rank order)"
        _say(f"{name} <- {where}")


def format_stacks(stacks: dict[int, list[Frame]], backward_waits: bool = False,
                  collective_paths: tuple[str, ...] = COLLECTIVE_PATHS) -> str:
    """``%dist stacks`` text: per rank a one-line summary, then its stack (outermost first)."""
    out = []
    for rank, frames in sorted(stacks.items()):
        out.append(f"rank {rank}: {summary(frames, backward_waits, collective_paths)}")
        if frames:
            out.append(format_stack(frames))
    return "\n".join(out)


def format_status(status: dict[str, Any]) -> str:
    """Human-readable ``%dist status`` text."""
    cfg = status["config"]
    kind = "GPU" if cfg["gpus"] else "CPU"
    lines = [
        f"jdist cluster {status['cluster_id']}: {cfg['n']} {kind} rank(s), backend {status['backend']}, "
        f"precision {cfg.get('precision', 'fp32')}, process-group timeout {cfg['timeout']:g} s, "
        f"up {status['uptime_s']:.0f} s",
        f"{'rank':>4}  {'host':<16} {'pid':>8}  {'device':<8} {'state':<5}",
    ]
    for r in status["ranks"]:
        lines.append(f"{r['rank']:>4}  {r['host']:<16} {r['pid']:>8}  {r['device']:<8} {r['state']:<5}")
    return "\n".join(lines)


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%distributed`` and ``%dist``, and make ``jdist`` a name of the notebook."""
    from .debug import dapbridge

    ipython.register_magics(DistributedMagics)
    ipython.user_ns.setdefault("jdist", sys.modules["jdist"])
    dapbridge.install(ipython)  # JupyterLab's Debugger panel reaches the ranks of %%distributed cells


__all__ = ["DistributedMagics", "format_stacks", "format_status", "load_ipython_extension",
           "parse_targets"]
