"""``jdist.tune``'s entry: the arguments checked, the study opened (or resumed), the sweep run.

In the notebook::

    study = jdist.tune("objective", trials=32, per_trial=2, metric="val_loss", pruner="asha")
    study.best_params, jdist.last_sweep()
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable

from jdist.errors import usage_error
from jdist.metrics import default_run_dir
from jdist.plugins import backend_spec, backend_specs
from jdist.protocol import FOLDER_NAME

from .. import cluster as cl
from .driver import Sweep, optuna_module

#: Names accepted by ``pruner=`` (or pass an Optuna pruner).
PRUNERS = ("asha", "median", "hyperband", "none")


_last: Sweep | None = None


def tune(objective: str | Callable[[Any], Any], trials: int = 16, *, per_trial: int = 1, metric: str | None = None,
         direction: str = "minimize", pruner: Any = None, sampler: Any = None, study: Any = None,
         name: str | None = None, resume: bool = False, trial_timeout: float | None = None,
         show: bool = True) -> Any:
    """Run ``trials`` trials of ``objective`` on the running cluster's ranks, ``per_trial`` ranks each.

    ``objective``: the name of a function defined on the ranks (in a ``%%distributed`` cell), or a
    function defined in the notebook (sent to the ranks; its global names are the ranks'). It gets a
    trial (``suggest_float/int/categorical``, ``report``, ``should_prune``) and returns the value.
    ``metric``: a ``jdist.log`` name whose values (slot rank 0's) feed the pruner. ``pruner``:
    "asha", "median", "hyperband", "none" or an Optuna pruner. ``study``: an Optuna study of your own
    (its storage is then yours). ``resume``: go on with the sweep called ``name`` (default the newest),
    up to ``trials`` trials in all. ``trial_timeout``: seconds after which a trial is stopped and
    counted failed. Returns the ``optuna.Study``. Bad arguments raise one ``UsageError`` line before
    anything starts.

    >>> study = jdist.tune("objective", trials=8, per_trial=2, metric="val_loss")   # doctest: +SKIP
    """
    global _last
    t0 = time.perf_counter()
    optuna = optuna_module()
    cluster = _check_args(optuna, trials, per_trial, metric, direction, pruner, study, trial_timeout)
    name = _sweep_name(name, resume, study)
    objective_name = _objective_on_ranks(cluster, objective)
    folder, study, journal, storage = _open_study(optuna, study, name, resume, direction, pruner, sampler)
    sweep = Sweep(cluster, study, objective_name, per_trial, metric, trials, trial_timeout, folder, show)
    sweep.journal, sweep.storage = journal, storage
    sweep.phases["before_s"] = time.perf_counter() - t0
    _last = sweep
    sweep.run()
    return study


def _check_args(optuna: Any, trials: Any, per_trial: Any, metric: Any, direction: Any, pruner: Any, study: Any,
                trial_timeout: Any) -> Any:
    """The running cluster, once every argument that needs no round trip to the ranks is right; else one
    ``UsageError`` line that names the fix (nothing has started yet)."""
    cluster = cl.current()
    if cluster is None or cluster.client is None:
        raise usage_error("jdist.tune runs trials on a running cluster: start one with a %%distributed cell first "
                          "(e.g. %%distributed -n 4 defining the objective).")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise usage_error(f"trials={trials!r}: a sweep needs a whole number of trials, at least 1.")
    n = cluster.config.n
    if not isinstance(per_trial, int) or isinstance(per_trial, bool) or per_trial < 1 or n % per_trial:
        raise usage_error(f"per_trial={per_trial!r} does not divide the {n} ranks into slots: use one of "
                          f"{', '.join(str(k) for k in range(1, n + 1) if n % k == 0)}.")
    if metric is not None and not isinstance(metric, str):
        raise usage_error(f"metric={metric!r}: pass the name of a jdist.log value (a str), or leave it out.")
    if study is None and str(getattr(direction, "name", direction)).lower() not in ("minimize", "maximize"):
        raise usage_error(f"direction={direction!r}: use 'minimize' or 'maximize'.")
    if isinstance(pruner, str) and pruner not in PRUNERS or not (
            pruner is None or isinstance(pruner, (str, optuna.pruners.BasePruner))):
        raise usage_error(f"pruner={pruner!r}: use one of {', '.join(PRUNERS)}, or an Optuna pruner.")
    if trial_timeout is not None and not (isinstance(trial_timeout, (int, float)) and trial_timeout > 0):
        raise usage_error(f"trial_timeout={trial_timeout!r}: pass positive seconds, or None (no limit).")
    if not backend_spec(cluster.config.backend).slots:
        able = [name for name, spec in sorted(backend_specs().items()) if spec.slots]
        raise usage_error(f"jdist.tune runs trials on slots of the ranks' group, which --backend "
                          f"{cluster.config.backend} cannot form (backends that can: {', '.join(able)}). Start one "
                          f"with %%distributed --backend {able[0]} --restart.")
    problem = slots_across_hosts({info["rank"]: info["host"] for info in cluster.ranks}, per_trial)
    if problem:
        raise usage_error(problem)
    return cluster


def slots_across_hosts(hosts: dict[int, str], per_trial: int) -> str | None:
    """Why slots of ``per_trial`` ranks cannot be formed on ranks placed on ``hosts`` (rank -> host): a slot
    must be on one host (its group rendezvous on loopback). None if they can.

    >>> slots_across_hosts({0: "a", 1: "a", 2: "b", 3: "b"}, 2) is None
    True
    >>> print(slots_across_hosts({0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}, 2))
    Slot 1 (ranks 2, 3) would span hosts a, b: a slot's ranks must share a host. Use per_trial=1 or 3.
    """
    n = len(hosts)
    for start in range(0, n, per_trial):
        ranks = list(range(start, start + per_trial))
        where = sorted({hosts[r] for r in ranks})
        if len(where) > 1:
            fits = [k for k in range(1, n + 1) if n % k == 0
                    and all(len({hosts[r] for r in range(i, i + k)}) == 1 for i in range(0, n, k))]
            return (f"Slot {start // per_trial} (ranks {', '.join(map(str, ranks))}) would span hosts "
                    f"{', '.join(where)}: a slot's ranks must share a host. Use per_trial="
                    f"{' or '.join(map(str, fits))}.")
    return None


def last_sweep() -> Any:
    """The newest sweep's trials as a pandas DataFrame (Optuna's ``trials_dataframe`` with each
    trial's slot, ranks, error and run folder); None before any sweep in this kernel."""
    return _last.dataframe() if _last is not None else None


def last() -> Sweep | None:
    """The newest sweep of this kernel (None before any)."""
    return _last


def _objective_on_ranks(cluster: Any, objective: str | Callable[[Any], Any]) -> str:
    """The name of the objective in the ranks' namespace (a notebook function is sent there first)."""
    if isinstance(objective, str):
        missing = [r for r, ok in enumerate(cluster.call("has_function", objective)) if not ok]
        if missing:
            raise usage_error(f"jdist.tune: no function {objective!r} on rank(s) {missing}: define it in a "
                              "%%distributed cell first.")
        return objective
    if not callable(objective):
        raise usage_error("jdist.tune: objective must be a function of one trial, or the name of one on the ranks.")
    cluster.push("_jdist_objective", objective)
    return "_jdist_objective"


def make_pruner(optuna: Any, pruner: Any) -> Any:
    """An Optuna pruner from ``pruner=``: a name of :data:`PRUNERS`, None (none) or a pruner object."""
    if pruner is None or pruner == "none":
        return optuna.pruners.NopPruner()
    if not isinstance(pruner, str):
        return pruner
    makers = {"asha": optuna.pruners.SuccessiveHalvingPruner, "median": optuna.pruners.MedianPruner,
              "hyperband": optuna.pruners.HyperbandPruner}
    if pruner not in makers:
        raise ValueError(f"pruner={pruner!r}: use one of {', '.join(PRUNERS)}, or an Optuna pruner.")
    return makers[pruner]()


def sweeps_dir() -> Path:
    """Where sweeps keep their folders: ``<run dir>/sweeps``."""
    return default_run_dir() / "sweeps"


def _sweep_name(name: str | None, resume: bool, study: Any) -> str | None:
    """The sweep's folder name: ``name``, the newest sweep's (``resume`` without one) or a new one; a
    ``UsageError`` line if it cannot be (nothing is created here). None for a study of the user's own."""
    root = sweeps_dir()
    if name is not None and (not isinstance(name, str) or not FOLDER_NAME.fullmatch(name) or name.startswith(".")):
        raise usage_error(f"name={name!r}: a sweep's name is its folder's (and the sidebar's link): use letters, "
                          "digits, '.', '_' and '-', not starting with '.'.")
    if study is not None:
        return None
    if resume:
        if name is None:
            existing = sorted((p for p in root.glob("*") if (p / "journal.log").exists()),
                              key=lambda p: p.stat().st_mtime) if root.exists() else []
            if not existing:
                raise usage_error(f"resume=True: no sweep in {root} to resume; start one without resume.")
            return existing[-1].name
        if not (root / name / "journal.log").exists():
            raise usage_error(f"resume=True: no sweep called {name!r} in {root}; start it without resume.")
        return name
    if name is None:  # a new name: two sweeps started in the same second get -2, -3...
        base = name = time.strftime("sweep-%Y%m%d-%H%M%S")
        number = 1
        while (root / name).exists():
            number += 1
            name = f"{base}-{number}"
        return name
    if (root / name / "journal.log").exists():
        raise usage_error(f"A sweep called {name!r} exists in {root}: pass resume=True to go on with it, "
                          "or another name.")
    return name


def _open_study(optuna: Any, study: Any, name: str | None, resume: bool, direction: str, pruner: Any,
                sampler: Any) -> tuple[Path, Any, Any, Any]:
    """The sweep's folder, study, mirrored journal and storage (``name`` from :func:`_sweep_name`; a study
    of the user's own keeps its storage: no journal, no storage of jdist's)."""
    from optuna.storages import JournalStorage

    from ..journal import MirroredJournal

    root = sweeps_dir()
    if study is not None:
        folder = root / (re.sub(r"[^A-Za-z0-9_.-]", "_", study.study_name).lstrip(".") or "study")
        folder.mkdir(parents=True, exist_ok=True)
        return folder, study, None, None
    assert name is not None
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    journal = MirroredJournal(folder / "journal.log")
    if journal.dropped_tail:
        print(f"jdist.tune: the last line of {journal.path} was cut off (its writer stopped mid-line); it was "
              "dropped, the lines before it are read.")
    storage = JournalStorage(journal)
    study = optuna.create_study(study_name=name, storage=storage, direction=direction,
                                pruner=make_pruner(optuna, pruner), sampler=sampler, load_if_exists=resume)
    return folder, study, journal, storage
