"""Shared fixtures: a real Jupyter kernel driven over its messaging protocol, and the test tiers.

Integration tests run ``%%distributed`` cells in a real ipykernel (the same code path a
notebook uses: main-thread rules of ipykernel 7, display messages, interrupts), which
starts a real MPI ipyparallel cluster. Nothing under test is mocked.

Tiers: a test that starts a kernel, an MPI cluster, a Jupyter server or a browser is marked
``cluster`` (automatically, from the fixtures it uses, or explicitly); ``make test-fast``
runs the others (``-m "not cluster"``), ``make test`` runs everything.
"""

from __future__ import annotations

import os
import queue
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: tests/extensions holds an installed plugin package: only tests/test_extending.py puts it on a path
#: (collecting it for doctests would add it to this process's, and its plugins to every test).
collect_ignore = ["extensions"]


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


#: Fixtures that start kernels, clusters, servers or browsers: their tests are in the ``cluster`` tier.
HEAVY_FIXTURES = {"kernel_env", "cluster", "server", "lab", "browser"}


#: Test files followed directly by a notebook that trains on what they started (one Ray per session).
NEXT_TO = {"tests/test_ray.py": "notebooks/12-ray-train.ipynb"}

#: ``make test`` runs two pytest-xdist workers; each file is a family that one worker runs whole
#: (its module-scoped kernels and clusters start once). A file named here joins another's family:
#: it uses what that one started.
FAMILY_OF = {"notebooks/12-ray-train.ipynb": "tests/test_ray.py"}

#: The families that take longest (the 2-core CI machine's last measurement): handed out first, so that
#: no worker is left with a long one while the other idles.
LONGEST_FIRST = ("tests/test_multinode.py", "tests/test_ray.py", "tests/test_cli.py", "tests/test_fault_matrix.py",
                 "tests/test_deepspeed.py", "tests/test_training.py", "tests/test_tune.py", "tests/test_lifecycle.py",
                 "tests/test_tf.py", "tests/test_mesh.py", "tests/test_browser.py", "tests/test_faults.py")


def family(nodeid: str) -> str:
    """The file whose worker runs the test ``nodeid``: its own, or the one :data:`FAMILY_OF` names."""
    path = nodeid.split("::")[0]
    return FAMILY_OF.get(path, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``make test``), a worker takes a whole family at a time, longest first."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFamily(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return family(nodeid)

    config.option.loadscopereorder = False  # the collection's order: LONGEST_FIRST
    return ByFamily(config, log)


class WorkerTimes:
    """On the controller of an xdist run (``make test``): each worker's busy seconds and families, printed at the
    end and written to ``build/pytest-durations.json`` (test -> seconds, set-up and teardown included), the
    figures :data:`LONGEST_FIRST` and the 15-minute budget are kept with."""

    def __init__(self) -> None:
        self.tests: dict[str, float] = {}
        self.worker_of: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        if node is not None:
            self.tests[report.nodeid] = self.tests.get(report.nodeid, 0.0) + report.duration
            self.worker_of[report.nodeid] = node.gateway.id

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if not self.tests:
            return
        import collections
        import json

        families: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for nodeid, seconds in self.tests.items():
            families[self.worker_of[nodeid]][family(nodeid)] += seconds
        busy = {worker: sum(fam.values()) for worker, fam in families.items()}
        for worker in sorted(busy):
            top = families[worker].most_common(4)
            terminalreporter.write_line(f"{worker}: busy {busy[worker]:.0f} s; longest families: "
                                        + ", ".join(f"{name} {t:.0f} s" for name, t in top))
        out = config.rootpath / "build" / "pytest-durations.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({"workers": {w: round(t, 1) for w, t in busy.items()},
                                   "families": {w: {f: round(t, 1) for f, t in fam.items()}
                                                for w, fam in families.items()},
                                   "tests": {n: round(t, 2) for n, t in sorted(self.tests.items())}}, indent=1))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist, where it prints nothing)
        config.pluginmanager.register(WorkerTimes(), "jdist-worker-times")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        heavy = HEAVY_FIXTURES & set(getattr(item, "fixturenames", ()))
        if heavy or item.nodeid.endswith(".ipynb") or ".ipynb::" in item.nodeid:
            item.add_marker(pytest.mark.cluster)
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(family(item.nodeid), len(rank)))  # stable: the rest keep their order
    for tests, notebook in NEXT_TO.items():
        cells = [item for item in items if item.nodeid.startswith(notebook)]
        last = max((i for i, item in enumerate(items) if item.nodeid.startswith(tests + "::")), default=None)
        if cells and last is not None:
            after = items[last + 1:]
            items[last + 1:] = cells + [item for item in after if item not in cells]


#: Programs a test outside the ``cluster`` tier must not start (make test-fast stays fast and local).
CLUSTER_PROGRAMS = ("mpiexec", "torchrun", "srun", "salloc", "ipcontroller", "ipengine", "jupyter", "chromium")


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_cluster(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked ``cluster`` that starts an MPI job, torchrun, Slurm, a Jupyter server or a
    browser fails at once, naming the marker it needs."""
    if request.node.get_closest_marker("cluster") is not None:
        return
    import subprocess

    real_init = subprocess.Popen.__init__

    def init(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.path.basename(str(argv[0])) if argv else ""
        if program.startswith(CLUSTER_PROGRAMS):
            raise AssertionError(f"{request.node.nodeid} starts {program}: mark it @pytest.mark.cluster "
                                 "(make test-fast runs no clusters).")
        real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)


def wait_for(predicate: Any, timeout: float = 60, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll ``predicate()`` until it returns something truthy (returned); AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value: {last!r}")


def sigint_in_a_destructor() -> None:
    """Send SIGINT to this process so that its handler runs inside a destructor: Python prints the
    KeyboardInterrupt it raises ("Exception ignored in ...") and drops it, as when it lands in pyzmq's
    ``Frame.__dealloc__`` while a driver polls. Call it on the main thread (the tests run its source in the
    kernel too)."""
    import os
    import signal
    import time

    class Freed:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here

    Freed()


@dataclass
class CellOutput:
    stdout: str = ""
    stderr: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    elapsed: float = 0.0
    pager: str = ""  # help text (``%%magic?``) comes as a pager payload of the reply
    prompts: list[str] = field(default_factory=list)  # input boxes the cell opened (run(replies=...))
    replies_ran_out: bool = False

    @property
    def traceback(self) -> str:
        return strip_ansi("\n".join(self.error.get("traceback") or [])) if self.error else ""

    @property
    def shown(self) -> str:
        """What the notebook shows of an error: its traceback, or (IPython's UsageError) the stderr line."""
        return (self.traceback + "\n" + strip_ansi(self.stderr)).strip()


#: A reply (``KernelSession.run(replies=...)``) that interrupts the kernel while its input box is open.
INTERRUPT = object()


class KernelSession:
    """A live ipykernel; ``run(code)`` executes a cell and collects what a notebook would show."""

    def __init__(self, env: dict[str, str]):
        from jupyter_client.manager import start_new_kernel

        for attempt in (1, 2):
            try:
                self.km, self.kc = start_new_kernel(kernel_name="python3", env=env)
                return
            except RuntimeError as exc:
                # jupyter_client picks free TCP ports, closes them and writes them to the connection file; under
                # the suite's load another process (Ray, gloo, MPI) once took one before the kernel bound it
                # ("Address already in use", the kernel died): a second start gets new ports
                if attempt == 2 or "Kernel died before replying" not in str(exc):
                    raise

    def run(self, code: str, timeout: float = 180, allow_error: bool = False,
            replies: list[Any] | None = None) -> CellOutput:
        """Run ``code``; ``replies``: what is typed into each input box the cell opens, in order: a line,
        ``(seconds, line)`` (typed after that long), a function (called while the box is open; it returns
        the line), or :data:`INTERRUPT` (the kernel is interrupted while the box is open). Their prompts go to ``out.prompts``; past the last reply each box gets "q" and
        ``out.replies_ran_out``."""
        out = CellOutput()
        answers = list(replies or [])

        def stdin_hook(msg: dict[str, Any]) -> None:
            out.prompts.append(msg["content"]["prompt"])
            out.replies_ran_out = out.replies_ran_out or not answers
            answer = answers.pop(0) if answers else "q"
            if answer is INTERRUPT:
                self.km.interrupt_kernel()
                return
            if isinstance(answer, tuple):
                time.sleep(answer[0])
                answer = answer[1]
            elif callable(answer):
                answer = answer()
            self.kc.input(answer)

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                setattr(out, content["name"], getattr(out, content["name"]) + content["text"])
            elif kind in ("display_data", "execute_result", "update_display_data"):
                out.displays.append({"type": kind, **content})
            elif kind == "error":
                out.error = content

        t0 = time.perf_counter()
        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout, allow_stdin=replies is not None,
                                            stdin_hook=stdin_hook if replies is not None else None)
        content = reply["content"]
        if content["status"] == "error" and out.error is None:  # IPython's UsageError: the reply only
            out.error = {"ename": content.get("ename"), "evalue": content.get("evalue"), "traceback": []}
        for payload in content.get("payload", []):
            if payload.get("source") == "page":
                out.pager += payload["data"].get("text/plain", "")
        out.elapsed = time.perf_counter() - t0
        if out.error and not allow_error:
            raise AssertionError(f"cell failed:\n{code}\n{out.shown}\nstdout:\n{out.stdout}")
        return out

    def start(self, code: str) -> str:
        """Send a cell without waiting (for interrupt tests); returns the msg id."""
        return self.kc.execute(code)

    def wait_for_stdout(self, msg_id: str, *texts: str, timeout: float = 60) -> CellOutput:
        """Read the output of a cell sent with :meth:`start` until its stdout contains every one of
        ``texts``; :meth:`collect` then goes on from there (with the output so far)."""
        self._partial = self._read(msg_id, timeout, until=lambda out: all(t in out.stdout for t in texts))
        return self._partial

    def collect(self, msg_id: str, timeout: float) -> CellOutput:
        """Collect the outputs of a cell sent with :meth:`start` until it goes idle."""
        out = self._read(msg_id, timeout, until=None, out=getattr(self, "_partial", None))
        self._partial = None
        return out

    def interrupted(self, code: str, *texts: str, wait: float = 60, timeout: float = 120) -> CellOutput:
        """Run ``code``, interrupt the kernel once its stdout shows every one of ``texts`` (within ``wait``
        s), and collect the cell until it ends (within ``timeout`` s)."""
        msg_id = self.start(code)
        self.wait_for_stdout(msg_id, *texts, timeout=wait)
        self.km.interrupt_kernel()
        return self.collect(msg_id, timeout=timeout)

    def _read(self, msg_id: str, timeout: float, until: Any, out: CellOutput | None = None) -> CellOutput:
        out = out or CellOutput()
        deadline = time.monotonic() + timeout
        t0 = time.perf_counter()
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                setattr(out, content["name"], getattr(out, content["name"]) + content["text"])
            elif kind == "error":
                out.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                out.elapsed = time.perf_counter() - t0
                if until is not None:
                    raise AssertionError(f"the cell ended before the awaited output; stdout:\n{out.stdout}\n{out.traceback}")
                return out
            if until is not None and until(out):
                return out
        raise AssertionError(f"cell did not finish within {timeout} s; stdout so far:\n{out.stdout}")

    def value(self, expr: str) -> Any:
        """Evaluate ``expr`` in the kernel and return it (via repr -> literal_eval)."""
        import ast

        out = self.run(f"print(repr({expr}))")
        return ast.literal_eval(out.stdout.strip())

    def shutdown(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


class Panel:
    """What JupyterLab's Debugger panel sends: ``debug_request`` on the control channel, ``debug_event`` on IOPub."""

    def __init__(self, kernel: KernelSession):
        self.kc = kernel.kc
        self.seq = 0
        self.events: list[dict] = []
        self.iopub: list[dict] = []

    def __call__(self, command: str, **arguments) -> dict:
        self.seq += 1
        msg = self.kc.session.msg("debug_request", {"type": "request", "seq": self.seq, "command": command,
                                                    "arguments": arguments})
        self.kc.control_channel.send(msg)
        while True:
            reply = self.kc.control_channel.get_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]

    def wait_event(self, name: str, timeout: float = 60) -> dict:
        """The next ``debug_event`` called ``name`` on IOPub (every IOPub message read goes to ``iopub``)."""
        msg = self.wait_iopub(lambda m: m["msg_type"] == "debug_event" and m["content"].get("event") == name,
                              timeout, f"a {name} event")
        return msg["content"]

    def wait_iopub(self, matches: Callable[[dict], bool], timeout: float = 60, what: str = "the message") -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            self.iopub.append(msg)
            if msg["msg_type"] == "debug_event":
                self.events.append(msg["content"])
            if matches(msg):
                return msg
        raise AssertionError(f"no {what} within {timeout} s; debug events: {self.events}")


@pytest.fixture(scope="session", autouse=True)
def _private_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Kernel connection files and jdist cluster state files go to a temporary runtime dir, not ~."""
    os.environ["JUPYTER_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("jupyter-runtime"))


@pytest.fixture(scope="session")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("kernel")
    env = dict(os.environ)
    env.update(
        JDIST_RUN_DIR=str(base / "runs"),
        IPYTHONDIR=str(base / "ipython"),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(scope="module")
def kernel(kernel_env: dict[str, str]):
    """A kernel with jdist loaded; the module's tests share it (and its cluster)."""
    session = KernelSession(kernel_env)
    session.run("%load_ext jdist")
    yield session
    session.run("%dist stop", allow_error=True)
    session.shutdown()


@pytest.fixture(scope="module")
def cluster_kernel(kernel: KernelSession) -> KernelSession:
    """The module's kernel with a 2-rank CPU DDP cluster running."""
    kernel.run("%%distributed -n 2 --backend ddp --timeout 30\nimport torch, torch.nn as nn")
    return kernel
