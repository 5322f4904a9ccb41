"""``jdist run``: a script on every rank of a jdist cluster, supervised as a notebook cell is.

The cluster is the one ``%%distributed`` starts, from the same options (one option table); the
script runs on every rank as under IPython's ``%run`` (``__main__``, ``sys.argv``, torchrun's
environment, the script's own ``init_process_group`` accepted), through the same
:class:`~jdist.kernel.supervise.CellSupervisor`: lossless ``jdist.log`` into the run log, the
root-cause error with the failing rank's traceback (ranks jdist released are "released"), the
hang watchdog, a rank's death with its cause. What the terminal adds:

* Ctrl-C: the first press sends SIGINT to every rank (also ranks blocked in a collective) and
  waits up to ``--interrupt-grace`` s (default 10), naming the ranks still
  running then; a second press (or SIGTERM/SIGHUP) ends the ranks at once.
* exit codes (:data:`EXIT_CODES`) and ``errors.json`` in the run folder.

Example::

    $ jdist run -n 2 train.py --epochs 3
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from jdist.errors import JdistError, strip_ansi
from jdist.metrics import Run
from jdist.options import CellOptions

#: What ``jdist run`` exits with (documented in docs/cli.md).
EXIT_CODES = {
    0: "every rank finished",
    1: "the script raised, or exited with a non-zero code, on some rank",
    2: "usage: bad options or arguments, nothing started",
    3: "the launch failed: the ranks did not start or register",
    4: "hang: every running rank waited in a collective (--watchdog)",
    130: "interrupted (Ctrl-C)",
    143: "terminated (SIGTERM; SIGHUP: 129)",
}
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_LAUNCH, EXIT_HANG = 0, 1, 2, 3, 4
#: 128+N: a rank was killed by signal N (137: SIGKILL, often the out-of-memory killer).
SIGNAL_BASE = 128
#: Seconds the cluster's stop gets at the end of ``jdist run``, then the exit's clean-up (atexit handlers,
#: threads that are not daemons). A stop takes 1-10 s; a run that ended never hangs its terminal or batch job.
STOP_BOUND_S, EXIT_BOUND_S = 60.0, 20.0



class Terminate(BaseException):
    """A second Ctrl-C, SIGTERM or SIGHUP: end the ranks now (not an ``Exception``: nothing on
    the way may swallow it)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class Signals:
    """Ctrl-C as a terminal sends it: the first SIGINT becomes KeyboardInterrupt (the supervisor
    forwards it to the ranks), a second, or SIGTERM/SIGHUP, :class:`Terminate`. The launcher,
    controller and ranks run in sessions of their own (ipyparallel starts them so): only this
    process gets the terminal's signals."""

    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.interrupts = 0
        self.armed = True
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        for sig in self.HANDLED:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.armed:  # stopping the cluster: it ends everything within seconds anyway
            return
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts == 1:
                self.say("interrupting every rank (SIGINT); press Ctrl-C again to end them now")
                raise KeyboardInterrupt
        self.armed = False
        raise Terminate(signum)


def script_code(script: Path, args: list[str], restarts: int | None = None) -> str:
    """The code each rank runs: IPython's ``%run`` of ``script`` with ``args`` (no glob or ``$var``
    expansion: the arguments arrive as given); with ``restarts`` (``--elastic``), first
    ``$TORCHELASTIC_RESTART_COUNT`` set to it, as torchrun's elastic agent sets it for the script it restarts.

    >>> script_code(Path("/w/train.py"), ["--lr", "3e-4", "a b"])
    'get_ipython().find_line_magic("run")("-G /w/train.py --lr 3e-4 \\'a b\\'")'
    """
    line = " ".join(shlex.quote(a) for a in ["-G", str(script), *args])
    code = f'get_ipython().find_line_magic("run")({json.dumps(line)})'
    if restarts is not None:
        code = f'__import__("os").environ["TORCHELASTIC_RESTART_COUNT"] = "{restarts}"\n' + code
    return code


def exit_code_of(result: Any) -> int:
    """The exit code for a :class:`~jdist.kernel.supervise.CellResult` (:data:`EXIT_CODES`)."""
    obs = result.obs
    if result.interrupted:
        return 130
    if obs.death is not None:
        code = obs.death.exit_code
        return code if code is not None and code > SIGNAL_BASE else EXIT_ERROR
    if obs.hang is not None and not result.failed:
        return EXIT_HANG
    return EXIT_OK if result.ok else EXIT_ERROR


def error_entries(result: Any, infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``errors.json``: one entry per rank, the root cause first, then by the time each ended.

    ``kind``: ``exception`` (raised), ``exit`` (sys.exit with a code), ``died`` (the process
    ended), ``hang`` (waited in a collective), ``released`` (stopped by jdist because of another
    rank), ``stuck`` (did not stop after an interrupt), ``interrupted``, ``finished``.
    """
    obs, outcome = result.obs, result.outcome
    failures = obs.failures
    root = obs.death.rank if obs.death is not None else outcome.first_failed
    entries = []
    for info in infos:
        r = info["rank"]
        f = failures.get(r)
        entry: dict[str, Any] = {"rank": r, "host": info["host"], "pid": info["pid"], "kind": "finished",
                                 "exit_code": None, "type": None, "message": None, "traceback": [], "where": None,
                                 "time": f.completed if f is not None else None}
        if obs.death is not None:
            entry["kind"] = "died"
            if r == obs.death.rank:
                entry.update(message=obs.death.cause, exit_code=obs.death.exit_code)
            else:
                entry["message"] = f"ended by MPI after rank {obs.death.rank} died"
        elif r in obs.stuck:
            entry.update(kind="stuck", where=result.stuck_stacks.get(r))
        elif obs.hang is not None and r in obs.hang:
            entry.update(kind="hang", where=obs.hang[r])
        elif r in obs.released and r not in outcome.failed:
            entry.update(kind="released", message=f"released because rank {root} failed" if root is not None
                         else "released")
            where = (result.rebuilt or {}).get("released_from", {}).get(r)
            entry["where"] = where
        elif f is not None and f.exit_code is not None:
            entry.update(kind="exit" if f.exit_code else "finished", exit_code=f.exit_code, message=f.summary)
        elif f is not None and f.ename == "KeyboardInterrupt":
            entry.update(kind="interrupted", type=f.ename)
        elif f is not None:
            entry.update(kind="exception", type=f.ename, message=f.evalue,
                         traceback=[strip_ansi(line) for line in "\n".join(f.traceback).splitlines()])
        entries.append(entry)
    entries.sort(key=lambda e: (e["rank"] != root, e["time"] is None, e["time"] or 0, e["rank"]))
    return entries


def outcome_lines(result: Any, world_size: int, notes: list[str]) -> list[str]:
    """What went wrong, as the notebook reports it (one error, the failing rank's traceback, what
    happened to the others), with ``jdist run``'s advice (:data:`jdist.cli.SCRIPT`: its run ends with its
    ranks, no ``%dist`` command applies)."""
    from jdist.kernel.supervise import fault_notes, raise_for_result

    from .frontend import SCRIPT

    def for_scripts(lines: list[str]) -> list[str]:
        return [line for line in lines if line != "[Engine Exception]"]  # ipyparallel's label of a rank's error

    if result.interrupted:  # the notebook's line would say the ranks' variables are kept
        done = "some did not stop" if result.obs.stuck else "every rank stopped"
        return [f"Interrupted: every rank received SIGINT and {done}.", *fault_notes(result, SCRIPT), *notes]
    try:
        raise_for_result(result, world_size, notes, SCRIPT)
    except JdistError as exc:
        render = getattr(exc, "_render_traceback_", None)
        return for_scripts(render() if callable(render) else [str(exc)])
    return []


def sinks_for(opts: CellOptions, live: bool, title: str, every_s: float) -> Callable[[Run], list[Any]]:
    """The run's sinks: the run log, the terminal view, and the options' tracker sinks."""
    from jdist.kernel.sinks import RunLogSink, plugin_sinks

    from .view import LiveView, PlainView

    def make(run: Run) -> list[Any]:
        view = LiveView(title) if live else PlainView(every_s=every_s)
        return [RunLogSink(opts.run_dir), view, *plugin_sinks(run, opts)]

    return make


def _show_display(content: dict[str, Any]) -> None:
    text = content.get("data", {}).get("text/plain")
    if text:
        print(text, flush=True)


def run(args: Any, say: Callable[[str], None]) -> int:
    """``jdist run`` with parsed ``args`` (the option table's, plus ``script``, ``script_args``,
    ``live``, ``every``); the exit code."""
    from jdist.kernel import sinks as kernel_sinks
    from jdist.kernel.cluster import ClusterSession
    from jdist.kernel.probes import probe
    from jdist.kernel.supervise import CellSupervisor
    from jdist.plugins import option_table

    from .frontend import SCRIPT

    script = Path(args.script).expanduser()
    if not script.is_file():
        say(f"error: no script {args.script!r}: give the path of a Python file, e.g. jdist run -n 2 train.py")
        return EXIT_USAGE
    script = script.resolve()
    table = option_table()
    opts = table.cell_options(args)
    try:
        table.refuse_given(SCRIPT, vars(args))
        plan = table.plan(table.requested(args), None, False)
        probe(plan.config)
    except ValueError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    problem = kernel_sinks.unavailable(opts)
    if problem:
        say(f"error: {problem}")
        return EXIT_USAGE
    config = plan.config
    command = " ".join(shlex.quote(a) for a in ["jdist", "run", *args.argv])
    live = args.live if args.live is not None else sys.stdout.isatty()
    t0 = time.monotonic()
    cluster = ClusterSession(config)
    busy = False  # the ranks may still run code when the cluster stops
    with Signals(say) as signals:
        try:
            failed = start(cluster, say)
            if failed is not None:
                return failed
            title = f"jdist run {script.name}"
            restarts = 0
            while True:
                sup = CellSupervisor(cluster, script_code(script, list(args.script_args),
                                                          restarts if config.elastic else None), None, opts.output,
                                     sinks_for(opts, live, title, args.every),
                                     run_code=f"# $ {command}\n" + _text(script), show=_show_display,
                                     rebuild=args.keep is not None)
                run_ = sup.records.ensure_run()  # the run folder exists from the start: the sidebar shows it
                assert run_.path is not None
                say(f"run {run_.run_id}: {run_.path}")
                try:
                    result = sup.run()
                except (Terminate, KeyboardInterrupt) as exc:  # (an interrupt after the cell: while draining)
                    signum = exc.signum if isinstance(exc, Terminate) else signal.SIGINT
                    sup.records.finish("interrupted", f"terminated by {signal.Signals(signum).name}")
                    raise Terminate(signum) from None
                if result.obs.death is None or not config.elastic:
                    break
                smaller = elastic_restart(cluster, result, restarts, args.max_restarts, title, say)
                if smaller is None:
                    break
                restarts += 1
                config = smaller
            signals.armed = False
            busy = bool(result.obs.stuck)  # ranks that did not stop after the interrupt are ended
            code = exit_code_of(result)
            elapsed = time.monotonic() - t0
            if code == EXIT_OK:
                if run_.count():
                    print(run_.summary(), flush=True)
                say(f"{title}: finished on {config.n} rank(s) in {elapsed:.1f} s")
            else:
                lines = outcome_lines(result, config.n, [f"run log: {run_.path}  (jdist show {run_.run_id})"])
                (run_.path / "errors.json").write_text(json.dumps(error_entries(result, cluster.ranks), indent=1))
                for line in lines:
                    print(line if sys.stderr.isatty() else strip_ansi(line), file=sys.stderr)
                say(f"{title}: {'interrupted' if code == 130 else 'FAILED'} after {elapsed:.1f} s (exit {code})")
            if args.keep is not None and result.obs.death is None and not result.obs.stuck:
                signals.armed, signals.interrupts = True, 1  # from here, Ctrl-C ends the ranks
                busy = False
                if offer(cluster, run_, args.keep, say):
                    cluster.detach()  # the kernel owns them now: nothing to stop
            return code
        except Terminate as term:
            say(f"{signal.Signals(term.signum).name}: ending the ranks")
            busy = True
            return SIGNAL_BASE + term.signum
        finally:
            signals.armed = False
            controller = cluster.controller_pid()
            if not stop_within(lambda: cluster.stop(busy=busy), STOP_BOUND_S, say) and controller is not None:
                try:  # the ranks watch this process; the controller does not: it ends its schedulers itself
                    os.kill(controller, signal.SIGTERM)
                except OSError:
                    pass


def elastic_restart(cluster: Any, result: Any, restarts: int, max_restarts: int, title: str,
                    say: Callable[[str], None]) -> Any:
    """``--elastic`` after a death: the ranks left (at least MIN) started again for the script's next attempt, which
    resumes from its own checkpoint, as under torchrun's elastic agent; their configuration, or None when the run
    ends here (more than ``max_restarts``, or fewer than MIN left), said in one line either way."""
    from jdist.kernel.resize import after_loss

    low, high = cluster.config.elastic_range
    smaller, what, short = after_loss(cluster, result.obs.death)
    if smaller is None or restarts >= max_restarts:
        why = short if smaller is None else f"it was restarted {restarts} time(s) already (--max-restarts {max_restarts})"
        say(f"{title}: {what}: not restarted: {why}")
        return None
    for line in outcome_lines(result, cluster.config.n, []):  # (the attempt's error, as the run's end would say it)
        print(line if sys.stderr.isatty() else strip_ansi(line), file=sys.stderr)
    say(f"{title}: {what}: restarting the script on {smaller.n} rank(s) (--elastic {low}:{high}, restart "
        f"{restarts + 1} of at most {max_restarts}; TORCHELASTIC_RESTART_COUNT={restarts + 1})...")
    cluster.config = smaller
    cluster.restart(say)
    return smaller


def start(cluster: Any, say: Callable[[str], None]) -> int | None:
    """Start ``cluster``'s ranks; None, or the exit code of a start that failed (said in one line) or was
    interrupted."""
    from jdist.errors import ClusterError

    try:
        cluster.start(say)
    except KeyboardInterrupt:
        say("interrupted while starting the ranks")
        return 130
    except (ClusterError, OSError, RuntimeError) as exc:
        lines = exc.lines if isinstance(exc, ClusterError) else [f"{type(exc).__name__}: {exc}"]
        say("error: the launch failed: " + "\n".join(lines))
        return EXIT_LAUNCH
    return None


def doctor_command(args: Any, say: Callable[[str], None]) -> int:
    """``jdist doctor``: start the ranks with the cluster options in ``args``, print and save
    :func:`jdist.kernel.doctor.doctor`'s report, stop them; the exit code."""
    from jdist.kernel.cluster import ClusterSession
    from jdist.kernel.doctor import doctor
    from jdist.kernel.probes import probe
    from jdist.plugins import option_table

    from .frontend import SCRIPT

    table = option_table()
    try:
        table.refuse_given(SCRIPT, vars(args))
        plan = table.plan(table.requested(args), None, False)
        probe(plan.config)
    except ValueError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    cluster = ClusterSession(plan.config)
    try:
        failed = start(cluster, say)
        if failed is not None:
            return failed
        text, path = doctor(cluster)
        print(text, flush=True)
        say(f"saved: {path}")
        return EXIT_OK
    finally:
        stop_within(cluster.stop, STOP_BOUND_S, say)


def stop_within(stop: Callable[[], None], seconds: float, say: Callable[[str], None]) -> bool:
    """Call ``stop`` (the cluster's) for at most ``seconds``; True when it returned. Past that, one line
    says so and the caller goes on to exit: the ranks end themselves when their owner (this process) is
    gone, and nothing waits forever on a controller that stopped answering.

    >>> stop_within(lambda: None, 1, print)
    True
    >>> stop_within(lambda: time.sleep(5), 0.1, print)
    stopping the ranks took over 0.1 s: exiting without waiting (the ranks end when this process does)
    False
    """
    done = threading.Event()

    def call() -> None:
        try:
            stop()
        finally:
            done.set()

    threading.Thread(target=call, name="jdist-stop", daemon=True).start()
    if done.wait(seconds):
        return True
    say(f"stopping the ranks took over {seconds:g} s: exiting without waiting (the ranks end when this process does)")
    return False


def exit_within(seconds: float, code: int, say: Callable[[str], None]) -> None:
    """After the command's work, the interpreter's exit (atexit handlers, threads that are not daemons) gets
    ``seconds``; then the process ends with ``code`` and one line that says so."""

    def now() -> None:
        say(f"exiting took over {seconds:g} s (a clean-up did not end): exiting now")
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(seconds, now)
    timer.daemon = True
    timer.start()


def offer(cluster: Any, run: Run, minutes: float, say: Callable[[str], None]) -> bool:
    """``--keep``: offer the ranks, with the script's globals, to a notebook's ``%dist attach`` for
    ``minutes`` (:mod:`jdist.kernel.attach`); True once a kernel took them, False when the time is up
    (the caller stops them). Ctrl-C or SIGTERM while waiting: :class:`Terminate`."""
    import os
    import socket

    from jdist.common.procs import identity
    from jdist.kernel.attach import ACCEPTED, OFFER

    assert run.path is not None and cluster.work_dir is not None and cluster.state_file is not None
    if cluster.launcher is None or cluster.launcher.remote:
        say("--keep: ranks on other hosts cannot be attached yet (local-mpi only): stopping them")
        return False
    accepted = cluster.work_dir / ACCEPTED
    (run.path / OFFER).write_text(json.dumps({
        "cluster_id": cluster.cluster_id, "state_file": str(cluster.state_file), "work_dir": str(cluster.work_dir),
        "owner": identity(os.getpid()), "host": socket.gethostname()}))
    say(f"ranks kept with the script's variables; in a notebook on this machine: %dist attach {run.run_id}  "
        f"(they end in {minutes:g} min unless attached; Ctrl-C ends them now)")
    deadline = time.monotonic() + 60 * minutes
    try:
        while not accepted.exists():
            if time.monotonic() > deadline:
                say(f"--keep: not attached within {minutes:g} min: stopping the ranks")
                return False
            time.sleep(0.2)
        say(f"attached by the kernel with PID {accepted.read_text().strip()}: the ranks are its now")
        return True
    except KeyboardInterrupt:
        raise Terminate(signal.SIGINT) from None
    finally:
        (run.path / OFFER).unlink(missing_ok=True)


def _text(script: Path, limit: int = 256 * 1024) -> str:
    try:
        data = script.read_text(errors="replace")
    except OSError:
        return ""
    return data if len(data) <= limit else data[:limit] + "\n# ... (cut at 256 KiB)\n"


__all__ = ["EXIT_CODES", "Signals", "Terminate", "error_entries", "exit_code_of", "exit_within", "outcome_lines", "run",
           "script_code", "stop_within"]
