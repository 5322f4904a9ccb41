"""jdist's fault promise, as one matrix: each way of running code on the ranks (a driver) x each fault x
the backends where they apply, on real 2-rank MPI clusters in a real kernel.

The promise, checked in every cell of the matrix that runs here: the root cause is shown with its rank, its
type and the user's line that raised; the ranks that did not fail are named (released, or where they
waited); no line of log noise appears in that cell or in the next two (``--output all``); the next cell
sees the whole world with the variables kept, or the error says the one restart that brings the ranks
back (and after it the world is whole again); no process is left after ``%dist stop``.

Rows that share a cluster run one after the other (pytest groups the tests by the module's ``row``
fixture): ``cell`` and ``%run`` on ddp share one; each other backend has its own. Faults that end in a
restart run last in a row. The cells of the matrix that other drivers keep in their own test files (a
script under ``jdist run``, a sweep's trial, TensorFlow, Ray) are listed in :data:`ELSEWHERE` with the test
that checks them there, the combinations that cannot apply in :data:`NOT_APPLICABLE` with the reason, and a
row's faults that take the same path as in another row in :data:`SAME_AS` (a skip that says which);
``test_every_cell_of_the_matrix_is_checked_or_says_why_not`` keeps the three lists complete.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import KernelSession

from jdist.plugins import backend_spec

pytestmark = pytest.mark.cluster

TESTS = Path(__file__).parent
DRIVERS = ("cell", "%run", "jdist run", "tune trial", "tf cell", "ray fit")
#: In the order a row runs them: the faults that end in a restart last.
FAULTS = ("exception", "exit 3", "hang", "interrupt", "second interrupt", "death")
TORCH_BACKENDS = ("ddp", "fsdp", "horovod", "deepspeed")
#: (driver, backend) rows run here, in order; rows on one backend share its cluster.
ROWS = (("cell", "ddp"), ("%run", "ddp"), ("cell", "fsdp"), ("cell", "horovod"), ("cell", "deepspeed"))

#: Cells of the matrix checked by another driver's own tests: (driver, fault) -> "file::test".
ELSEWHERE = {
    ("jdist run", "exception"): "test_cli.py::test_a_rank_exception_exits_1_with_the_root_cause_and_the_bystander_released",
    ("jdist run", "death"): "test_cli.py::test_exits_killed_ranks_and_hangs_have_their_own_codes",
    ("jdist run", "hang"): "test_cli.py::test_exits_killed_ranks_and_hangs_have_their_own_codes",
    ("jdist run", "interrupt"): "test_cli.py::test_ctrl_c_in_a_terminal_reaches_every_rank_and_a_second_one_ends_them",
    ("jdist run", "second interrupt"): "test_cli.py::test_ctrl_c_in_a_terminal_reaches_every_rank_and_a_second_one_ends_them",
    ("jdist run", "exit 3"): "test_cli.py::test_exits_killed_ranks_and_hangs_have_their_own_codes",
    ("tune trial", "exception"): "test_tune.py::test_a_failing_and_a_hanging_trial_fail_with_their_cause_and_the_sweep_goes_on",
    ("tune trial", "hang"): "test_tune.py::test_a_failing_and_a_hanging_trial_fail_with_their_cause_and_the_sweep_goes_on",
    ("tune trial", "interrupt"): "test_tune.py::test_an_interrupt_stops_the_sweep_keeps_the_trials_and_resume_goes_on",
    ("tune trial", "second interrupt"): "test_tune.py::test_an_interrupt_stops_the_sweep_keeps_the_trials_and_resume_goes_on",
    ("tune trial", "death"): "test_tune.py::test_a_rank_that_dies_stops_the_sweep_with_one_line_and_keeps_the_trials",
    ("tf cell", "exception"): "test_tf.py::test_an_error_while_the_other_rank_waits_in_a_compiled_collective_is_reported_and_the_ranks_restart",
    ("tf cell", "hang"): "test_tf.py::test_a_timed_out_collective_restarts_the_ranks_which_restore_the_checkpoint_every_rank_wrote",
    ("tf cell", "interrupt"): "test_tf.py::test_an_interrupt_while_a_rank_waits_in_a_collective_restarts_the_ranks",
    ("ray fit", "exception"): "test_ray.py::test_a_failing_worker_is_a_rank_error_and_the_run_failed",
    ("ray fit", "interrupt"): "test_ray.py::test_an_interrupt_aborts_the_run_whose_workers_stream_live",
}
#: Combinations that cannot apply, with the reason.
NOT_APPLICABLE = {
    ("tune trial", "exit 3"): "a trial's objective returns its value: sys.exit in it is an exception of the trial "
                              "like any other (the 'exception' cell)",
    ("tf cell", "exit 3"): "the same code path as the torch cell's (the supervisor classifies SystemExit before any "
                           "backend sees it)",
    ("tf cell", "second interrupt"): "TF's collectives cannot be released: the first interrupt already restarts the "
                                     "ranks (the 'interrupt' cell)",
    ("tf cell", "death"): "a rank's death is the launcher's and the same for every backend (the torch rows)",
    ("ray fit", "hang"): "Ray Train's workers run Ray's own process group; jdist has no watchdog inside them "
                         "(Ray's collective timeout ends a hang)",
    ("ray fit", "second interrupt"): "the first interrupt aborts the run through Ray Train's controller, which ends "
                                     "its workers itself",
    ("ray fit", "death"): "Ray restarts or fails its own worker group (FailureConfig); jdist reports Ray's error as "
                          "for the 'exception' cell",
    ("ray fit", "exit 3"): "a worker's sys.exit is an error of Ray's worker like any other (the 'exception' cell)",
}
#: Faults a row leaves to another row, and why (the same path through the same code; a row keeps the faults
#: that exercise its own part).
SAME_AS = {
    ("%run", "second interrupt"): "the cell row's: a %run script runs inside the cell's supervisor, and what %run "
                                  "changes (the script's frames named) the other faults of this row check",
    ("%run", "death"): "the cell row's: a rank's death is seen by the launcher whatever the rank ran",
    **{(f"cell-{backend}", fault): why for backend in ("fsdp", "deepspeed") for fault, why in (
        ("death", "the cell-ddp row's: the launcher sees the death whatever the backend, and %dist restart sets the "
                  "backend up as at the start (a death on DeepSpeed's ZeRO-3 with --auto-restart: test_deepspeed.py)"),
        ("second interrupt", "the cell-ddp row's: the rank that ignores the interrupt runs Python of its own, "
                             "whatever the backend"))},
    ("cell-horovod", "exit 3"): "the 'exception' fault's path on Horovod: rank 0 left in Horovod's MPI wait is "
                                "seen there and the ranks restart",
    ("cell-horovod", "interrupt"): "the 'exception' fault's path on Horovod, ended by the interrupt instead",
    ("cell-horovod", "death"): "the cell-ddp row's: the launcher sees the death whatever the backend; Horovod's "
                               "set-up after a restart is this row's 'exception', 'hang' and 'second interrupt'",
}
#: Rows not run on every backend, and why: one backend shows the driver's own part of the promise.
ONE_BACKEND = {
    "%run": "the script runs through the cell's supervisor and the backend's release and rebuild: the cell rows "
            "show those for each backend",
    "jdist run": "the same supervisor and ranks as a cell; what jdist run adds is its front end (exit codes, "
                 "errors.json, the terminal)",
    "tune trial": "slots exist on ddp and fsdp only (BackendSpec.slots); test_tune.py runs both",
}

NOISE = ("Logging error", "BrokenPipeError", "--- Logging")


@dataclass(frozen=True)
class Shown:
    text: str  # what the notebook showed: the error (traceback lines), stdout, stderr
    ename: str | None


def collective(backend: str, what: str = "t") -> str:
    return f"hvd.allreduce({what}, name='m')" if backend == "horovod" else f"dist.all_reduce({what})"


def fault_code(fault: str, backend: str) -> str:
    """The fault, as code every rank runs (``r``: its rank; a cell and a ``%run`` script alike)."""
    c = collective(backend)
    return {
        "exception": f"t = torch.ones(1)\nif r == 1:\n    raise ValueError('matrix fault on rank 1')\n{c}\n",
        "exit 3": f"t = torch.ones(1)\nif r == 1:\n    sys.exit(3)\n{c}\n",
        "hang": f"t = torch.ones(1)\nif r == 0:\n    {c}\n",
        "interrupt": (f"t = torch.ones(1)\nif r == 0:\n    {c}\nprint('looping on', r, flush=True)\n"
                      "while True:\n    time.sleep(0.01)\n"),
        "second interrupt": (f"t = torch.ones(1)\nif r == 0:\n    {c}\nprint('looping on', r, flush=True)\n"
                             "while True:\n    try:\n        time.sleep(0.01)\n    except KeyboardInterrupt:\n"
                             "        print('ignoring the interrupt on', r, flush=True)\n"),
        "death": f"t = torch.ones(1)\nif r == 1:\n    os.kill(os.getpid(), 9)\n{c}\n",
    }[fault]


HEADER = "import os, sys, time, torch, torch.distributed as dist\nr = int(os.environ['RANK'])\n"


class Row:
    """One (driver, backend) row on the module's kernel: its cluster, and each fault run through the driver."""

    def __init__(self, kernel: KernelSession, driver: str, backend: str, folder: Path):
        self.k, self.driver, self.backend, self.folder = kernel, driver, backend, folder

    def start(self) -> None:
        k = self.k
        running = getattr(k, "matrix_backend", None)
        if running != self.backend:
            out = k.run(f"%%distributed -n 2 --backend {self.backend} --timeout 120 --watchdog 2 --interrupt-grace 30"
                        f"{' --restart' if running else ''}\nimport torch", timeout=300)
            assert "Ready: 2 rank(s)" in out.stdout, out.stdout
            k.matrix_backend = self.backend
            self.setup()

    def setup(self) -> None:
        """A set-up cell (replayed by ``%dist restart``): the names the faults use, and a variable to keep."""
        hvd = "import horovod.torch as hvd\n" if self.backend == "horovod" else ""
        self.k.run(f"%%distributed\n{HEADER}{hvd}kept = 100 + r")

    def code(self, fault: str) -> str:
        body = fault_code(fault, self.backend)
        if self.driver == "cell":
            return f"%%distributed --output all\n{body}"
        script = self.folder / f"{fault.replace(' ', '_')}.py"
        hvd = "import horovod.torch as hvd\n" if self.backend == "horovod" else ""
        script.write_text(HEADER + hvd + body)
        return f"%%distributed --output all\n%run {script}"

    def run(self, fault: str) -> Shown:
        k = self.k
        if fault in ("interrupt", "second interrupt"):
            msg_id = k.start(self.code(fault))
            k.wait_for_stdout(msg_id, "[rank 1] looping on 1", timeout=120)
            k.km.interrupt_kernel()
            if fault == "second interrupt":
                k.wait_for_stdout(msg_id, "[rank 1] ignoring the interrupt on 1", timeout=60)
                k.km.interrupt_kernel()
            out = k.collect(msg_id, timeout=120)
        else:
            out = k.run(self.code(fault), allow_error=True, timeout=200)
        assert out.error is not None, f"{fault}: the cell did not fail\n{out.stdout}"
        return Shown(out.shown + "\n" + out.stdout, out.error["ename"])

    def next_cells(self) -> list[str]:
        """The next two cells, every rank's output shown: the world size and the kept variable, per rank."""
        size = "hvd.size()" if self.backend == "horovod" else "dist.get_world_size()"
        texts = []
        for _ in range(2):
            out = self.k.run(f"%%distributed --output all\nprint('world', {size}, 'kept', kept)", timeout=120)
            texts.append(out.shown + "\n" + out.stdout)
            assert sorted(out.stdout.strip().splitlines()) == ["[rank 0] world 2 kept 100",
                                                               "[rank 1] world 2 kept 101"], out.stdout + out.shown
        return texts


def expected(fault: str, row: Row) -> list[str]:
    """What the error of ``fault`` must say in ``row``: the root cause (rank, type, the user's line) and the
    other rank."""
    where = "synchronize" if row.backend == "horovod" else "all_reduce"
    user_line = {"cell": "cell line", "%run": f"{fault.replace(' ', '_')}.py:"}[row.driver]
    return {
        "exception": ["first failure on rank 1: ValueError: matrix fault on rank 1",
                      "raise ValueError('matrix fault on rank 1')", "rank 0: released because rank 1 failed"],
        "exit 3": ["first failure on rank 1: exited with code 3", "rank 0: released because rank 1 failed"],
        # (a c10d collective that rank 1 finished without: the Flight Recorder proves it at once, without the
        # watchdog; Horovod's: the watchdog's proof)
        "hang": ([f"collective left alone: rank 0 waits in {where} #", "which rank 1 finished the cell without calling",
                  f"rank 0: waiting in {where} ({user_line}"] if row.backend != "horovod" else
                 ["hang: no progress for 2 s", f"rank 0: waiting in {where} ({user_line}", "rank 1: finished the cell"]),
        "interrupt": ["Interrupted: every rank received SIGINT"],
        # (rank 0, released from its collective, may still be unwinding: it is named too then)
        "second interrupt": ["1 did not stop (a second interrupt ended the wait):", f"rank 1: running {user_line}"],
        "death": ["rank 1 died: killed by SIGKILL", "MPI ended the other rank(s) too"],
    }[fault]


#: The ename of each fault's error.
ENAMES = {"exception": "RankError", "exit 3": "RankError", "hang": "HangError", "interrupt": "KeyboardInterrupt",
          "second interrupt": "KeyboardInterrupt", "death": "RankDied"}


def needs_restart(fault: str, backend: str) -> bool:
    """Whether the error says the ranks restart (or must be restarted) rather than keep their variables."""
    # Horovod: rank 0 waits in its MPI collective in every fault, which nothing releases
    return fault in ("death", "second interrupt") or backend == "horovod"


def unavailable(backend: str) -> str | None:
    return backend_spec(backend).unavailable()


@pytest.fixture(scope="module", params=ROWS, ids=lambda row: f"{row[0]}-{row[1]}")
def row(request: pytest.FixtureRequest, kernel: KernelSession, tmp_path_factory: pytest.TempPathFactory) -> Row:
    driver, backend = request.param
    if unavailable(backend):
        pytest.skip(unavailable(backend))
    r = Row(kernel, driver, backend, tmp_path_factory.mktemp(f"matrix-{backend}"))
    r.start()
    return r


@pytest.mark.parametrize("fault", FAULTS)
def test_the_fault_promise(row: Row, fault: str) -> None:
    why = SAME_AS.get((row.driver, fault)) or SAME_AS.get((f"{row.driver}-{row.backend}", fault))
    if why:
        pytest.skip(why)
    shown = row.run(fault)
    text = shown.text
    assert shown.ename == ENAMES[fault], text
    for line in expected(fault, row):
        assert line in text, f"{row.driver}/{row.backend}/{fault}: no {line!r} in\n{text}"
    assert "magics.py" not in text and "supervisor.py" not in text, text  # no frame of jdist's own
    if fault == "exception":
        assert text.count("raise ValueError('matrix fault on rank 1')") == 1, text  # the traceback once
    if needs_restart(fault, row.backend):
        automatic = "Restarted 2 rank(s)" in text
        assert automatic or "Run %dist restart" in text, text  # the one restart line
        if fault == "death":  # until then: both ranks dead, and a cell says the one line to run
            assert row.k.run("%dist status").stdout.count("dead") == 2
            out = row.k.run("%%distributed\nx = 1", allow_error=True)
            assert out.error["ename"] == "ClusterError" and len(out.shown.splitlines()) == 1, out.shown
            assert "are gone" in out.shown and "%dist restart" in out.shown
        if fault == "second interrupt" and not automatic:  # rank 1 still loops: a cell would wait behind it
            out = row.k.run("%%distributed\nx = 1", allow_error=True)
            assert out.error["ename"] == "ClusterError" and "This cell did not run: rank" in out.shown, out.shown
            assert "  rank 1: running cell line" in out.shown, out.shown  # where the earlier cell left it
            row.k.run("marker = 1")
            for command in ("%dist pull kept", "%dist push marker"):  # nor what these would send the ranks
                out = row.k.run(command, allow_error=True)
                assert out.error["ename"] == "ClusterError" and f"{command} did not run: rank" in out.shown, out.shown
        if not automatic:
            assert "Restarted 2 rank(s)" in row.k.run("%dist restart", timeout=300).stdout
    else:
        assert "variables on the ranks are kept" in text or "Restarted" not in text, text
    later = row.next_cells()
    noise = [line for t in (text, *later) for line in t.splitlines() if any(n in line for n in NOISE)]
    assert not noise, noise


def test_no_process_is_left_after_dist_stop(kernel: KernelSession) -> None:
    """After the rows (their faults, restarts and released ranks), ``%dist stop`` leaves no process of theirs."""
    import psutil
    from conftest import wait_for

    if getattr(kernel, "matrix_backend", None) is None:
        pytest.skip("no row ran")
    cluster_id = kernel.value("jdist.kernel.cluster.current().cluster_id")
    kernel.run("%dist stop")
    kernel.matrix_backend = None

    def left() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if cluster_id in " ".join(p.info["cmdline"] or [])]

    wait_for(lambda: not left(), timeout=30, what=f"the processes of cluster {cluster_id} to end")


def test_every_cell_of_the_matrix_is_checked_or_says_why_not() -> None:
    """Every (driver, fault) is run here, checked by a named test that exists, or not applicable with a reason."""
    here = {driver for driver, _ in ROWS}
    for driver in DRIVERS:
        for fault in FAULTS:
            places = [driver in here, (driver, fault) in ELSEWHERE, (driver, fault) in NOT_APPLICABLE]
            assert sum(places) == 1, (driver, fault, places)
    rows = {*(d for d, _ in ROWS), *(f"{d}-{b}" for d, b in ROWS)}
    assert all(row in rows and fault in FAULTS for row, fault in SAME_AS), SAME_AS
    for where in ELSEWHERE.values():
        file, name = where.split("::")
        tree = ast.parse((TESTS / file).read_text())
        assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, where
    for driver in DRIVERS:
        backends = {b for d, b in ROWS if d == driver}
        if driver in here and backends != set(TORCH_BACKENDS):
            assert driver in ONE_BACKEND, driver
    assert all(re.fullmatch(r"[^\n]+", why) for why in (*NOT_APPLICABLE.values(), *ONE_BACKEND.values(),
                                                        *SAME_AS.values()))
