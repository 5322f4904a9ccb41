"""One ``%%distributed`` cell, supervised from send to report.

Data flows one way: ipyparallel's IO thread hands every IOPub message of the cell (output,
displays, jdist's data messages) to a queue (:class:`~jdist.kernel.supervise.view.IppCellView`);
the kernel's main thread drains it while it waits, prints rank output, feeds records to the
run's sinks (:class:`~jdist.kernel.supervise.collect.RecordCollector`) and polls the fault
detectors (:mod:`~jdist.kernel.supervise.detectors`). Widgets and displays are only touched from
the main thread (ipykernel 7 rule).

States: RUNNING → (a release or an interrupt) RELEASING → DRAINING → DONE. In RELEASING the
ranks got SIGINT and have ``--interrupt-grace`` seconds (default 10) to stop (a second interrupt
ends the wait at once). In DRAINING the output tail is collected, lost records are fetched again
from the ranks, and a process group broken by a release is re-built. :func:`jdist.kernel.supervise.outcome.classify`
then decides what happened. A cell that finished and logged nothing is a set-up cell:
:func:`run_cell` notes it in the cluster's recovery log.

Example:
    >>> result = run_cell(cluster, "print(rank)", option_table().cell_options({}))   # doctest: +SKIP
    >>> result.run is None        # the cell logged nothing   # doctest: +SKIP
    True
"""

from __future__ import annotations

import queue
import sys
import time
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Sequence

from jdist.common.stacks import IDLE, summary
from jdist.common.waiting import poll_until
from jdist.errors import RankFailure
from jdist.metrics import Run
from jdist.options import CellOptions
from jdist.plugins import backend_spec
from jdist.protocol import parse_message

from .collect import RecordCollector
from .detectors import DEATH_REPORT_S, Detector, EndGrace, Release, ReleaseAgain, Stop, default_detectors
from .hooks import CellHook
from .outcome import Observations, classify
from .output import RankOutput
from .report import CellResult
from .sigint import SigintCount
from .view import IppCellView, Message

if TYPE_CHECKING:
    from ..cluster import ClusterSession
    from ..sinks import RecordSink


#: How long a rank that ended its part of the cell (its stack shows no cell) has for its reply to arrive.
IDLE_REPLY_S = 2.0


class Phase(str, Enum):
    RUNNING = "running"
    RELEASING = "releasing"
    DRAINING = "draining"
    DONE = "done"


class CellSupervisor:
    """Runs one cell on its ranks until it ends, handling faults on the way (see the module doc)."""

    def __init__(self, cluster: ClusterSession, code: str, ranks: Sequence[int] | None, output: str,
                 sinks: Callable[[Run], list[RecordSink]], detectors: list[Detector] | None = None,
                 poll_s: float = 0.05, *, run_code: str | None = None,
                 show: Callable[[dict[str, Any]], None] | None = None, rebuild: bool = True,
                 hooks: Sequence[CellHook] = ()):
        """``run_code``: the code the run shows (default ``code``; ``jdist run``: the script);
        ``show``: how rank displays are shown (default: in the notebook); ``rebuild``: re-build a
        process group that a release broke (``jdist run`` ends instead); ``hooks``: features acting inside
        the cell (the debuggers: :func:`jdist.kernel.debug.hooks.debug_hooks`)."""
        self.cluster = cluster
        self.code = code
        targets = cluster.engine_ids(ranks)
        self.ranks = [cluster.rank_of_engine(e) for e in targets]
        self.output = RankOutput(output, self.ranks, show)
        self.records = RecordCollector(cluster, code if run_code is None else run_code, sinks,
                                       on_checkpoint=cluster.recovery.note_message)
        self.rebuild = rebuild
        self.detectors = detectors if detectors is not None else default_detectors(cluster.config.watchdog)
        self.hooks = list(hooks)
        self.poll_s = poll_s
        self.obs = Observations(ranks=list(self.ranks))
        self.phase = Phase.RUNNING
        self.inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self.view: IppCellView = None  # type: ignore[assignment]  # set by run()
        self.last_progress = time.monotonic()
        self.deadline: float | None = None
        self.grace_began: float | None = None
        self.paused: set[int] = set()  # ranks stopped in a debugger (no hang while they are)

    @property
    def releasing(self) -> bool:
        return self.phase is not Phase.RUNNING

    def run(self) -> CellResult:
        t0 = time.perf_counter()
        code = self.code
        started: list[CellHook] = []
        self.cluster.require_free(self.ranks, "This cell")
        try:
            for hook in self.hooks:
                code = hook.before(self, code)
                started.append(hook)
            if len(self.ranks) < self.cluster.config.n:  # --targets: collectives with the others are refused
                self.cluster.call("cell_ranks", self.ranks, ranks=self.ranks)
            self.view = IppCellView(self.cluster.execute(code, self.ranks), self.ranks)
            self.view.attach(self.inbox)
            self.last_progress = time.monotonic()
            self._wait()
        finally:
            for rank in list(self.paused):  # interrupted or failed while paused: no longer paused
                self.cluster.set_paused(rank, False)
            for hook in reversed(started):
                hook.after(self)
        self.phase = Phase.DRAINING
        result = self._drain()
        result.elapsed_s = time.perf_counter() - t0
        self.phase = Phase.DONE
        return result

    # -- RUNNING / RELEASING -----------------------------------------------------------------
    def _wait(self) -> None:
        """Wait for the cell, polling the detectors; the user's interrupts are counted as they arrive
        (:class:`SigintCount`), so one that Python dropped is still handled."""
        with SigintCount() as sigints:
            self._wait_loop(sigints)

    def _wait_loop(self, sigints: SigintCount) -> None:
        view = self.view
        done_count = 0
        while True:
            try:  # everything, the loop's test too: an interrupt may arrive at any line
                sigints.check()
                if view.ready():
                    return
                if self.deadline is not None and time.monotonic() > self.deadline:
                    return
                view.wait(self.poll_s)
                now = time.monotonic()
                if self.paused:  # a rank stopped in the debugger: the others wait for it, no hang
                    self.last_progress = now
                if self._pump():
                    self.last_progress = now
                self.records.tick()
                done = view.done_count()
                if done != done_count:
                    done_count, self.last_progress = done, now
                for detector in self.detectors:
                    action = detector.poll(now, self)
                    if isinstance(action, Stop):
                        self.obs.death = action.death
                        return
                    if isinstance(action, Release):
                        self._release(action)
                        break
                    if isinstance(action, EndGrace):
                        self.deadline = now
                        break
                    if isinstance(action, ReleaseAgain):
                        self.cluster.interrupt(action.ranks)
                        break
            except KeyboardInterrupt:
                sigints.handled()
                if not self.obs.interrupted:
                    self.obs.interrupted = True
                    self.cluster.interrupt(self.ranks)
                    self._start_grace()
                else:  # a second interrupt: stop waiting now; the ranks still running are named
                    self.deadline, self.obs.cut_short = time.monotonic(), True

    def _release(self, action: Release) -> None:
        if action.hang is not None:
            self.obs.hang = action.hang
            self.obs.collectives = action.collectives
            self.obs.alone = action.reason == "alone"
        self.obs.released = self.view.running()
        self.cluster.interrupt(self.obs.released)
        self._start_grace()

    def _start_grace(self) -> None:
        self.phase = Phase.RELEASING
        self.grace_began = time.monotonic()
        self.deadline = self.grace_began + self.cluster.config.interrupt_grace

    def _pump(self) -> bool:
        """Hand every queued message on; True if there was any (a host's load sample does not count: it
        comes once a second whatever the cell does, and would hide a hang from the watchdog)."""
        got = False
        while True:
            try:
                rank, kind, content = self.inbox.get_nowait()
            except queue.Empty:
                return got
            got = got or not _is_host_load(kind, content)  # a host's load is no sign the cell moves on
            if kind == "stream":
                self.output.stream(rank, content["name"], content["text"])
            elif kind in ("display_data", "execute_result"):
                self.output.display(rank, content)
            elif kind == "data":
                msg = parse_message(content)
                if msg is not None and not any(hook.on_message(self, rank, msg) for hook in self.hooks):
                    self.records.handle(rank, msg)

    def pause(self, rank: int, paused: bool) -> None:
        """Rank ``rank`` stopped in a debugger (or went on): no hang while it is; the sidebar and the
        dashboard's header show it."""
        if paused:
            self.paused.add(rank)
        else:
            self.paused.discard(rank)
        self.cluster.set_paused(rank, paused)
        self.records.paused(sorted(self.paused))

    def say_paused(self, rank: int, where: str, how: str) -> None:
        """One line: rank ``rank`` stopped ``where``, what the other ranks do meanwhile, and ``how`` to go on."""
        others = [r for r in self.ranks if r != rank and r not in self.paused]
        timeout = self.cluster.config.timeout
        when = time.strftime("%H:%M:%S", time.localtime(time.time() + timeout))
        print(f"jdist: rank {rank} stopped {where}. "
              + (f"Rank(s) {', '.join(map(str, others))} go on until they need it: in a collective their "
                 f"process group gives up after --timeout {timeout:g} s (by {when} if they are there now). "
                 if others else "")
              + f"{how}, the interrupt stops the cell.", flush=True)

    # -- DRAINING ----------------------------------------------------------------------------
    def _drain(self) -> CellResult:
        obs, view, cluster = self.obs, self.view, self.cluster
        spec = backend_spec(cluster.config.backend)
        stuck_stacks: dict[int, str] = {}
        if obs.death is None and any(f.ename == "EngineError" for f in view.failures().values()):
            # a rank's engine died and its nanny told the controller before the launcher saw the process end
            dead = poll_until(cluster.dead_ranks, DEATH_REPORT_S)
            if dead:
                obs.death = cluster.death_report(dead)
        if obs.death is None and view.ready():
            view.wait_for_output(5)
        elif obs.death is None:
            stuck_stacks = {r: summary(f, spec.backward_waits, spec.collective_paths)
                            for r, f in cluster.stacks(view.running()).items()}
            # a rank whose stack shows no cell ended its part; its reply is on the way (a second interrupt can
            # come right behind a release): not stuck
            ended = {r for r, what in stuck_stacks.items() if what == IDLE}
            poll_until(lambda: not ended & set(view.running()), IDLE_REPLY_S)
            obs.stuck = view.running()
            stuck_stacks = {r: what for r, what in stuck_stacks.items() if r in obs.stuck}
            cluster.unfinished.update({r: (future, stuck_stacks.get(r, "still running"))
                                       for r, future in view.futures(obs.stuck).items()})
        self._pump()
        if obs.death is not None:
            d = obs.death
            obs.failures = {r: RankFailure(r, "RankDied", f"the process of rank {r} ended: {d.cause}" if r == d.rank
                                           else f"ended by MPI after rank {d.rank} died") for r in self.ranks}
        elif view.ready():
            obs.failures = view.failures()
            try:
                self.records.refetch(self.ranks)
            except Exception as exc:  # say so rather than hide it
                print(f"jdist: could not check the metric stream for missing records: {exc}", file=sys.stderr)
        else:  # some ranks are stuck: the failures of those that ended are still the root cause
            obs.failures = view.failures()
        self.output.close()
        rebuilt, unusable, states = None, {}, None
        if obs.death is None and obs.stuck and not spec.releases:  # no release will ever come: new processes
            unusable = {r: f"still waiting in a collective, which {spec.name} cannot release" for r in obs.stuck}
        elif obs.death is None and not obs.stuck and (obs.failures or obs.interrupted or obs.released):
            states = guard_states(cluster)  # one round trip for both questions below
            unusable = unusable_ranks(states)
        if not unusable and obs.death is None and (obs.interrupted or obs.released) and not obs.stuck:
            rebuilt = rebuild_group(cluster, states) if self.rebuild else released_where(states)
        outcome = classify(obs)
        self.records.finish(outcome.status.run_status, outcome.error)
        hints = spec.hints_for(f.summary for f in obs.failures.values())
        return CellResult(obs, outcome, run=self.records.run, rebuilt=rebuilt, stuck_stacks=stuck_stacks,
                          watchdog_s=cluster.config.watchdog, grace_s=cluster.config.interrupt_grace,
                          unusable=unusable, hints=hints)


def guard_states(cluster: ClusterSession) -> list[dict[str, Any]] | None:
    """Every rank's guard state after a cell (``RankCall("guard_state")``); None if the ranks could not answer
    (the cell's report says what happened to them)."""
    try:
        return cluster.call("guard_state", timeout=10)
    except Exception:
        return None


def unusable_ranks(states: list[dict[str, Any]] | None) -> dict[int, str]:
    """Ranks whose communication cannot be used again in their process, and why (``--framework tf``
    after a failed collective: :meth:`Backend.unusable <jdist.rank.backends.Backend.unusable>`).

    >>> unusable_ranks([{"unusable": None}, {"unusable": "a collective timed out"}]), unusable_ranks(None)
    ({1: 'a collective timed out'}, {})
    """
    return {r: st["unusable"] for r, st in enumerate(states or []) if st.get("unusable")}


def rebuild_group(cluster: ClusterSession, states: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Re-build the process group on all ranks if a release broke it (by the ranks' guard ``states``); what was
    kept and lost, in the backend's words (``RankCall("rebuild_group")``)."""
    try:
        if states is None:  # they did not answer a moment ago: ask again, for the error's own words
            states = cluster.call("guard_state", timeout=10)
        started = diverged(states)
        if not any(st["broken"] for st in states) and started is None:
            return None
        if started is not None:  # a collective some ranks started (async) and the others never will
            cluster.call("break_group", f"the ranks had started different numbers of collectives ({started})",
                         timeout=10)
        reports = cluster.call("rebuild_group", timeout=cluster.config.timeout + 10)
    except Exception as exc:  # the ranks are not usable: say what to do
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "released_from": {r: rep["released_from"] for r, rep in enumerate(reports) if rep["released_from"]},
        **{key: reports[0][key] for key in ("reattached", "stale", "kept", "lost")},
    }


def diverged(states: list[dict[str, Any]]) -> str | None:
    """The ranks' counts of started collectives on the default group (``t<n>`` markers) where they
    differ, e.g. ``"rank 0: 41, rank 1: 40"``; None where they agree or a rank has none. Ranks that stopped
    outside any collective with different counts left one started on some ranks only (an async
    ``all_reduce``, DDP's bucket reduction, DeepSpeed's prefetch): the next collective would pair with it.

    >>> diverged([{"started": "t41"}, {"started": "t40"}])
    'rank 0: 41, rank 1: 40'
    >>> diverged([{"started": "t41,h3"}, {"started": "t41,h2"}]) is None
    True
    """
    counts = []
    for st in states:
        marker = (st.get("started") or "").split(",")[0]
        if not (marker.startswith("t") and marker[1:].isdigit()):
            return None
        counts.append(int(marker[1:]))
    if len(set(counts)) < 2:
        return None
    return ", ".join(f"rank {r}: {n}" for r, n in enumerate(counts))


def released_where(states: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Where each released rank was waiting (its guard's note in ``states``), without re-building the group
    (``jdist run``: the run ends): ``{"released_from": {rank: where}, "rebuilt": False}``.

    >>> released_where([{"released_from": "all_reduce (cell line 3)"}, {"released_from": None}])
    {'released_from': {0: 'all_reduce (cell line 3)'}, 'rebuilt': False}
    """
    if states is None:
        return None
    where = {r: st["released_from"] for r, st in enumerate(states) if st["released_from"]}
    return {"released_from": where, "rebuilt": False} if where else None


def run_cell(cluster: ClusterSession, code: str, opts: CellOptions, ranks: Sequence[int] | None = None,
             debug_ranks: Sequence[int] | None = None, raw: str | None = None) -> CellResult:
    """Run ``code`` on ``ranks`` (default all) with this cell's options, streaming output and
    metrics until it ends.

    ``opts.output``: ``rank0`` (lowest selected rank, live), ``all`` (every rank, line by line,
    labelled) or ``none``; the run's sinks come from ``opts`` too (:func:`jdist.kernel.sinks.default_sinks`:
    dashboard, run log, trackers). Faults are handled while it waits (see docs/reliability.md).
    A cell that finished and logged nothing is noted in ``cluster.recovery`` (``%dist restart``
    replays it with ``opts``). ``debug_ranks``: where ``breakpoint()`` stops, with a pdb prompt in the
    notebook (:class:`jdist.kernel.debug.hooks.PdbHook`), and where the Debugger panel's breakpoints stop;
    ``raw``: the cell as typed (:class:`jdist.kernel.debug.hooks.DapHook`). Returns a :class:`CellResult`;
    errors are not raised here (:func:`jdist.kernel.supervise.report.raise_for_result`).
    """
    from ..debug.hooks import debug_hooks
    from ..sinks import default_sinks

    result = CellSupervisor(cluster, code, ranks, opts.output, lambda run: default_sinks(run, opts),
                            hooks=debug_hooks(debug_ranks, raw)).run()
    if result.ok and result.run is None:
        cluster.recovery.note_cell(code, list(ranks) if ranks is not None else None, opts)
    return result


def _is_host_load(kind: str, content: Any) -> bool:
    """Whether an inbox item is a host's load sample (sent once a second whatever the cell does)."""
    return kind == "data" and isinstance(content, dict) and content.get("kind") == "host"
