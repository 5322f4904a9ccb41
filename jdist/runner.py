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

from .cluster import DistributedCluster
from .metrics import Run, RunLog, missing_seqs, new_run_id

#: How long to wait for ranks after an interrupt before telling the user they are stuck.
INTERRUPT_GRACE_S = 10.0

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

    def __init__(self, failed: dict[int, Any], world_size: int, first: int):
        self.failed = failed
        self.first = first
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
        return lines


@dataclass
class CellResult:
    """What happened to one cell: its run (None if nothing was logged), errors, interruption."""

    run: Run | None
    failed: dict[int, Any] = field(default_factory=dict)
    first_failed: int | None = None
    interrupted: bool = False
    stuck: list[int] = field(default_factory=list)
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
    labelled) or ``none``. A KeyboardInterrupt in the kernel (Kernel -> Interrupt) is
    forwarded to the ranks as SIGINT. Returns a :class:`CellResult`; errors are not raised
    here (see :func:`raise_for_result`).
    """
    t0 = time.perf_counter()
    targets = cluster.engine_ids(ranks)
    selected = [cluster.rank_of_engine(e) for e in targets]
    inbox: queue.SimpleQueue[tuple[int, str, Any]] = queue.SimpleQueue()
    ar = cluster.execute(code, selected)
    _attach(ar, cluster, inbox)
    collector = _Collector(cluster, code, _Printer(output, selected), dashboard, run_dir)

    def drain() -> None:
        while True:
            try:
                collector.handle(*inbox.get_nowait())
            except queue.Empty:
                return

    interrupted = False
    deadline: float | None = None
    warned = False
    while not ar.ready():
        try:
            ar.wait(poll_s)
            drain()
            collector.tick()
            if not warned:
                warned = _warn_partial_failure(ar, selected, cluster.config.timeout)
        except KeyboardInterrupt:
            if not interrupted:
                interrupted = True
                cluster.interrupt(selected)
                deadline = time.monotonic() + INTERRUPT_GRACE_S
        if deadline is not None and time.monotonic() > deadline and not ar.ready():
            break
    stuck: list[int] = []
    if ar.ready():
        ar.wait_for_output(timeout=5)
    else:
        stuck = [r for r, c in zip(selected, ar._children) if not c.done()]
    drain()
    failed, completed = _failures(ar, selected) if ar.ready() else ({}, {})
    dead = [r for r, e in failed.items() if e.ename == "EngineError"]
    if ar.ready() and not dead:
        try:
            collector.repair(selected)
        except Exception as exc:  # say so rather than hide it
            print(f"jdist: could not check the metric stream for missing records: {exc}", file=sys.stderr)
    collector.printer.close()

    interrupted = interrupted or any(e.ename == "KeyboardInterrupt" for e in failed.values())
    status = "interrupted" if interrupted else ("failed" if failed else "finished")
    first = _first_failure(failed, completed) if failed else None
    error = f"rank {first}: {failed[first].ename}: {failed[first].evalue}" if first is not None else None
    collector.finish(status, error)
    return CellResult(collector.run, failed, first, interrupted, stuck, time.perf_counter() - t0)


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


def _warn_partial_failure(ar: Any, selected: Sequence[int], timeout: float) -> bool:
    """Say so at once when some ranks failed while others still run (they may wait in a collective)."""
    failed = [r for r, c, md in zip(selected, ar._children, ar.metadata) if c.done() and md.get("status") == "error"]
    running = [r for r, c in zip(selected, ar._children) if not c.done()]
    if not failed or not running:
        return False
    print(
        f"jdist: rank(s) {', '.join(map(str, failed))} failed; rank(s) {', '.join(map(str, running))} still running. "
        f"If they wait in a collective, they fail after the {timeout:g} s process-group timeout "
        "(--timeout); interrupt the kernel to stop them now.",
        file=sys.stderr,
        flush=True,
    )
    return True


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


def raise_for_result(result: CellResult, world_size: int) -> None:
    """Raise :class:`RankError` (one concise error) or KeyboardInterrupt for a failed/interrupted cell."""
    if result.interrupted:
        msg = "Interrupted: every rank received SIGINT"
        if result.stuck:
            msg += (
                f"; rank(s) {', '.join(map(str, result.stuck))} did not stop within {INTERRUPT_GRACE_S:.0f} s "
                "(blocked in a collective?). Run %dist restart to get the ranks back (their state is lost)."
            )
        else:
            msg += " and stopped; variables on the ranks are kept."
        print(msg, file=sys.stderr)
        raise KeyboardInterrupt(msg)
    if result.failed:
        assert result.first_failed is not None
        raise RankError(result.failed, world_size, result.first_failed)
