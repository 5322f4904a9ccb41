"""jdist.kernel.journal: a sweep's Optuna journal in memory, mirrored to its file; read back by Optuna's own
file backend (what optuna-dashboard and jupyterlab-optuna use). Real Optuna studies, no cluster."""

from __future__ import annotations

import json

import pytest

optuna = pytest.importorskip("optuna")
from optuna.storages import JournalStorage  # noqa: E402
from optuna.storages.journal import JournalFileBackend  # noqa: E402

from jdist.kernel.journal import JournalWriteError, MirroredJournal  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(trial):
    x = trial.suggest_float("x", -2.0, 2.0)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    for step in range(4):
        trial.report(x * x + 1.0 / (step + 1), step)
    trial.set_user_attr("kind_seen", kind)
    if x > 1.5:
        raise optuna.TrialPruned()
    return x * x


def frozen(study):
    return [(t.number, t.state.name, t.params, t.value, t.intermediate_values, t.user_attrs) for t in study.trials]


def test_optunas_file_backend_reads_what_the_mirror_wrote_and_a_resumed_journal_goes_on(tmp_path):
    path = tmp_path / "journal.log"
    journal = MirroredJournal(path)
    study = optuna.create_study(study_name="s", storage=JournalStorage(journal),
                                sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(objective, n_trials=12)
    journal.flush()
    plain = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    assert frozen(plain) == frozen(study) and len(study.trials) == 12
    assert {t.state.name for t in study.trials} >= {"COMPLETE"}

    # a new kernel: the file is read into memory, the study goes on, the file holds both parts
    again = MirroredJournal(path)
    resumed = optuna.load_study(study_name="s", storage=JournalStorage(again))
    assert frozen(resumed) == frozen(study) and not again.dropped_tail
    resumed.optimize(objective, n_trials=3)
    again.flush()
    plain = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    assert frozen(plain) == frozen(resumed) and len(plain.trials) == 15
    assert all(json.loads(line)["op_code"] >= 0 for line in path.read_text().splitlines())


def test_a_cut_off_last_line_is_dropped_and_said(tmp_path):
    path = tmp_path / "journal.log"
    journal = MirroredJournal(path)
    study = optuna.create_study(study_name="s", storage=JournalStorage(journal))
    study.optimize(objective, n_trials=2)
    journal.flush()
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"op_code": 4, "worker_id"')  # a writer that died mid-line
    again = MirroredJournal(path)
    assert again.dropped_tail and path.read_bytes() == whole
    assert len(optuna.load_study(study_name="s", storage=JournalStorage(again)).trials) == 2


def test_a_file_that_cannot_be_written_is_reported_and_the_study_stays_in_memory(tmp_path):
    path = tmp_path / "journal.log"
    journal = MirroredJournal(path)
    path.mkdir()  # the writer cannot open a folder to append to it
    study = optuna.create_study(study_name="s", storage=JournalStorage(journal))
    study.optimize(objective, n_trials=2)
    with pytest.raises(JournalWriteError, match="could not be written"):
        journal.flush()
    assert len(study.trials) == 2 and study.trials[0].state.name in ("COMPLETE", "PRUNED")
