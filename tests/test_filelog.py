"""``jdist.log`` under other launchers (jdist.rank.filelog): real torchrun and mpiexec runs write a
run folder that jdist's reader, ``jdist runs`` and ``jdist show`` read back; the merge of per-rank
files and of a failed rank's marker, on synthetic folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jdist.metrics import Run, RunReader, list_runs, read_run
from jdist.rank.filelog import launched_rank, run_id

BIN = Path(sys.executable).parent

SCRIPT = """import os, sys, torch, torch.distributed as dist, jdist
if "RANK" in os.environ:   # torchrun
    dist.init_process_group("gloo")
else:                      # plain mpiexec: the rank from its PMI variables, a file rendezvous
    dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"),
                            rank=int(os.environ["PMI_RANK"]), world_size=int(os.environ["PMI_SIZE"]))
r = dist.get_rank()
jdist.progress(total_steps=6)
for step in range(6):
    t = torch.ones(1) * (r + 1); dist.all_reduce(t)
    jdist.log(step=step, loss=1.0 / (step + 1) + r, reduced=t.item())
dist.barrier()
if "--fail" in sys.argv and r == 1:
    raise ValueError("bad shard on rank 1")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("env,expected", [
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"}, (1, 2, 1, "torchrun")),
    ({"RANK": "0", "WORLD_SIZE": "2", "ACCELERATE_MIXED_PRECISION": "no"}, (0, 2, 0, "accelerate")),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, (3, 4, 1, "mpiexec")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"}, (5, 8, 1, "srun")),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, None),  # a Slurm job's batch script, not a task of a step
])
def test_the_launchers_environment_gives_the_rank(env, expected):
    got = launched_rank(env)
    assert (None if got is None else (got["rank"], got["world_size"], got["local_rank"], got["launcher"])) == expected


def test_ranks_files_and_a_failed_ranks_marker_are_merged_by_the_reader(tmp_path):
    run = Run("r", 2, backend="torchrun")
    (tmp_path / "meta.json").write_text(json.dumps({**run.meta(), "status": "finished"}))
    for rank in (0, 1):
        lines = [json.dumps({"rank": rank, "seq": s, "cell": 1, "step": s, "loss": float(s)}) for s in range(3)]
        (tmp_path / f"metrics.r{rank}.jsonl").write_text("\n".join(lines) + "\n")
    reader = RunReader(tmp_path)
    assert reader.update().count() == 6 and reader.run.status == "finished"
    (tmp_path / "failed.r1.json").write_text(json.dumps({"rank": 1, "error": "rank 1: ValueError: x", "time": 1.0}))
    with open(tmp_path / "metrics.r1.jsonl", "a") as fh:
        fh.write(json.dumps({"rank": 1, "seq": 3, "cell": 1, "step": 3, "loss": 3.0}) + "\n")
    run = reader.update()
    assert run.count() == 7 and run.status == "failed" and run.error == "rank 1: ValueError: x"


def test_a_run_id_names_one_folder_for_every_rank():
    env = {"TORCHELASTIC_RUN_ID": "abc"}
    assert run_id(env) == run_id(env) and run_id({"JDIST_RUN_ID": "mine"}) == "mine"


@pytest.mark.cluster
@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_a_script_under_another_launcher_writes_the_run_log(tmp_path, monkeypatch, launcher):
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.setenv("JDIST_RUN_DIR", str(tmp_path / "runs"))
    cmd = ([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"] if launcher == "torchrun"
           else [str(BIN / "mpiexec"), "-n", "2", sys.executable])
    out = subprocess.run([*cmd, str(tmp_path / "train.py")], capture_output=True, text=True, timeout=180,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (path,) = list_runs(tmp_path / "runs")
    run = read_run(path)
    assert run.status == "finished" and run.world_size == 2 and run.total_steps == 6 and run.backend == launcher
    hist = run.history
    assert sorted(hist["rank"].unique()) == [0, 1] and len(hist) == 12
    assert set(hist["reduced"]) == {3.0} and "step_time_s" in hist and "mem_bytes" in hist
    listed = subprocess.run([str(BIN / "jdist"), "runs"], capture_output=True, text=True, timeout=60)
    assert f"{launcher} " in listed.stdout and "finished" in listed.stdout


@pytest.mark.cluster
def test_a_rank_that_fails_under_torchrun_marks_the_run_failed(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.setenv("JDIST_RUN_DIR", str(tmp_path / "runs"))
    out = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "train.py", "--fail"],
                         capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 1
    run = read_run(list_runs(tmp_path / "runs")[0])
    assert run.status == "failed" and run.error == "rank 1: ValueError: bad shard on rank 1"
    assert run.count() == 12
