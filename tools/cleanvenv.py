"""Clean virtual environments for the packaging checks (``make check-wheel``, ``check-extras``,
``check-binder``): what a user's own environment would be, not the repository's ``.venv``.

They are made with ``uv`` (from ``jdist[test]``, so ``make venv`` installs it): its cache
(``~/.cache/uv``) hard-links packages into each new venv, so a venv with torch and JupyterLab
takes seconds once the cache is warm. torch is the one exception to "from the registries as a
user gets them": a plain ``torch`` from PyPI is a multi-GB CUDA build, so the checks install the
build that ``TORCH_SPEC`` (the Makefile's, default ``torch==2.13.0``) names, fetched once with pip
under this machine's pip configuration (on these machines the CPU build lies on disk) and kept in
``~/.cache/jdist/wheels/torch``.

Nothing here imports jdist: the checks run it from the venvs they make, never from the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("JDIST_CACHE", Path.home() / ".cache" / "jdist"))
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")


class CheckFailed(Exception):
    """A check's verdict: one line that says what failed and, where it can, the fix."""


def say(message: str) -> None:
    print(message, flush=True)


def uv_bin() -> str:
    """The ``uv`` beside this interpreter (``.venv/bin/uv``), else the one on PATH."""
    here = Path(sys.executable).with_name("uv")
    if here.exists():
        return str(here)
    found = shutil.which("uv")
    if found:
        return found
    raise CheckFailed("uv is not installed: run `make venv` (jdist[test] brings it) or `pip install uv`")


def base_python() -> str:
    """The interpreter the repository's venv was made from (a user's Python, not the venv's)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def torch_wheel(spec: str = TORCH_SPEC) -> Path:
    """The wheel of ``spec``, fetched once with pip (this machine's pip configuration) and cached."""
    folder = CACHE / "wheels" / "torch"
    name = spec.split("==")[0].strip().lower()
    version = spec.split("==")[1].strip() if "==" in spec else ""
    for wheel in sorted(folder.glob(f"{name}-{version}*.whl")):
        return wheel
    folder.mkdir(parents=True, exist_ok=True)
    say(f"   fetching {spec} once into {folder} (pip download)")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder), spec],
                          capture_output=True, text=True)
    wheels = sorted(folder.glob(f"{name}-{version}*.whl"))
    if done.returncode != 0 or not wheels:
        raise CheckFailed(f"pip could not fetch {spec}: {done.stderr.strip().splitlines()[-1:] or done.stdout}; "
                          "set TORCH_SPEC to a torch that this machine's pip can install")
    return wheels[0]


def clean_env(venv: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment a user's shell would have: no PYTHONPATH, no repository venv on PATH, the
    given venv's bin first; JUPYTER_*/IPYTHONDIR/JDIST_* left to ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "JDIST_", "PYTHON", "VIRTUAL_ENV", "CONDA", "IPYTHON", "UV_"))}
    repo_bin = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(repo_bin).resolve()]
    if venv is not None:
        path.insert(0, str(venv / "bin"))
        env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join(path)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


class CleanVenv:
    """A new venv at ``path`` (removed first), with packages installed by uv."""

    def __init__(self, path: Path, python: str | None = None, seed: bool = False):
        self.path = path
        if path.exists():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [uv_bin(), "venv", "-q", "--python", python or base_python(), str(path)]
        if seed:
            cmd.insert(3, "--seed")  # pip in the venv, as a conda or python -m venv environment has
        self._run(cmd, "uv venv")

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def install(self, *requirements: str, what: str = "") -> float:
        """``uv pip install`` into this venv; returns the seconds it took."""
        t0 = time.monotonic()
        # jdist itself is built afresh each time: uv keeps a build of a local folder until its pyproject.toml
        # changes, and the checks must test this tree's code (a stale build was seen here)
        self._run([uv_bin(), "pip", "install", "-q", "--python", self.python, "--refresh-package", "jdist",
                   "--reinstall-package", "jdist", *requirements],
                  f"uv pip install {what or ' '.join(requirements)}")
        return time.monotonic() - t0

    def _run(self, cmd: Sequence[str], what: str) -> None:
        done = subprocess.run(list(cmd), capture_output=True, text=True, env=clean_env(), cwd=str(self.path.parent))
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
            raise CheckFailed(f"{what} failed (exit {done.returncode}):\n   " + "\n   ".join(tail))


def run(cmd: Sequence[str], *, env: dict[str, str], cwd: Path, timeout: float = 300,
        what: str = "") -> subprocess.CompletedProcess:
    """Run a command; a non-zero exit is a :class:`CheckFailed` with its last lines."""
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=str(cwd), timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"{what or cmd[0]} did not finish within {timeout:.0f} s") from exc
    if done.returncode != 0:
        tail = (done.stderr + done.stdout).strip().splitlines()[-15:]
        raise CheckFailed(f"{what or ' '.join(cmd)} failed (exit {done.returncode}):\n   " + "\n   ".join(tail))
    return done
