"""The terminal view of a run: what ``jdist run`` (and ``jdist watch``) show while the ranks work.

On a terminal, a live panel (rich) under the scrolling rank output: progress with ETA, the loss
mean with the range across ranks, and per rank its step, step time, communication share (with device
meshes, each dimension's communication; in a pipeline, its stage and bubble) and memory, the slowest rank marked (the dashboard's rule: :func:`jdist.metrics.panels.slowest_ranks`, against
the median). When stdout is not a terminal (an ``sbatch`` log, CI), rich
would print only the last frame, so one plain :func:`status_line` goes out every ``every_s``
seconds instead. Both read only the :class:`~jdist.metrics.Run` (O(ranks) per refresh).

Example:
    >>> from jdist.metrics import Run
    >>> run = Run("r1", 2, total_steps=10)
    >>> _ = run.add([{"rank": r, "seq": s, "step": s, "loss": 1.0 - 0.1 * s + 0.02 * r, "time": 100.0 + s,
    ...               "step_time_s": 0.02 + 0.01 * r, "comm_time_s": 0.005} for s in range(4) for r in (0, 1)])
    >>> status_line(run)
    'step 4/10 (40%) loss 0.71 (0.7..0.72) 25.0 ms/step comm 21% slowest r1 (+20%) ETA 6 s'
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from jdist.metrics import Run
from jdist.metrics.panels import RECENT_STEPS, eta_s, loss_metric, slowest_ranks, steps_done
from jdist.metrics.stats import mean_min_max
from jdist.protocol import Record


def _num(x: float) -> str:
    return f"{x:.4g}"


def _duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def rank_rows(run: Run) -> list[dict[str, Any]]:
    """Per rank: its latest step and loss, recent step and communication time (s), the communication's share of
    the timed steps (:meth:`~jdist.metrics.Run.comm_share`), memory, and
    whether it is the slowest (a named straggler, :attr:`jdist.metrics.Run.stragglers`, with its cause in
    ``straggler``; else :func:`~jdist.metrics.panels.slowest_ranks`; only with more than one rank); with
    device meshes each dimension's recent communication time (``dims``), in a pipeline the rank's stage and
    recent bubble."""
    step = run.per_rank_mean("step_time_s", last=RECENT_STEPS, skip_first=True)
    comm = run.per_rank_mean("comm_time_s", last=RECENT_STEPS, skip_first=True)
    dims = {d: run.per_rank_mean(f"comm_time_{d}_s", last=RECENT_STEPS, skip_first=True) for d in run.comm_dims}
    bubble = run.per_rank_mean("bubble_frac", last=RECENT_STEPS, skip_first=True)
    share = run.comm_share(last=RECENT_STEPS, skip_first=True)
    loss = loss_metric(run)
    rows = []
    for r in run.ranks:
        rec = run.latest(r) or {}
        rows.append({"rank": r, "host": run.hosts.get(r, ""), "step": rec.get("step"),
                     "loss": rec.get(loss) if loss else None, "step_s": step.get(r), "comm_s": comm.get(r),
                     "comm_share": share.get(r), "mem": rec.get("mem_bytes"), "slowest": False,
                     "dims": {d: per.get(r) for d, per in dims.items()}, "stage": rec.get("pp_stage"),
                     "bubble": bubble.get(r)})
    named = {s.rank: s.cause for s in run.stragglers}  # (named stragglers: their own work, not the step, is long)
    slow = slowest_ranks(run, 1) if len(step) > 1 and not named else []
    for row in rows:
        row["slowest"] = row["rank"] in named if named else bool(slow) and row["rank"] == slow[0][0]
        row["straggler"] = named.get(row["rank"])
    return rows


def status_line(run: Run) -> str:
    """One line of the run's state (the plain view's periodic line; see the module example)."""
    parts = []
    done = steps_done(run)
    if run.total_steps:
        parts.append(f"step {done}/{run.total_steps} ({100 * done // run.total_steps}%)")
    elif run.max_step() is not None:
        parts.append(f"step {done}")
    else:
        parts.append(f"{run.count()} records")
    loss = loss_metric(run)
    if loss:
        steps, means, lows, highs = run.aggregate(loss)
        if steps:
            parts.append(f"{loss} {_num(means[-1])} ({_num(lows[-1])}..{_num(highs[-1])})")
    rows = [row for row in rank_rows(run) if row["step_s"]]
    if rows:
        mean_step, _, _ = mean_min_max(row["step_s"] for row in rows)
        parts.append(f"{1000 * mean_step:.1f} ms/step")
        comm = [row["comm_share"] for row in rows if row["comm_share"] is not None]
        if comm:
            parts.append(f"comm {100 * sum(comm) / len(comm):.0f}%")
        bubble = [row["bubble"] for row in rows if row["bubble"] is not None]
        if bubble:
            parts.append(f"bubble {sum(bubble) / len(bubble):.2f}")
        slow = slowest_ranks(run, 1) if len(rows) > 1 else []
        if run.stragglers:
            parts.append("straggler " + ", ".join(f"r{s.rank} ({s.cause})" for s in run.stragglers))
        elif slow and slow[0][3] > 1.05:  # more than 5 % above the ranks' median
            parts.append(f"slowest r{slow[0][0]} (+{100 * (slow[0][3] - 1):.0f}%)")
    eta = eta_s(run)
    if eta is not None:
        parts.append(f"ETA {_duration(eta)}")
    return " ".join(parts)


class PlainView:
    """A :class:`jdist.kernel.sinks.RecordSink` printing :func:`status_line` every ``every_s``
    seconds (only when new records came) to ``out``."""

    def __init__(self, out: IO[str] | None = None, every_s: float = 10.0):
        self.out = out or sys.stdout
        self.every_s = every_s
        self.run: Run | None = None
        self._last = time.monotonic()
        self._new = False

    def start(self, run: Run) -> None:
        self.run = run

    def add(self, records: list[Record]) -> None:
        self._new = self._new or bool(records)

    def tick(self) -> None:
        now = time.monotonic()
        if self.run is not None and self._new and now - self._last >= self.every_s:
            self._last, self._new = now, False
            self.out.write(f"[jdist] {status_line(self.run)}\n")
            self.out.flush()

    def finish(self, run: Run) -> None:
        pass


class LiveView:
    """The rich live panel on a terminal (a :class:`jdist.kernel.sinks.RecordSink`): rank output
    scrolls above it (rich redirects stdout and stderr while it is shown), refreshed 4 times a second."""

    def __init__(self, title: str):
        from rich.console import Console

        self.title = title
        self.console = Console()
        self.run: Run | None = None
        self.live: Any = None

    def start(self, run: Run) -> None:
        from rich.live import Live

        self.run = run
        self.live = Live(self.render(), console=self.console, refresh_per_second=4, transient=True,
                         redirect_stdout=True, redirect_stderr=True)
        self.live.start()

    def add(self, records: list[Record]) -> None:
        pass

    def tick(self) -> None:
        if self.live is not None:
            self.live.update(self.render())

    def finish(self, run: Run) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def render(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        run = self.run
        assert run is not None
        head = Text.assemble((f"{self.title}", "bold"), f"  run {run.run_id}  {run.world_size} rank(s), "
                             f"{run.backend}  ", (status_line(run), "cyan"))
        parts: list[Any] = [head]
        if run.total_steps:
            parts.append(ProgressBar(total=run.total_steps, completed=steps_done(run), width=60))
        table = Table(box=None, pad_edge=False, header_style="bold")
        multi_host = bool(run.hosts)
        dims = run.comm_dims
        pipeline = run.has("bubble_frac")
        for col in ("rank", *(("host",) if multi_host else ()), "step", "loss", "ms/step", "comm",
                    *(f"{d} ms" for d in dims), *(("stage", "bubble") if pipeline else ()), "memory"):
            table.add_column(col, justify="left" if col == "host" else "right")
        for row in rank_rows(run):
            cells = [str(row["rank"]), *((row["host"],) if multi_host else ()),
                     "" if row["step"] is None else str(row["step"]),
                     "" if row["loss"] is None else _num(row["loss"]),
                     "" if row["step_s"] is None else f"{1000 * row['step_s']:.1f}",
                     "" if row["comm_share"] is None else f"{100 * row['comm_share']:.0f}%",
                     *("" if row["dims"].get(d) is None else f"{1000 * row['dims'][d]:.1f}" for d in dims),
                     *(("" if row["stage"] is None else str(row["stage"]),
                        "" if row["bubble"] is None else f"{row['bubble']:.2f}") if pipeline else ()),
                     "" if row["mem"] is None else _bytes(row["mem"])]
            table.add_row(*cells, style="red" if row["slowest"] else None)
        parts.append(table)
        return Group(*parts)


__all__ = ["LiveView", "PlainView", "rank_rows", "status_line"]
