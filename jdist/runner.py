"""Client-side execution of one ``%%distributed`` cell: send, stream, collect, report.

Data flows one way: the ipyparallel IO thread hands every IOPub message of the cell
(stdout/stderr, displays, jdist data messages) to a queue; the kernel's main thread
drains it while waiting, prints rank output, feeds records into a
:class:`jdist.metrics.Run` (which the :class:`jdist.dashboard.Dashboard` and the
:class:`jdist.metrics.RunLog` read) and, at the end, checks with the per-rank record
counts that nothing was lost, fetching any missing records from the ranks.
Widgets and displays are only touched from the main thread (ipykernel 7 rule).

Example:
    >>> result = run_cell(cluster, "print(rank)")   # doctest: +SKIP
    >>> result.run is None        # the cell logged nothing   # doctest: +SKIP
    True
"""

from __future__ import annotations

import queue
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import guard
from .cluster import DistributedCluster
from .metrics import Run, RunLog, missing_seqs, new_run_id

#: How long to wait for ranks after an interrupt before telling the user they are stuck.
INTERRUPT_GRACE_S = 10.0
#: After a rank failed, how long the others may go on before they are released.
RELEASE_GRACE_S = 0.25

DEAD_HINT = (
    "The rank processes died (MPI ends the whole job when one rank exits or is killed). "
    "Run %dist restart to start fresh ranks; their variables are lost."
)

_runs: list[Run] = []


def last_run() -> Run | None:
    """The most recent run of this kernel, or None."""
    return _runs[-1] if _runs else None


def all_runs() -> tuple[Run, ...]:
    return tuple(_runs)


class RankError(Exception):
    """One or more ranks raised. Shows the failing ranks and the first failing rank's traceback once."""

    def __init__(self, failed: dict[int, Any], world_size: int, first: int, notes: Sequence[str] = ()):
        self.failed = failed
        self.first = first
        self.notes = list(notes)
        err = failed[first]
        ranks = ", ".join(map(str, sorted(failed)))
        self.headline = (
            f"{len(failed)} of {world_size} rank(s) failed (rank{'s' if len(failed) > 1 else ''} {ranks}); "
            f"first failure on rank {first}: {err.ename}: {err.evalue}"
        )
        super().__init__(self.headline)

    def _render_traceback_(self) -> list[str]:
        err = self.failed[self.first]
        lines = [f"\x1b[0;31mRankError\x1b[0m: {self.headline}", "", f"Traceback from rank {self.first}:"]
        lines += err.render_traceback()
        others = {r: e for r, e in self.failed.items() if r != self.first}
        if others:
            lines.append("")
            lines += [f"rank {r}: {e.ename}: {e.evalue}" for r, e in sorted(others.items())]
        if any(e.ename == "EngineError" for e in self.failed.values()):
            lines += ["", DEAD_HINT]
        return lines + ([""] + self.notes if self.notes else [])


class _Fault(Exception):
    """A fault shown as a few plain lines (no traceback of jdist's own code)."""

    def __init__(self, lines: Sequence[str]):
        self.lines = list(lines)
        super().__init__(self.lines[0])

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self.lines[0]}", *self.lines[1:]]


class RankDied(_Fault):
    """A rank process ended (killed, out of memory, exited): MPI ended the others too."""


class HangError(_Fault):
    """The watchdog saw every running rank wait in a collective without progress."""


@dataclass
class CellResult:
    """What happened to one cell: its run (None if nothing was logged), errors and faults."""

    run: Run | None
    failed: dict[int, Any] = field(default_factory=dict)  # ranks whose own code failed
    first_failed: int | None = None
    interrupted: bool = False  # the user interrupted the kernel
    released: list[int] = field(default_factory=list)  # ranks stopped because of a failure or hang
    hang: dict[int, str] | None = None  # rank -> the collective it waited in
    death: dict[str, Any] | None = None  # {"rank", "cause", "detail"} when rank processes died
    repaired: dict[str, Any] | None = None  # the re-created process group (see _repair_group)
    stuck: list[int] = field(default_factory=list)  # ranks that did not stop
    stuck_stacks: dict[int, str] = field(default_factory=dict)
    ranks: list[int] = field(default_factory=list)  # the ranks the cell ran on
    watchdog_s: float = 0.0
    elapsed_s: float = 0.0


class _Printer:
    """Prints rank output: rank 0 only (live), all ranks labelled line by line, or nothing."""

    def __init__(self, mode: str, ranks: Sequence[int]):
        self.mode = mode
        self.show_rank0_only = mode == "rank0"
        self.first = min(ranks)
        self.partial: dict[tuple[int, str], str] = {}

    def stream(self, rank: int, name: str, text: str) -> None:
        out = sys.stderr if name == "stderr" else sys.stdout
        if self.mode == "none":
            return
        if self.show_rank0_only:
            if rank == self.first:
                out.write(text)
                out.flush()
            return
        buf = self.partial.get((rank, name), "") + text
        *lines, rest = buf.split("\n")
        self.partial[(rank, name)] = rest
        if lines:
            out.write("".join(f"[rank {rank}] {line}\n" for line in lines))
            out.flush()

    def display(self, rank: int, content: dict[str, Any]) -> None:
        if self.mode == "none" or (self.show_rank0_only and rank != self.first):
            return
        from IPython.display import publish_display_data

        if not self.show_rank0_only:
            sys.stdout.write(f"[rank {rank}] display:\n")
        publish_display_data(content.get("data", {}), content.get("metadata", {}))

    def close(self) -> None:
        for (rank, name), rest in sorted(self.partial.items()):
            if rest:
                (sys.stderr if name == "stderr" else sys.stdout).write(f"[rank {rank}] {rest}\n")
        self.partial.clear()


class _Collector:
    """Turns queued IOPub messages into output, records and the live dashboard (main thread)."""

    def __init__(self, cluster: DistributedCluster, code: str, printer: _Printer,
                 dashboard: bool, run_dir: str | None):
        self.cluster = cluster
        self.code = code
        self.printer = printer
        self.want_dashboard = dashboard
        self.run_dir = run_dir
        self.run: Run | None = None
        self.log: RunLog | None = None
        self.board: Any = None
        self.cells: dict[int, int] = {}  # rank -> cell id on the rank
        self.done: dict[int, int] = {}  # rank -> record count reported at cell end
        self.seqs: dict[int, set[int]] = {}

    def _ensure_run(self) -> Run:
        if self.run is None:
            cfg = self.cluster.config
            self.run = Run(
                run_id=new_run_id(),
                world_size=cfg.n,
                backend=cfg.backend,
                device_kind="cuda" if cfg.gpus else "cpu",
                code=self.code,
                cluster_id=self.cluster.cluster_id,
            )
            _runs.append(self.run)
            self.log = RunLog(self.run, self.run_dir)
            if self.want_dashboard:
                from .dashboard import Dashboard

                self.board = Dashboard(self.run)
                self.board.show()
        return self.run

    def handle(self, rank: int, msg_type: str, content: Any) -> None:
        if msg_type == "stream":
            self.printer.stream(rank, content["name"], content["text"])
        elif msg_type in ("display_data", "execute_result"):
            self.printer.display(rank, content)
        elif msg_type == "data":
            self._data(rank, content)

    def _data(self, rank: int, payload: Any) -> None:
        if not isinstance(payload, dict) or "cell" not in payload:
            return  # not a jdist.rank message (someone else published under our key)
        self.cells[rank] = payload["cell"]
        if rank == 0 and "checkpoint_every" in payload:
            self.cluster.checkpoint = dict(payload["checkpoint_every"])
        if rank == 0 and "checkpoint_saved" in payload:
            self.cluster.checkpoint["latest"] = payload["checkpoint_saved"]
        if payload.get("total_steps") is not None or payload.get("records"):
            run = self._ensure_run()
            if payload.get("total_steps") is not None:
                run.total_steps = payload["total_steps"]
            self._add(payload.get("records") or [])
        if "done" in payload:
            self.done[rank] = payload["done"]

    def _add(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        run = self._ensure_run()
        for rec in records:
            self.seqs.setdefault(rec["rank"], set()).add(rec["seq"])
        new = run.add(records)
        assert self.log is not None
        self.log.append(new)

    def tick(self) -> None:
        if self.board is not None:
            self.board.update()

    def repair(self, ranks: Sequence[int]) -> int:
        """Fetch records the stream missed, using each rank's final count. Returns how many.

        A rank whose end-of-cell message was not seen (it can come before the IOPub
        callbacks are attached, for a very short cell) is asked for its count directly.
        """
        from . import rank as rank_runtime

        unknown = [r for r in ranks if r not in self.done]
        if unknown:
            for rank, (cell, count) in zip(unknown, self.cluster.apply(rank_runtime.cell_count, ranks=unknown, timeout=10)):
                self.cells[rank], self.done[rank] = cell, count
        fetched = 0
        for rank, count in self.done.items():
            missing = missing_seqs(self.seqs.get(rank, ()), count)
            if missing:
                recs = self.cluster.apply(rank_runtime.records, self.cells[rank], missing, ranks=[rank])[0]
                self._add(recs)
                fetched += len(recs)
                if len(recs) < len(missing):
                    print(
                        f"jdist: {len(missing) - len(recs)} of {count} records of rank {rank} were lost in transport "
                        "and are no longer kept on the rank (it keeps the first "
                        f"{rank_runtime.KEEP_FIRST} and the last {rank_runtime.KEEP_LAST} of a cell).",
                        file=sys.stderr,
                    )
        return fetched

    def finish(self, status: str, error: str | None) -> None:
        if self.run is None:
            return
        self.run.ended = time.time()
        self.run.status = status
        self.run.error = error
        if self.log is not None:
            self.log.close()
        if self.board is not None:
            self.board.finish()


def run_cell(
    cluster: DistributedCluster,
    code: str,
    ranks: Sequence[int] | None = None,
    output: str = "rank0",
    dashboard: bool = True,
    run_dir: str | None = None,
    poll_s: float = 0.05,
) -> CellResult:
    """Run ``code`` on ``ranks`` (default all), streaming output and metrics until it ends.

    ``output``: ``rank0`` (lowest selected rank, live), ``all`` (every rank, line by line,
    labelled) or ``none``. Faults are handled while it waits (see docs/reliability.md):

    * a KeyboardInterrupt in the kernel (Kernel -> Interrupt) is forwarded to the ranks
      as SIGINT; ranks blocked in a collective are released by :mod:`jdist.guard`;
    * when a rank fails while others still run, those are released after
      ``RELEASE_GRACE_S`` (they would wait for the failed rank in the next collective);
    * when nothing progressed for ``cluster.config.watchdog`` seconds and every running
      rank waits in a collective, the cell is a hang: the ranks' stacks are shown and
      the ranks released;
    * a rank process that dies ends the cell at once, naming the rank and the cause.

    A process group broken by a release is re-created on all ranks before returning.
    Returns a :class:`CellResult`; errors are not raised here (see :func:`raise_for_result`).
    """
    from .cluster import oom_kills

    t0 = time.perf_counter()
    targets = cluster.engine_ids(ranks)
    selected = [cluster.rank_of_engine(e) for e in targets]
    inbox: queue.SimpleQueue[tuple[int, str, Any]] = queue.SimpleQueue()
    oom_before = oom_kills()
    ar = cluster.execute(code, selected)
    _attach(ar, cluster, inbox)
    collector = _Collector(cluster, code, _Printer(output, selected), dashboard, run_dir)
    result = CellResult(None, ranks=selected, watchdog_s=cluster.config.watchdog)
    watchdog = cluster.config.watchdog
    last_progress = time.monotonic()
    done_count = 0
    failed_at: float | None = None
    deadline: float | None = None

    def drain() -> bool:
        got = False
        while True:
            try:
                collector.handle(*inbox.get_nowait())
                got = True
            except queue.Empty:
                return got

    def running() -> list[int]:
        return [r for r, c in zip(selected, ar._children) if not c.done()]

    def release() -> None:
        nonlocal deadline
        result.released = running()
        cluster.interrupt(result.released)
        deadline = time.monotonic() + INTERRUPT_GRACE_S

    while not ar.ready():
        try:
            ar.wait(poll_s)
            now = time.monotonic()
            if drain():
                last_progress = now
            collector.tick()
            done = sum(c.done() for c in ar._children)
            if done != done_count:
                done_count, last_progress = done, now
            dead = cluster.dead_ranks()
            if dead:
                result.death = cluster.death_report(dead, oom_before)
                break
            if deadline is None and failed_at is None and _partial_failure(ar, selected):
                failed_at = now
            if deadline is None and failed_at is not None and now - failed_at >= RELEASE_GRACE_S:
                release()
            if deadline is None and watchdog and now - last_progress >= watchdog:
                waiting = _waiting_ranks(cluster, running())
                if waiting is not None:
                    result.hang = waiting
                    release()
                last_progress = now
        except KeyboardInterrupt:
            if not result.interrupted:
                result.interrupted = True
                cluster.interrupt(selected)
                deadline = time.monotonic() + INTERRUPT_GRACE_S
        if deadline is not None and time.monotonic() > deadline and not ar.ready():
            break
    if result.death is None and ar.ready():
        ar.wait_for_output(timeout=5)
    elif result.death is None:
        result.stuck = running()
        result.stuck_stacks = {r: guard.summary(f, cluster.config.backend == "ddp") for r, f in cluster.stacks(result.stuck).items()}
    drain()
    failed, completed = _failures(ar, selected) if ar.ready() else ({}, {})
    if result.death is not None:
        failed = {r: _died(r, result.death) for r in selected}
    elif ar.ready():
        try:
            collector.repair(selected)
        except Exception as exc:  # say so rather than hide it
            print(f"jdist: could not check the metric stream for missing records: {exc}", file=sys.stderr)
    collector.printer.close()
    if result.death is None and (result.interrupted or result.released) and not result.stuck:
        result.repaired = _repair_group(cluster)

    released = {r for r in result.released if r in failed}
    origin = {r: e for r, e in failed.items() if r not in released}
    user_interrupt = result.interrupted or (
        bool(failed) and not result.released and all(e.ename == "KeyboardInterrupt" for e in failed.values())
    )
    result.interrupted = user_interrupt
    result.failed = origin if origin else ({} if user_interrupt else failed)
    if result.hang is not None and not origin:
        result.failed = {}
    status = "interrupted" if user_interrupt else ("failed" if failed or result.hang else "finished")
    result.first_failed = _first_failure(result.failed, completed) if result.failed else None
    error = None
    if result.death is not None:
        error = f"rank {result.death['rank']} died: {result.death['cause']}"
    elif result.hang is not None:
        error = "hang: " + "; ".join(f"rank {r}: {w}" for r, w in sorted(result.hang.items()))
    elif result.first_failed is not None:
        e = result.failed[result.first_failed]
        error = f"rank {result.first_failed}: {e.ename}: {e.evalue}"
    collector.finish(status, error)
    result.run = collector.run
    result.elapsed_s = time.perf_counter() - t0
    return result


def _died(rank: int, death: dict[str, Any]) -> Any:
    from ipyparallel.error import RemoteError

    if rank == death["rank"]:
        return RemoteError("RankDied", f"the process of rank {rank} ended: {death['cause']}", "")
    return RemoteError("RankDied", f"ended by MPI after rank {death['rank']} died", "")


def _partial_failure(ar: Any, selected: Sequence[int]) -> bool:
    """Some ranks failed while others still run (they may wait for them in a collective)."""
    failed = any(c.done() and md.get("status") == "error" for c, md in zip(ar._children, ar.metadata))
    return failed and not all(c.done() for c in ar._children)


def _waiting_ranks(cluster: DistributedCluster, running: list[int]) -> dict[int, str] | None:
    """``{rank: "all_reduce (cell line 3)"}`` if every running rank waits in a collective, else None."""
    if not running:
        return None
    ddp = cluster.config.backend == "ddp"
    waiting = {r: guard.describe(frames, ddp) for r, frames in cluster.stacks(running).items()}
    if not all(waiting.values()):
        return None
    return {r: w for r, w in waiting.items() if w}


def _repair_group(cluster: DistributedCluster) -> dict[str, Any] | None:
    """Re-create the process group on all ranks if a release broke it; what was kept."""
    from . import rank as rank_runtime

    try:
        states = cluster.apply(guard.state, timeout=10)
        if not any(st["broken"] for st in states):
            return None
        reports = cluster.apply(rank_runtime.repair_group, timeout=cluster.config.timeout + 10)
    except Exception as exc:  # the ranks are not usable: say what to do
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "released_from": {r: rep["released_from"] for r, rep in enumerate(reports) if rep["released_from"]},
        "reattached": reports[0]["reattached"],
        "stale": reports[0]["stale"],
    }


def _attach(ar: Any, cluster: DistributedCluster, inbox: "queue.SimpleQueue[tuple[int, str, Any]]") -> None:
    """Register IOPub callbacks (run in ipyparallel's IO thread: only enqueue there)."""
    from ipyparallel import serialize

    from .rank import DATA_KEY

    for eid, future in zip(ar._targets, ar._children):
        rank = cluster.rank_of_engine(eid)

        def callback(msg: dict[str, Any], rank: int = rank) -> None:
            kind = msg["header"]["msg_type"]
            if kind == "data_message":
                data, _ = serialize.deserialize_object(msg["buffers"])
                if DATA_KEY in data:
                    inbox.put((rank, "data", data[DATA_KEY]))
            elif kind in ("stream", "display_data", "execute_result"):
                inbox.put((rank, kind, msg["content"]))

        future.iopub_callbacks.append(callback)
        # Output that arrived before the callback was registered is already in the metadata.
        md = future.output.metadata
        for name in ("stdout", "stderr"):
            if md[name]:
                inbox.put((rank, "stream", {"name": name, "text": md[name]}))


def _failures(ar: Any, selected: Sequence[int]) -> tuple[dict[int, Any], dict[int, Any]]:
    """Per rank: the RemoteError of a failed rank (engine death included), and completion times."""
    from ipyparallel.error import RemoteError

    failed: dict[int, Any] = {}
    completed: dict[int, Any] = {}
    for rank, child, md in zip(selected, ar._children, ar.metadata):
        completed[rank] = md.get("completed")
        err = md.get("error")
        if err is None and child.exception() is not None:
            exc = child.exception()
            err = exc if isinstance(exc, RemoteError) else RemoteError(type(exc).__name__, str(exc), "")
        if err is None and isinstance(child.result(), RemoteError):
            err = child.result()  # a dead engine's "result" (EngineError)
        if err is None and md.get("status") == "error":
            err = RemoteError("UnknownError", "the rank reported an error without details", "")
        if err is not None:
            failed[rank] = err
    return failed, completed


def _first_failure(failed: dict[int, Any], completed: dict[int, Any]) -> int:
    """The rank whose error completed first (the origin; others often fail because of it)."""
    return min(failed, key=lambda r: (completed.get(r) is None, completed.get(r) or 0, r))


def fault_notes(result: CellResult) -> list[str]:
    """What was done about released or stuck ranks and what was kept, as lines for the user."""
    lines = []
    rep = result.repaired or {}
    where = rep.get("released_from", {})
    if result.released:
        why = "of the hang" if result.hang is not None else (
            f"rank {result.first_failed} failed" if result.first_failed is not None else "of the interrupt")
        for r in result.released:
            how = f"it was waiting in {where[r]}" if r in where else "stopped with KeyboardInterrupt"
            lines.append(f"rank {r}: released because {why} ({how}).")
    if "error" in rep:
        lines.append(f"The process group could not be re-created ({rep['error']}): run %dist restart.")
    elif result.repaired:
        text = "The process group was re-created on all ranks; variables on the ranks are kept"
        if rep["reattached"]:
            text += f", and DDP model(s) {', '.join(rep['reattached'])} now use the new group"
        lines.append(text + ".")
        if rep["stale"]:
            lines.append(
                f"Not kept: FSDP model(s) {', '.join(rep['stale'])} hold the old group; prepare them again "
                "(e.g. from jdist.latest_checkpoint), or %dist restart."
            )
    if result.stuck:
        lines.append(f"rank(s) {', '.join(map(str, result.stuck))} did not stop within {INTERRUPT_GRACE_S:.0f} s:")
        lines += [f"  rank {r}: {what}" for r, what in sorted(result.stuck_stacks.items())]
        lines.append("Run %dist restart to get the ranks back (their variables are lost; %dist stacks shows where they are).")
    return lines


def raise_for_result(result: CellResult, world_size: int, notes: Sequence[str] = ()) -> None:
    """Raise one concise error for a failed, hung, dead or interrupted cell (nothing if it finished).

    :class:`RankDied`, :class:`HangError`, :class:`RankError` or KeyboardInterrupt;
    ``notes``: extra lines (e.g. what an automatic restart did).
    """
    extra = fault_notes(result) + list(notes)
    if result.death is not None:
        d = result.death
        raise RankDied([
            f"rank {d['rank']} died: {d['cause']}. MPI ended the other rank(s) too "
            f"(detected after {result.elapsed_s:.1f} s).",
            *(extra or ["Run %dist restart to start fresh ranks: it replays the set-up cells and restores the "
                        "newest checkpoint of jdist.checkpoint_every, if there is one; other variables are lost."]),
        ])
    if result.hang is not None and not result.failed:
        finished = [r for r in result.ranks if r not in result.hang]
        lines = [f"hang: no progress for {result.watchdog_s:g} s and every running rank waits in a collective "
                 "(--watchdog).", *[f"  rank {r}: waiting in {w}" for r, w in sorted(result.hang.items())]]
        lines += [f"  rank {r}: finished the cell (it never called the matching collective)" for r in finished]
        raise HangError(lines + extra)
    if result.interrupted:
        msg = "Interrupted: every rank received SIGINT"
        msg += "." if result.stuck else " and stopped; variables on the ranks are kept."
        print("\n".join([msg, *extra]), file=sys.stderr)
        raise KeyboardInterrupt(msg)
    if result.failed:
        assert result.first_failed is not None
        raise RankError(result.failed, world_size, result.first_failed, extra)
