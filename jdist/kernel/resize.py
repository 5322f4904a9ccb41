"""Resizing the running cluster without losing the training (``%dist resize -n M``): a use case beside
:mod:`jdist.kernel.recovery`'s restart.

1. **snapshot** on the old world (:func:`jdist.rank.elastic.snapshot`): the prepared models with their optimizers
   and schedulers through ``jdist.save_checkpoint`` (DDP/Horovod replicated, FSDP2 and DTensor models as
   ``torch.distributed.checkpoint`` shards), the loaders' places in their epochs, the plain variables alike on
   every rank; at the state of that moment, not the last checkpoint;
2. **stop** the old ranks and **start** the new number (if the launcher cannot give it, the old number starts
   again and gets the same state back);
3. **replay** the set-up cells, as ``%dist restart`` does (they build the model, optimizer and loader for the new
   world: ``jdist.prepare``, ``--mesh``);
4. **load** the snapshot into what they built (:func:`jdist.rank.elastic.restore`), resharded; learning rates
   scaled with ``jdist.scale_lr`` are scaled to the new size.

It says what it carried and how long each part took, in one report.

Example:
    >>> print(resize(cluster, 4))      # doctest: +SKIP
    Resized 2 -> 4 ranks in 6.2 s (snapshot 0.3 s, stop 0.4 s, start 3.9 s, replay 1.2 s, load 0.4 s).
    ...
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .recovery import replay

if TYPE_CHECKING:
    from .cluster import ClusterSession


def snapshot_dir(cluster: ClusterSession, directory: str | None) -> Path:
    """Where the snapshot goes: ``directory``, else a folder of the run directory (visible to every rank of a
    local cluster; a cluster over several hosts needs ``--dir`` on a filesystem they share)."""
    from jdist.metrics import default_run_dir

    base = Path(directory) if directory else default_run_dir() / "resize"
    return base.absolute() / f"{cluster.cluster_id or 'cluster'}-{time.strftime('%Y%m%d-%H%M%S')}"


#: Backends whose state a resize cannot carry, and why (one line each).
NOT_RESIZED = {
    "deepspeed": "DeepSpeed's checkpoints load only on the world size that saved them (its universal checkpoint is "
                 "an offline conversion, ds_to_universal, and a config of its own); save one with "
                 "jdist.save_checkpoint, then %%distributed -n M --restart and load it there as DeepSpeed documents",
    "tf": "TensorFlow ranks keep their state in their strategy's variables, which jdist does not reshard; save a "
          "checkpoint, then %%distributed -n M --restart and restore it",
}


def launcher_changes(cluster: ClusterSession | None, hosts: str | None = None) -> dict[str, Any]:
    """The launcher options a resize changes besides the number of ranks: ``--hosts`` of an ssh cluster (the hosts
    that answer again, or others); one line for a launcher that has none."""
    if hosts is None:
        return {}
    if cluster is not None and cluster.config.get("hosts") is None:
        raise ValueError(f"%dist resize --hosts {hosts}: this cluster's ranks are not started over ssh (--launcher "
                         f"{cluster.config.launcher}); resize it with -n.")
    return {"hosts": hosts}


def check(cluster: ClusterSession | None, n: int, changes: dict[str, Any] | None = None) -> None:
    """One line for what cannot be resized, before anything stops (``changes``: :func:`launcher_changes`)."""
    if cluster is None:
        raise ValueError("No jdist cluster is running, so there is nothing to resize: start one with "
                         "%%distributed -n 2 (and resize it later).")
    if n < 1:
        raise ValueError(f"%dist resize -n {n}: a cluster needs at least 1 rank, e.g. %dist resize -n 2.")
    why = NOT_RESIZED.get(cluster.config.backend)
    if why:
        raise ValueError(f"%dist resize: --backend {cluster.config.backend} is not resized: {why}.")
    bounds = cluster.config.elastic_range
    if bounds and not bounds[0] <= n <= bounds[1]:
        raise ValueError(f"%dist resize -n {n}: this cluster runs with --elastic {bounds[0]}:{bounds[1]}; resize "
                         f"within it, or give a cell --elastic with a range that holds {n}.")
    from jdist.plugins import option_table

    from .probes import probe

    new = cluster.config.replace(n=n, **(changes or {}))
    try:  # what the launcher can give (--hosts' room, Slurm's -N), the GPUs here: before anything stops
        option_table().check(new)
        probe(new, cluster.config)
    except ValueError as exc:
        hint = (" Give the cluster a mesh that fits first (a cell with that --mesh: it needs no restart), then resize."
                if "--mesh" in str(exc) else "")
        raise ValueError(f"%dist resize -n {n}: {exc}{hint}") from None


def accumulation(old: int, n: int, grad_accum: int, backend: str) -> int:
    """The gradient accumulation that keeps the global batch (micro-batch x accumulation x ranks) from ``old`` to
    ``n`` ranks; one line where no whole number does.

    >>> accumulation(2, 1, 2, "ddp"), accumulation(4, 2, 1, "fsdp")
    (4, 2)
    >>> accumulation(2, 3, 1, "ddp")
    Traceback (most recent call last):
    ValueError: --keep-global-batch: 2 rank(s) x grad_accum 1 is 2 micro-batches a step, which 3 ranks cannot share evenly; resize to a number of ranks that divides 2 (1, 2), or leave --keep-global-batch out.
    """
    if backend == "horovod":
        raise ValueError("--keep-global-batch: Horovod fixes its accumulation (backward_passes_per_step) when the "
                         "optimizer is made; resize without it, or give grad_accum= in the set-up.")
    total = old * grad_accum
    if total % n:
        fits = ", ".join(str(d) for d in range(1, total + 1) if total % d == 0)
        raise ValueError(f"--keep-global-batch: {old} rank(s) x grad_accum {grad_accum} is {total} micro-batches a "
                         f"step, which {n} ranks cannot share evenly; resize to a number of ranks that divides "
                         f"{total} ({fits}), or leave --keep-global-batch out.")
    return total // n


def resize(cluster: ClusterSession, n: int, progress: Callable[[str], None] | None = None,
           directory: str | None = None, keep_global_batch: bool = False,
           changes: dict[str, Any] | None = None) -> str:
    """Resize ``cluster`` to ``n`` ranks, keeping its training (see the module doc); returns the report.
    ``keep_global_batch``: change the prepared models' gradient accumulation so that a step sees as many samples
    as before (else the global batch scales with the ranks); ``changes``: launcher options (:func:`launcher_changes`)."""
    say = progress or (lambda msg: None)
    changes = changes or {}
    check(cluster, n, changes)
    old = cluster.config.n
    if n == old and all(cluster.config.get(k) == v for k, v in changes.items()):
        return f"The cluster has {n} rank(s) already: nothing to resize."
    cluster.require_free(None, "The resize")
    folder = snapshot_dir(cluster, directory)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    say(f"Resizing {old} -> {n} ranks: saving the state of the {old} ranks...")
    try:
        manifest = cluster.call("elastic_snapshot", str(folder), timeout=cluster.config.timeout + 120)[0]
    except Exception as exc:  # (a rank could not save: nothing stopped, the cluster goes on as it was)
        evalue = getattr(exc, "evalue", None) or str(exc)
        raise ValueError(f"%dist resize -n {n}: saving the ranks' state failed, so nothing was stopped: {evalue}") \
            from None
    times["snapshot"] = time.perf_counter() - t0
    accum = None
    if keep_global_batch:
        try:
            accum = accumulation(old, n, manifest["grad_accum"], manifest["backend"])
        except ValueError:
            shutil.rmtree(folder, ignore_errors=True)  # (nothing stopped: the snapshot is not needed)
            raise
    entries, plan = cluster.recovery.take()
    t = time.perf_counter()
    cluster.stop()
    times["stop"] = time.perf_counter() - t
    t = time.perf_counter()
    config, cluster.config = cluster.config, cluster.config.replace(n=n, **changes)
    fallback = None
    try:
        cluster.start(say)
    except Exception as exc:  # the launcher cannot give n ranks: the old size again, with the same state
        fallback = getattr(exc, "lines", None) or [str(exc)]
        say(f"Starting {n} rank(s) failed; starting {old} again with the state...")
        cluster.stop()
        cluster.config = config
        cluster.start(say)
    times["start"] = time.perf_counter() - t
    t = time.perf_counter()
    replayed, skipped, failure = replay(cluster, entries, say, keep_going=True)
    times["replay"] = time.perf_counter() - t
    if failure is not None:
        return (f"Resized {old} -> {cluster.config.n} ranks, but {failure}; the state was not loaded (it is kept in "
                f"{folder}).")
    t = time.perf_counter()
    again = None  # jdist.checkpoint_every set in a cell not replayed: set again on the new ranks
    if plan is not None and cluster.recovery.checkpoint is None:
        again = {"every": plan.every, "directory": plan.directory, "keep": plan.keep, "names": plan.names}
        cluster.recovery.note_message({"kind": "checkpoint_every", **again})
    if plan is not None and plan.latest:
        cluster.recovery.note_message({"kind": "checkpoint_saved", **plan.latest})
    try:
        loaded = cluster.call("elastic_restore", str(folder), manifest, again, accum,
                              timeout=cluster.config.timeout + 120)[0]
    except Exception as exc:
        evalue = getattr(exc, "evalue", None) or str(exc)
        return (f"Resized {old} -> {cluster.config.n} ranks and replayed {replayed} set-up cell(s), but the state "
                f"could not be loaded: {evalue}")
    times["load"] = time.perf_counter() - t
    shutil.rmtree(folder, ignore_errors=True)
    lines = report(old, cluster.config.n, manifest, loaded, replayed, times, time.perf_counter() - t0)
    if changes.get("hosts"):
        lines.insert(1, f"  hosts: {cluster.config.get('hosts')} (ranks per host).")
    lines.append("  " + batch_line(old, cluster.config.n, manifest, accum, loaded))
    for line in skipped:
        lines.append(f"  {line[0].upper()}{line[1:]} (what it defined is carried where it was alike on every rank).")
    if fallback is not None:
        lines.insert(0, f"Resizing to {n} rank(s) failed, so the cluster runs on {old} again with the same state: "
                     + " ".join(fallback))
    return "\n".join(lines)


def report(old: int, new: int, manifest: dict[str, Any], loaded: dict[str, Any], replayed: int,
           times: dict[str, float], total: float) -> list[str]:
    """The resize's lines: sizes and times, what was carried, what was not.

    >>> manifest = {"states": [{"model": "model", "optimizer": "opt", "scheduler": None, "sharded": True}],
    ...             "variables": ["losses"],
    ...             "variable_bytes": 120, "differ": ["x"], "unpicklable": [], "loaders": {}}
    >>> times = {"snapshot": 0.3, "stop": 0.4, "start": 3.9, "replay": 1.2, "load": 0.4}
    >>> print("\\n".join(report(2, 4, manifest, {"lr_factor": None, "loaders": {}}, 1, times, 6.2)))
    Resized 2 -> 4 ranks in 6.2 s (snapshot 0.3 s, stop 0.4 s, start 3.9 s, replay 1.2 s, load 0.4 s).
      carried: model with opt (resharded to 4 ranks); variables losses (120 B); 1 set-up cell(s) replayed.
      not carried: x (differs per rank). Random number generators start from the set-up cells' seeds.
    """
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
    lines = [f"Resized {old} -> {new} ranks in {total:.1f} s ({parts})."]
    carried = []
    for st in manifest["states"]:
        with_ = [v for v in (st["optimizer"], st["scheduler"]) if v]
        how = f"resharded to {new} ranks" if st.get("sharded") else f"replicated on {new} ranks"
        carried.append(st["model"] + (f" with {' and '.join(with_)}" if with_ else "") + f" ({how})")
    if loaded.get("lr_factor"):
        carried.append(f"learning rates x {loaded['lr_factor']:.3g} (jdist.scale_lr, {old} -> {new} ranks)")
    for name, line in loaded.get("loaders", {}).items():
        carried.append(f"{name}: {line}")
    if manifest["variables"]:
        from .supervise.memory import size

        carried.append(f"variables {', '.join(manifest['variables'])} ({size(manifest['variable_bytes'])})")
    carried.append(f"{replayed} set-up cell(s) replayed")
    lines.append("  carried: " + "; ".join(carried) + ".")
    left = [f"{n} (differs per rank)" for n in manifest["differ"]]
    left += [f"{n} (cannot be pickled)" for n in manifest["unpicklable"]]
    lines.append(("  not carried: " + ", ".join(left) + ". " if left else "  ")
                 + "Random number generators start from the set-up cells' seeds.")
    return lines


def lost(cluster: ClusterSession, death: Any) -> tuple[list[int], str | None]:
    """The ranks a death lost, and the host they were on when the cluster spans hosts (``--hosts``): then every rank
    of that host is taken as lost (a host that lost a rank, its network or its processes, is not trusted with the
    others), as a node's failure is in torchrun's elastic agent; on one machine, the rank that died."""
    hosts = {info["rank"]: info["host"] for info in cluster.ranks}
    if death.rank is None:
        return [], None
    if cluster.config.get("hosts") and len(set(hosts.values())) > 1:
        host = hosts.get(death.rank)
        return sorted(r for r, h in hosts.items() if h == host), host
    return [death.rank], None


def after_loss(cluster: ClusterSession, death: Any) -> tuple[Any, str, str | None]:
    """``--elastic MIN:MAX`` after ``death``: the cluster's configuration for the ranks left (None: fewer than MIN),
    what was lost in words, and the line to say when nothing goes on."""
    from jdist.kernel.launch.remote import parse_hosts

    low, high = cluster.config.elastic_range or (1, cluster.config.n)
    ranks, host = lost(cluster, death)
    left = cluster.config.n - len(ranks)
    what = (f"{host} went away (rank(s) {', '.join(map(str, ranks))} with it)" if host else
            f"rank {death.rank} is lost")
    if left < low:
        return None, what, f"{left} rank(s) left, fewer than --elastic {low}:{high} allows"
    changes: dict[str, Any] = {"n": left}
    if host:
        changes["hosts"] = ",".join(f"{h}:{c}" for h, c in parse_hosts(cluster.config.get("hosts")) if h != host)
    if cluster.config.get("nodes"):
        changes["nodes"] = min(cluster.config.get("nodes"), left)
    return cluster.config.replace(**changes), what, None


def go_on_after_loss(cluster: ClusterSession, death: Any, progress: Callable[[str], None] | None = None) -> str:
    """``--elastic MIN:MAX``: after ranks were lost, start the cluster again at once on what is left (at least MIN),
    replay the set-up cells and restore the newest ``jdist.checkpoint_every`` checkpoint, resharded to the ranks
    left (:func:`jdist.kernel.recovery.restart`); the line saying so. Fewer than MIN left: nothing is started."""
    from . import recovery

    say = progress or (lambda msg: None)
    low, high = cluster.config.elastic_range or (1, cluster.config.n)
    config, what, short = after_loss(cluster, death)
    if config is None:
        return (f"jdist: {what}: {short}; run %dist restart for {cluster.config.n} fresh ranks, or %dist resize -n N "
                "once capacity is back.")
    cluster.wait_all_ended(10.0)  # (the lost ranks' peers, which MPI ends: what they leave on their hosts goes)
    cluster.config = config
    say(f"jdist: {what}: going on with {config.n} rank(s) (--elastic {low}:{high})...")
    try:
        done = recovery.restart(cluster, say)
    except Exception as exc:  # (the death is still said: the cell's error comes after this line)
        lines = getattr(exc, "lines", None) or [str(exc)]
        return (f"jdist: {what}: going on with {config.n} rank(s) (--elastic {low}:{high}) failed: {lines[0]} "
                "Run %dist restart to try again.")
    where = ""
    if config.get("hosts"):
        where = f" on {', '.join(sorted({info['host'] for info in cluster.ranks}))}"
    return f"jdist: {what}: went on with {config.n} rank(s){where} (--elastic {low}:{high}). {done}"


def batch_line(old: int, new: int, manifest: dict[str, Any], accum: int | None, loaded: dict[str, Any]) -> str:
    """What happened to the global batch (micro-batch x grad_accum x ranks) and the learning rate.

    >>> print(batch_line(2, 4, {"grad_accum": 1}, None, {"lr_factor": None}))
    Global batch: 2x (micro-batch x 1 x 4 ranks); the learning rate is the set-up's, not scaled for it (jdist.scale_lr in the set-up scales it; --keep-global-batch keeps the batch).
    >>> print(batch_line(2, 4, {"grad_accum": 2}, 1, {"lr_factor": None}))
    Global batch kept: grad_accum 2 -> 1 (micro-batch x 1 x 4 ranks, as micro-batch x 2 x 2 before).
    """
    before = manifest["grad_accum"]
    if accum is not None:
        return (f"Global batch kept: grad_accum {before} -> {accum} (micro-batch x {accum} x {new} ranks, as "
                f"micro-batch x {before} x {old} before).")
    ratio = new / old
    said = f"Global batch: {ratio:.3g}x (micro-batch x {before} x {new} ranks); the learning rate is "
    if loaded.get("lr_factor"):
        return said + f"scaled with it (jdist.scale_lr: x {loaded['lr_factor']:.3g})."
    return said + ("the set-up's, not scaled for it (jdist.scale_lr in the set-up scales it; --keep-global-batch "
                   "keeps the batch).")


__all__ = ["NOT_RESIZED", "accumulation", "after_loss", "batch_line", "check", "go_on_after_loss", "launcher_changes",
           "lost", "report", "resize", "snapshot_dir"]
