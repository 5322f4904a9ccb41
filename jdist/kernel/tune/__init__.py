"""``jdist.tune``: a hyper-parameter sweep driven from the notebook, trials on slots of the ranks.

The kernel owns an Optuna study, in memory and mirrored to its journal file in the sweep's folder in
Optuna's own format (:mod:`jdist.kernel.journal`; ``sweep.json`` and ``view.html`` there are for the
sidebar). The running cluster's ranks are tiled into slots of ``per_trial`` ranks, each slot its own
torch default group while the sweep runs (:mod:`jdist.rank.tune`). Every free slot gets the next trial at once
(no barrier across slots); ``jdist.log`` of the sweep's ``metric`` and ``trial.report`` feed the
pruner; a trial that raises, hangs past ``trial_timeout`` or is interrupted is told FAIL with its
rank's traceback and its slot repaired; Ctrl-C stops the sweep and keeps every finished trial,
and ``resume=True`` goes on where it stopped.

In the notebook::

    %%distributed -n 4
    def objective(trial):
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        ...
        return val_loss

    study = jdist.tune("objective", trials=32, per_trial=2, metric="val_loss", pruner="asha")
    study.best_params, jdist.last_sweep()

The package: :mod:`~jdist.kernel.tune.api` (the entry, its checks, the study), :mod:`~jdist.kernel.tune.driver`
(the sweep's loop and its fault rules), :mod:`~jdist.kernel.tune.requests` (the trials' requests) and
:mod:`~jdist.kernel.tune.view` (what the notebook and the sidebar show).
"""

from .api import PRUNERS, last, last_sweep, make_pruner, slots_across_hosts, sweeps_dir, tune
from .driver import TUNE_INSTALL_HINT, RankLost, Sweep, SweepStopped, TrialRun
from .requests import as_request
from .view import SweepView

__all__ = ["PRUNERS", "RankLost", "Sweep", "SweepStopped", "SweepView", "TUNE_INSTALL_HINT", "TrialRun", "as_request",
           "last", "last_sweep", "make_pruner", "slots_across_hosts", "sweeps_dir", "tune"]
