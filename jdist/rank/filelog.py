"""``jdist.log`` under other launchers (torchrun, ``srun python``, ``accelerate launch``, plain
``mpiexec``): each rank writes its records into a run folder of the run log, so those runs show in
``jdist runs``/``jdist show`` and the JupyterLab sidebar too. There is no jdist cluster: no
attach, no fault handling, no release of blocked ranks; the automatic metrics are there (step
time, memory, samples/s), communication time only for models prepared by jdist (which needs a
jdist cluster), so it reads 0.

The first ``jdist.log`` in a process that a launcher started (:func:`launched_rank` reads its
environment) opens a :class:`~jdist.rank.session.RankSession` whose channel is a
:class:`FileChannel`: rank r appends its records to ``metrics.r<r>.jsonl``, rank 0 also writes
``meta.json`` (status ``running``, then ``finished``, or ``failed`` with the error when the script
raised). The folder is ``$JDIST_RUN_DIR/<run id>``; every rank must name the same one, so the run
id comes from what the launcher gives all of them: ``JDIST_RUN_ID`` (set it yourself, e.g. for
torchrun on several nodes), else torchrun's ``TORCHELASTIC_RUN_ID`` or Slurm's job and step id,
each with the launch time of the rank's parent process (the launcher); else the parent process
alone (one host).

Example (what a rank of ``torchrun --nproc-per-node 2`` finds):
    >>> launched_rank({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "abc"})
    {'rank': 1, 'world_size': 2, 'local_rank': 1, 'launcher': 'torchrun'}
    >>> launched_rank({}) is None
    True
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import socket
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any, Callable, Mapping

from jdist.protocol import DataMessage

#: Environment variables that give (rank, world size, local rank), per launcher, first match wins.
LAUNCHERS: tuple[tuple[str, str, str, str], ...] = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("mpiexec", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


def launched_rank(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """This process's rank, world size and local rank as its launcher set them, or None (not
    started by a launcher jdist knows; Slurm's only inside a job step, ``srun``)."""
    env = os.environ if env is None else env
    for name, rank, size, local in LAUNCHERS:
        if rank in env and size in env and (name != "srun" or "SLURM_STEP_ID" in env):
            try:
                values = int(env[rank]), int(env[size]), int(env.get(local, env[rank]))
            except ValueError:
                continue
            if name == "torchrun" and "TORCHELASTIC_RUN_ID" not in env and "ACCELERATE_MIXED_PRECISION" in env:
                name = "accelerate"
            return {"rank": values[0], "world_size": values[1], "local_rank": values[2], "launcher": name}
    return None


def _parent_started() -> float:
    """When this process's parent (the launcher, or its agent on this host) started."""
    try:
        import psutil

        return psutil.Process(os.getppid()).create_time()
    except Exception:
        return time.time()


def run_id(env: Mapping[str, str] | None = None) -> str:
    """The run folder's name, the same on every rank of one launch (see the module doc).

    >>> run_id({"JDIST_RUN_ID": "my-run"})
    'my-run'
    """
    env = os.environ if env is None else env
    if env.get("JDIST_RUN_ID"):
        return env["JDIST_RUN_ID"]
    if env.get("TORCHELASTIC_RUN_ID"):
        key = f"torchrun {env['TORCHELASTIC_RUN_ID']}"
    elif env.get("SLURM_JOB_ID") and "SLURM_STEP_ID" in env:
        key = f"slurm {env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    else:
        key = f"ppid {os.getppid()}"
    started = _parent_started()
    digest = hashlib.sha1(f"{key} {started:.2f}".encode()).hexdigest()[:6]
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(started)) + "-" + digest


class FileChannel:
    """A rank's messages into its run folder: records appended to ``metrics.r<rank>.jsonl`` (flushed
    with each batch), its host's load to ``hosts.r<rank>.jsonl`` (the host's lowest rank); rank 0
    keeps ``meta.json`` (:class:`jdist.metrics.Run`'s meta) up to date."""

    def __init__(self, path: Path, rank: int, meta: Any = None):
        self.path = path
        self.rank = rank
        self.meta = meta  # rank 0: the run (for meta.json); else None
        path.mkdir(parents=True, exist_ok=True)
        self._fh = open(path / f"metrics.r{rank}.jsonl", "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._encode = json.JSONEncoder(default=float).encode
        self._side: dict[str, Any] = {}  # hosts.r<rank>.jsonl, pipeline.r<rank>.jsonl: opened with their first line
        if meta is not None:
            self.write_meta()

    def publish(self, message: DataMessage) -> None:
        kind = message["kind"]
        if kind in ("records", "cell_end"):
            lines = [self._encode(rec) + "\n" for rec in message["records"]]  # type: ignore[typeddict-item]
            with self._lock:
                if not self._fh.closed:
                    self._fh.writelines(lines)
                    self._fh.flush()
        if kind in ("host", "pipeline"):  # the host's load (jdist.rank.hostload); pipeline actions
            name = f"{'hosts' if kind == 'host' else 'pipeline'}.r{self.rank}.jsonl"
            with self._lock:
                fh = self._side.get(name)
                if fh is None:
                    fh = self._side[name] = open(self.path / name, "a", encoding="utf-8")
                fh.write(self._encode(message) + "\n")
                fh.flush()
        if kind in ("progress", "cell_end") and self.meta is not None:
            total = message.get("total_steps")
            if total is not None:
                self.meta.total_steps = total
                self.write_meta()

    def write_meta(self) -> None:
        write_meta(self.path, self.meta)

    def close(self) -> None:
        with self._lock:
            self._fh.close()
            for fh in self._side.values():
                fh.close()


def end_run(path: Path, run: Any, rank: int, error: str | None) -> None:
    """Write the end of the run: rank 0 sets ``meta.json`` to finished (or failed with its own
    ``error``); any rank that failed writes ``failed.r<rank>.json``, which readers take over a
    "finished" (:class:`jdist.metrics.RunReader`): its launcher may have ended rank 0 first, or
    rank 0 may end after it."""
    now = time.time()
    if error is not None:
        (path / f"failed.r{rank}.json").write_text(json.dumps({"rank": rank, "error": error, "time": now}))
    if rank == 0:
        run.status, run.error = ("failed", error) if error else ("finished", None)
        run.ended = now
        write_meta(path, run)


def write_meta(path: Path, run: Any) -> None:
    """``meta.json`` from ``run`` (a :class:`jdist.metrics.Run`), replaced whole: readers never see half."""
    tmp = path / "meta.json.tmp"
    tmp.write_text(json.dumps(run.meta(), indent=1))
    tmp.replace(path / "meta.json")


def current_device() -> Any:
    """The CUDA device this process already uses, else CPU (``torch.device("cpu")``'s fields, without
    importing torch): for a session opened in a process another launcher started."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return types.SimpleNamespace(type="cpu", index=None)


def open_session(make: Callable[[Any, FileChannel], Any]) -> Any:
    """A session writing to the run log (``make(ctx, channel)``: a
    :class:`~jdist.rank.session.RankSession` without a backend), if a launcher started this process
    (:func:`launched_rank`); else None. Closed at exit: the last records, then the status."""
    from jdist.metrics import Run
    from jdist.metrics.runlog import default_run_dir

    from .backends.base import RankContext

    me = launched_rank()
    if me is None:
        return None
    device = current_device()
    ctx = RankContext(rank=me["rank"], world_size=me["world_size"], local_rank=me["local_rank"],
                      local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", me["world_size"])),
                      hostname=socket.gethostname(), device=device,
                      master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"), timeout_s=0.0)
    path = default_run_dir() / run_id()
    command = " ".join([me["launcher"], *sys.argv])
    run = Run(run_id=path.name, world_size=me["world_size"], backend=me["launcher"], device_kind=device.type,
              code=f"# $ {command}\n")
    channel = FileChannel(path, me["rank"], run if me["rank"] == 0 else None)
    s = make(ctx, channel)
    s.begin_cell()
    s.start_publisher()
    failure: list[str] = []
    previous_hook = sys.excepthook

    def excepthook(etype: Any, value: Any, tb: Any) -> None:
        failure.append(f"rank {me['rank']}: {etype.__name__}: {value}")
        previous_hook(etype, value, tb)

    def close() -> None:
        s.stop_publisher()
        s.end_cell()
        channel.close()
        end_run(path, run, me["rank"], failure[0] if failure else None)

    sys.excepthook = excepthook
    atexit.register(close)
    return s


__all__ = ["FileChannel", "LAUNCHERS", "current_device", "launched_rank", "open_session", "run_id"]
