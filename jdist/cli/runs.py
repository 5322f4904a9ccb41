"""``jdist runs`` and ``jdist show``: the run log from a terminal (the folders the sidebar lists).

Every run is there: a ``%%distributed`` cell's and a ``jdist run``'s, finished or still running
(:class:`~jdist.metrics.RunReader` follows a folder being written).

Example::

    $ jdist runs
    $ jdist show 20261125-101500-3f9a1c      # or a unique prefix, or nothing: the newest run
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from jdist.metrics import list_runs, read_run
from jdist.metrics.panels import loss_metric, steps_done


def _age(started: float, now: float) -> str:
    s = max(0, int(now - started))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


def title_of(code: str) -> str:
    """A run's one-line title: the command that started it (a first line ``# $ command``: ``jdist run``,
    or another launcher's ranks writing the run log), else the cell's first line that is not a magic
    or a comment.

    >>> title_of("# $ jdist run -n 2 train.py\\nimport torch")
    'jdist run -n 2 train.py'
    >>> title_of("%%distributed -n 2\\n# set-up\\nmodel = make()")
    'model = make()'
    """
    lines = [line.strip() for line in code.splitlines() if line.strip()]
    if lines and lines[0].startswith("# $ "):
        return lines[0][4:]
    return next((line for line in lines if not line.startswith(("%", "#"))), "")


def find_run(which: str | None, root: str | None) -> Path:
    """The folder of run ``which`` (an id or a unique prefix; None: the newest); ValueError with the fix."""
    runs = list_runs(root)
    if not runs:
        raise ValueError(f"no runs in {root or 'the run log'} yet: a %%distributed cell or jdist run that calls "
                         "jdist.log makes one")
    if which is None:
        return runs[0]
    hits = [p for p in runs if p.name.startswith(which)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise ValueError(f"no run {which!r}; jdist runs lists them")
    raise ValueError(f"{which!r} matches {len(hits)} runs ({', '.join(p.name for p in hits[:3])}...): give more "
                     "of the id")


def list_command(args: Any) -> int:
    """``jdist runs``: the newest runs (``--all``: every one), one line each, or JSON lines."""
    paths = list_runs(args.run_dir)
    if not args.all:
        paths = paths[:args.last]
    now = time.time()
    rows = []
    for path in paths:
        try:
            run = read_run(path)
        except (OSError, ValueError, KeyError) as exc:
            print(f"{path.name}  (unreadable: {exc})", file=sys.stderr)
            continue
        loss = loss_metric(run)
        last = None
        if loss:
            steps, means, _, _ = run.aggregate(loss)
            last = means[-1] if steps else None
        rows.append({"run_id": run.run_id, "status": run.status, "ranks": run.world_size, "backend": run.backend,
                     "steps": steps_done(run), "loss": last, "started": run.started, "title": title_of(run.code),
                     "path": str(path)})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        print("No runs yet (a %%distributed cell or jdist run that calls jdist.log makes one).")
        return 0
    print(f"{'run':<23} {'status':<11} {'ranks':>5} {'steps':>6} {'loss':>9}  {'started':<9}  what")
    for row in rows:
        loss = "" if row["loss"] is None else f"{row['loss']:.4g}"
        print(f"{row['run_id']:<23} {row['status']:<11} {row['ranks']:>5} {row['steps']:>6} {loss:>9}  "
              f"{_age(row['started'], now):<9}  {row['title'][:60]}")
    return 0


def show_command(args: Any) -> int:
    """``jdist show [RUN]``: the run's summary, its error and each rank's state if it failed;
    ``--history``: every record as CSV."""
    path = find_run(args.run, args.run_dir)
    run = read_run(path)
    if args.history:
        run.history.to_csv(sys.stdout, index=False)
        return 0
    print(f"run {run.run_id} ({path})")
    title = title_of(run.code)
    if title:
        print(title)
    print(run.summary())
    errors = path / "errors.json"
    if errors.exists():
        print("ranks:")
        for e in json.loads(errors.read_text()):
            what = e.get("message") or e.get("where") or ""
            print(f"  rank {e['rank']} on {e['host']} (pid {e['pid']}): {e['kind']}" + (f": {what}" if what else ""))
            if e.get("traceback"):
                print("\n".join("    " + line for line in e["traceback"]))
    return 0



def watch_command(args: Any) -> int:
    """``jdist watch [RUN]``: the live view of a run while it is written (a notebook cell's, a
    ``jdist run``'s, another launcher's), until it ends; Ctrl-C stops watching (the run goes on)."""
    from jdist.metrics import RunReader

    from .view import LiveView, PlainView

    path = find_run(args.run, args.run_dir)
    reader = RunReader(path)
    run = reader.update()
    live = args.live if args.live is not None else sys.stdout.isatty()
    view: Any = LiveView(f"jdist watch {run.run_id}") if live else PlainView(every_s=args.every)
    view.start(run)
    seen = -1
    try:
        while run.status == "running":
            time.sleep(0.25)
            run = reader.update()
            if run.count() != seen:
                seen = run.count()
                view.add([rec for batch in reader.new for rec in batch])
            view.tick()
    except KeyboardInterrupt:
        view.finish(run)
        print(f"stopped watching run {run.run_id} (it goes on)", file=sys.stderr)
        return 130
    view.finish(run)
    print(run.summary())
    return 0 if run.status == "finished" else 1


__all__ = ["find_run", "list_command", "show_command", "title_of", "watch_command"]
