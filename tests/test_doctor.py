"""%dist doctor on real ranks (jdist.kernel.doctor, jdist.rank.doctor): one report, saved."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import torch


@pytest.mark.cluster
def test_dist_doctor_reports_every_rank_and_saves_the_report(cluster_kernel):
    cluster_kernel.run("%%distributed\nimport torch.distributed as dist\ndist.all_reduce(torch.ones(3))")
    out = cluster_kernel.run("%dist doctor")
    text = out.stdout
    assert text.startswith("jdist doctor: cluster "), text
    assert re.search(r"ranks: rank 0 \S+ pid \d+ cpu, rank 1 \S+ pid \d+ cpu; backend ddp", text), text
    assert f"torch {torch.__version__}" in text and "gloo in torch" in text and "mpi MPICH" in text, text
    assert re.search(r"environment \(per rank\): rank 0: .*RANK=0.*; rank 1: .*RANK=1", text), text
    assert "TORCH_FR_BUFFER_SIZE=64" in text  # (the Flight Recorder, on for every rank)
    assert "the process group's interface: lo" in text
    assert re.search(r"clocks against the kernel's: \S+ [+-]\d+\.\d ms \(\+-\d+\.\d ms\)", text), text
    assert re.search(r"rank 0: all_reduce #\d+ of float32\[3\] on ranks 0,1; rank 1: all_reduce #\d+ of "
                     r"float32\[3\] on ranks 0,1", text), text
    assert "stacks: rank 0: idle; rank 1: idle" in text
    saved = Path(re.search(r"\(saved: (\S+)\)", text).group(1))
    assert saved.read_text().strip() == text.split("\n(saved: ")[0].strip()


@pytest.mark.cluster
def test_jdist_doctor_starts_the_ranks_prints_the_report_and_stops_them(tmp_path):
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "jdist", "doctor", "-n", "2"], capture_output=True, text=True,
                         timeout=180, env={**os.environ, "JDIST_RUN_DIR": str(tmp_path)}, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("jdist doctor: cluster ") and "rank 1 " in out.stdout, out.stdout
    saved = list(tmp_path.glob("doctor-*.txt"))
    assert len(saved) == 1 and saved[0].read_text() == out.stdout and f"saved: {saved[0]}" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "jdist", "doctor", "-n", "0"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("jdist: error: "), bad.stderr
