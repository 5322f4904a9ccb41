"""Shared fixtures: a real Jupyter kernel driven over its messaging protocol.

Integration tests run ``%%distributed`` cells in a real ipykernel (the same code path a
notebook uses: main-thread rules of ipykernel 7, display messages, interrupts), which
starts a real MPI ipyparallel cluster. Nothing under test is mocked.
"""

from __future__ import annotations

import os
import queue
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


@dataclass
class CellOutput:
    stdout: str = ""
    stderr: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    elapsed: float = 0.0
    pager: str = ""  # help text (``%%magic?``) comes as a pager payload of the reply

    @property
    def traceback(self) -> str:
        return strip_ansi("\n".join(self.error["traceback"])) if self.error else ""


class KernelSession:
    """A live ipykernel; ``run(code)`` executes a cell and collects what a notebook would show."""

    def __init__(self, env: dict[str, str]):
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", env=env)

    def run(self, code: str, timeout: float = 180, allow_error: bool = False) -> CellOutput:
        out = CellOutput()

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                setattr(out, content["name"], getattr(out, content["name"]) + content["text"])
            elif kind in ("display_data", "execute_result", "update_display_data"):
                out.displays.append({"type": kind, **content})
            elif kind == "error":
                out.error = content

        t0 = time.perf_counter()
        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout, allow_stdin=False)
        for payload in reply["content"].get("payload", []):
            if payload.get("source") == "page":
                out.pager += payload["data"].get("text/plain", "")
        out.elapsed = time.perf_counter() - t0
        if out.error and not allow_error:
            raise AssertionError(f"cell failed:\n{code}\n{out.traceback}\nstdout:\n{out.stdout}")
        return out

    def start(self, code: str) -> str:
        """Send a cell without waiting (for interrupt tests); returns the msg id."""
        return self.kc.execute(code)

    def collect(self, msg_id: str, timeout: float) -> CellOutput:
        """Collect the outputs of a cell sent with :meth:`start` until it goes idle."""
        out = CellOutput()
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
