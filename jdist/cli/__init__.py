"""The ``jdist`` command: scripts on jdist's ranks from a terminal, and the run log.

Another front end of what ``%%distributed`` uses: the same option table (each option defined
once, in :mod:`jdist.options` or by the plugin that owns it), the same cluster, launchers and
cell supervisor (:mod:`jdist.kernel`). Commands:

* ``jdist run [options] script.py [args...]``: :mod:`jdist.cli.run`;
* ``jdist runs``, ``jdist show [RUN]``, ``jdist watch [RUN]``: :mod:`jdist.cli.runs`;
* ``jdist clusters``, ``jdist stop CLUSTER``: :mod:`jdist.cli.clusters`;
* ``jdist doctor [cluster options]``: the ranks started, ``%dist doctor``'s report, the ranks stopped.

``python -m jdist ...`` is the same. Example::

    $ jdist run -n 2 --backend ddp train.py --lr 3e-4
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .frontend import SCRIPT


def _say(message: str) -> None:
    print(f"jdist: {message}", file=sys.stderr, flush=True)


def run_parser(parser: argparse.ArgumentParser) -> None:
    """``jdist run``'s arguments: the option table's (help without the notebook's scope notes), the
    terminal's own, then the script and its arguments (passed untouched)."""
    from jdist.plugins import option_table

    table = option_table()
    for opt in (*table.cluster, *table.cell):
        flags, kwargs = opt.argparse()  # refused ones too, out of the help: refused after parsing, with why
        kwargs["help"] = opt.help if table.refusal(SCRIPT, opt.name) is None else argparse.SUPPRESS
        parser.add_argument(*flags, **kwargs)
    _view_options(parser)
    parser.add_argument("--keep", type=float, nargs="?", const=30.0, default=None, metavar="MINUTES",
                        help="After the script, keep the ranks with its variables for a notebook's %%%%dist attach RUN "
                             "on this machine (default: 30 minutes, then they stop).")
    parser.add_argument("--max-restarts", type=int, default=3, metavar="N",
                        help="With --elastic: restart the script on the ranks left at most N times (default 3); "
                             "it sees TORCHELASTIC_RESTART_COUNT and resumes from its own checkpoint.")
    parser.add_argument("script", help="The Python script every rank runs as __main__.")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="Its arguments, passed as given.")


def parser() -> argparse.ArgumentParser:
    from jdist import __version__

    p = argparse.ArgumentParser(prog="jdist", description="Run scripts on jdist's ranks; read the run log.")
    p.add_argument("--version", action="version", version=f"jdist {__version__}",
                   help="Print jdist's version (the same as jdist.__version__) and exit.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_parser(sub.add_parser(
        "run", help="Run a script on every rank (the options of %%%%distributed).",
        description="Run SCRIPT on every rank as __main__ (as torchrun would), with the live view, the root-cause "
                    "error and exit codes: 0 ok, 1 the script failed, 2 usage, 3 launch failed, 4 hang, 128+N a "
                    "rank killed by signal N, 130 interrupted."))
    runs = sub.add_parser("runs", help="List the runs in the run log, newest first.")
    runs.add_argument("--all", action="store_true", help="Every run (default: the newest --last).")
    runs.add_argument("--last", type=int, default=20, metavar="N", help="How many runs (default 20).")
    runs.add_argument("--json", action="store_true", help="One JSON object per run.")
    show = sub.add_parser("show", help="A run's summary, and each rank's error if it failed.")
    show.add_argument("run", nargs="?", default=None, help="Run id or a unique prefix (default: the newest run).")
    show.add_argument("--history", action="store_true", help="Every record as CSV.")
    watch = sub.add_parser("watch", help="The live view of a run while it runs (a notebook's too).")
    watch.add_argument("run", nargs="?", default=None, help="Run id or a unique prefix (default: the newest run).")
    _view_options(watch)
    for sp in (runs, show, watch):
        sp.add_argument("--run-dir", default=None, metavar="DIR",
                        help="The run log (default: $JDIST_RUN_DIR or <jupyter data dir>/jdist/runs).")
    doctor = sub.add_parser("doctor", help="Start the ranks and print what a bug report needs (as %%%%dist doctor).",
                            description="Start the ranks as jdist run would (the cluster options of %%%%distributed), "
                                        "print each rank's versions, libraries, devices, environment, network, clock "
                                        "offset and collectives, save the report in the run log, and stop.")
    from jdist.plugins import option_table

    table = option_table()
    for opt in table.cluster:
        flags, kwargs = opt.argparse()
        kwargs["help"] = opt.help if table.refusal(SCRIPT, opt.name) is None else argparse.SUPPRESS
        doctor.add_argument(*flags, **kwargs)
    clusters = sub.add_parser("clusters", help="The running jdist clusters (notebooks' and jdist run's).")
    clusters.add_argument("--json", action="store_true", help="One JSON object per cluster.")
    stop = sub.add_parser("stop", help="End a cluster that a jdist run owns (SIGTERM to it).")
    stop.add_argument("cluster", help="Cluster id or a unique prefix (jdist clusters lists them).")
    stop.add_argument("--wait", type=float, default=30.0, metavar="S", help="Seconds to wait for it to end.")
    for sp in (clusters, stop):
        sp.add_argument("--runtime-dir", default=None, metavar="DIR",
                        help="Where the state files are (default: jupyter's runtime dir).")
    return p


def _view_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--live", dest="live", action="store_true", default=None,
                        help="The live panel (default when stdout is a terminal).")
    parser.add_argument("--no-live", dest="live", action="store_false",
                        help="Plain status lines instead of the live panel (default when stdout is not a terminal).")
    parser.add_argument("--every", type=float, default=10.0, metavar="S",
                        help="Plain view: seconds between status lines (default 10).")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``jdist`` command; returns the exit code. As the program (``argv`` from ``sys.argv``), ``jdist run``'s
    process then ends within :data:`~jdist.cli.run.EXIT_BOUND_S` whatever its exit's clean-up does."""
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.command == "run":
        from .run import EXIT_BOUND_S, exit_within, run

        args.argv = argv[1:]
        code = run(args, _say)
        if program:
            exit_within(EXIT_BOUND_S, code, _say)
        return code
    if args.command == "doctor":
        from .run import doctor_command

        return doctor_command(args, _say)
    from . import clusters, runs

    command = {"runs": runs.list_command, "show": runs.show_command, "watch": runs.watch_command,
               "clusters": clusters.clusters_command, "stop": clusters.stop_command}[args.command]
    try:
        return command(args)
    except ValueError as exc:
        _say(f"error: {exc}")
        return 2


__all__ = ["SCRIPT", "main", "parser"]
