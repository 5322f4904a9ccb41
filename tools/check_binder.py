#!/usr/bin/env python
"""``make check-binder``: what mybinder would build from ``binder/``, without Docker, and the
binder notebooks run in it under mybinder's 2 GB memory limit.

1. ``jupyter-repo2docker --no-build --debug`` (from PyPI, in its own cached venv) renders the
   Dockerfile it would build; the build pack that repo2docker's own detection picks must be
   ``PythonBuildPack`` (an ``environment.yml`` would switch it to conda), on the Python of
   ``binder/runtime.txt``, with ``binder/requirements.txt`` installed by the kernel
   environment's pip and ``binder/postBuild`` run; no Horovod build, TensorFlow, Ray or
   DeepSpeed in the requirements; torch pinned to a ``+cpu`` build with PyTorch's CPU index
   named (PyPI's default torch is a multi-GB CUDA build).
2. Those steps, reproduced in a clean venv: repo2docker's base environment (JupyterLab,
   Jupyter Server, Notebook, ipykernel and nbclient at the versions of repo2docker's own lock
   file for that Python), then ``binder/requirements.txt`` (torch from this machine's
   registries instead of PyTorch's index, which these machines cannot reach: the version must
   match; ``.`` is this checkout), then ``binder/postBuild`` with ``KERNEL_PYTHON_PREFIX`` set.
3. Each notebook of ``binder/notebooks.txt`` opened by that venv's ``jupyter server`` and run
   cell by cell through the kernel's websocket (cells marked ``# NBVAL_CHECK_OUTPUT`` must print
   what the saved notebook shows), inside a memory cgroup of its own whose limit is 2 GiB, swap
   included where the kernel accounts it (cgroup v2 ``memory.max`` + ``memory.swap.max``, or
   cgroup v1 ``memory.limit_in_bytes`` + ``memory.memsw.limit_in_bytes``). Everything the
   notebook needs (the Jupyter server, the kernel, mpiexec, the ranks) lives in that cgroup, as
   in a binder pod. Printed per
   notebook: the cgroup's peak (``memory.peak`` / ``memory.max_usage_in_bytes``: resident
   memory plus page cache, which the kernel reclaims before it kills anything) and the peak of
   resident (anonymous + shared) memory sampled every 0.2 s; an OOM kill fails the notebook.

Needs root (or a delegated cgroup): it says so in one line otherwise. Prints
``check-binder: N passed, M failed``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cleanvenv import CACHE, REPO, TORCH_SPEC, CheckFailed, CleanVenv, clean_env, run, say, torch_wheel

R2D_VERSION = "2026.4.0"
LIMIT = 2 * 1024**3  # mybinder's memory limit per user pod
BINDER = REPO / "binder"
LEFT_OUT = ("horovod", "tensorflow", "tf", "ray", "deepspeed")  # what the lean image must not carry
BASE_PACKAGES = ("jupyterlab", "jupyter_server", "notebook", "ipykernel", "nbclient")


# -- 1. what repo2docker would do --------------------------------------------------------------
def repo2docker() -> Path:
    """repo2docker's venv (cached per version in ~/.cache/jdist)."""
    venv = CACHE / f"repo2docker-{R2D_VERSION}"
    if not (venv / "bin" / "jupyter-repo2docker").exists():
        CleanVenv(venv).install(f"jupyter-repo2docker=={R2D_VERSION}")
    return venv


DETECT = """
import os, sys, json
from repo2docker.app import Repo2Docker
r2d = Repo2Docker()
os.chdir(sys.argv[1])
for bp in r2d.buildpacks:
    pack = bp(r2d.base_image)
    if pack.detect():
        break
else:
    pack = r2d.default_buildpack(r2d.base_image)
print(json.dumps({"pack": type(pack).__name__, "python": getattr(pack, "python_version", None)}))
"""


def plan(r2d: Path) -> dict:
    """The build pack and the Dockerfile repo2docker would build from this checkout."""
    env = clean_env(r2d)
    picked = json.loads(run([str(r2d / "bin" / "python"), "-c", DETECT, str(REPO)], env=env, cwd=REPO,
                            what="repo2docker's build pack detection").stdout.strip().splitlines()[-1])
    rendered = run([str(r2d / "bin" / "jupyter-repo2docker"), "--no-build", "--debug", str(REPO)], env=env,
                   cwd=Path(tempfile.gettempdir()), what="jupyter-repo2docker --no-build")
    picked["dockerfile"] = rendered.stdout + rendered.stderr
    return picked


def requirements() -> list[str]:
    lines = []
    for raw in (BINDER / "requirements.txt").read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def check_plan(p: dict) -> list[str]:
    """What repo2docker would build is the lean Python-pack image; returns its steps."""
    docker = p["dockerfile"]
    want_py = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    if (BINDER / "environment.yml").exists() or p["pack"] != "PythonBuildPack":
        raise CheckFailed(f"repo2docker picks {p['pack']}, not PythonBuildPack: remove binder/environment.yml "
                          "(it takes precedence over requirements.txt)")
    if str(p["python"]) != want_py or f"python={want_py}" not in docker:
        raise CheckFailed(f"repo2docker builds Python {p['python']}, binder/runtime.txt asks for {want_py}")
    steps = [line for line in docker.splitlines() if line.startswith("RUN ")]
    pip_step = [s for s in steps if 'bin/pip install --no-cache-dir -r "binder/requirements.txt"' in s]
    if not pip_step or "${KERNEL_PYTHON_PREFIX}/bin/pip" not in pip_step[0]:
        raise CheckFailed("the Dockerfile does not install binder/requirements.txt with the kernel env's pip")
    if "RUN ./binder/postBuild" not in docker:
        raise CheckFailed("the Dockerfile does not run binder/postBuild")
    if re.search(r"\b(conda|mamba) env update\b", docker) or "apt.txt" in docker:
        raise CheckFailed("the Dockerfile installs a conda environment file or apt.txt: the binder is meant to be pip only")
    reqs = requirements()
    text = " ".join(reqs).lower()
    extras = re.findall(r"^\.\[([^\]]*)\]$", "\n".join(reqs), re.MULTILINE)
    bad = [x for x in LEFT_OUT if re.search(rf"\b{x}\b", text) or (extras and x in extras[0].split(","))]
    if bad:
        raise CheckFailed(f"binder/requirements.txt brings {bad}: the lean image leaves them out (their notebooks "
                          "say how to run them locally)")
    if "--extra-index-url https://download.pytorch.org/whl/cpu" not in reqs and \
            "--index-url https://download.pytorch.org/whl/cpu" not in reqs:
        raise CheckFailed("binder/requirements.txt does not name PyTorch's CPU index: pip would install the CUDA torch")
    if not any(re.fullmatch(r"torch==[\d.]+\+cpu", r) for r in reqs):
        raise CheckFailed("binder/requirements.txt must pin torch==X.Y.Z+cpu (the CPU build)")
    if "--no-cache-dir" not in pip_step[0]:
        raise CheckFailed("pip step without --no-cache-dir: unexpected repo2docker")
    return [s[4:] for s in steps if "binder/" in s]


def base_env_pins(python: str, r2d: Path) -> list[str]:
    """JupyterLab and friends at the versions of repo2docker's base environment for ``python``."""
    lock = next((r2d / "lib").glob(f"python*/site-packages/repo2docker/buildpacks/conda/environment.py-{python}-linux-64.lock"))
    text = lock.read_text()
    pins = []
    for name in BASE_PACKAGES:
        found = re.search(rf"/{re.escape(name)}-(\d[^-]*)-[^/]*\.conda", text)
        if not found:
            raise CheckFailed(f"{name} is not in repo2docker's lock file {lock.name}")
        pins.append(f"{name}=={found.group(1)}")
    return pins


# -- 2. the same steps in a clean venv -------------------------------------------------------------
def build_env(work: Path, python: str, r2d: Path) -> CleanVenv:
    venv = CleanVenv(work / "binder-venv", seed=True)
    pins = base_env_pins(python, r2d)
    venv.install(*pins, what="repo2docker's base environment " + " ".join(pins))
    wheel = torch_wheel()
    reqs = []
    for line in requirements():
        if line.startswith(("--extra-index-url", "--index-url")):
            continue  # PyTorch's index: not reachable from these machines; torch comes from the wheel below
        pinned = re.fullmatch(r"torch==([\d.]+)\+cpu", line)
        if pinned:
            if not wheel.name.startswith(f"torch-{pinned.group(1)}"):
                raise CheckFailed(f"binder/requirements.txt pins torch {pinned.group(1)} but TORCH_SPEC is {TORCH_SPEC}: "
                                  "keep them equal")
            line = str(wheel)
        elif line.startswith(".["):
            line = str(REPO) + line[1:]
        reqs.append(line)
    req_file = work / "requirements.txt"
    req_file.write_text("\n".join(reqs) + "\n")
    venv.install("-r", str(req_file), what="binder/requirements.txt")
    env = clean_env(venv.path, KERNEL_PYTHON_PREFIX=str(venv.path), NB_PYTHON_PREFIX=str(venv.path),
                    JUPYTER_CONFIG_DIR=str(work / "jupyter-config"), JUPYTER_DATA_DIR=str(work / "jupyter-data"))
    done = run([str(BINDER / "postBuild")], env=env, cwd=REPO, what="binder/postBuild")
    say("   " + done.stdout.strip().splitlines()[-1])
    return venv


# -- 3. the notebooks under the cap ----------------------------------------------------------------
class MemoryCap:
    """A memory cgroup of its own with a 2 GiB limit; v2 where the unified hierarchy has the memory
    controller, else v1."""

    def __init__(self, name: str, limit: int = LIMIT):
        self.limit = limit
        own = Path("/proc/self/cgroup").read_text().splitlines()
        v1 = next((line.split(":", 2)[2] for line in own if line.split(":")[1] == "memory"), None)
        v2 = next((line.split(":", 2)[2] for line in own if line.startswith("0::")), None)
        unified = Path("/sys/fs/cgroup") if Path("/sys/fs/cgroup/cgroup.controllers").exists() else None
        if unified and "memory" in (unified / "cgroup.controllers").read_text().split() and v2 is not None:
            self.version, parent = 2, unified / v2.lstrip("/")
        elif v1 is not None and Path("/sys/fs/cgroup/memory").is_dir():
            self.version, parent = 1, Path("/sys/fs/cgroup/memory") / v1.lstrip("/")
        else:
            raise CheckFailed("no memory cgroup to cap the notebooks with (neither cgroup v2 with the memory "
                              "controller nor v1's /sys/fs/cgroup/memory): run as root on Linux")
        self.path = parent / f"jdist-binder-{name}-{os.getpid()}"
        try:
            self.path.mkdir()
            if self.version == 2:
                (self.path / "memory.max").write_text(str(limit))
                if (self.path / "memory.swap.max").exists():
                    (self.path / "memory.swap.max").write_text("0")
            else:
                (self.path / "memory.limit_in_bytes").write_text(str(limit))
                if (self.path / "memory.memsw.limit_in_bytes").exists():
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        except OSError as exc:
            raise CheckFailed(f"cannot create the memory cgroup {self.path} ({exc.strerror}): run as root, or "
                              "with a delegated cgroup") from exc
        self.resident_peak = 0
        self._halt = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def enter(self) -> None:
        """preexec_fn: the child joins the cgroup before it runs anything."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def _stat(self) -> dict[str, int]:
        out = {}
        for line in (self.path / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value)
        return out

    def resident(self) -> int:
        st = self._stat()
        if self.version == 2:
            return st.get("anon", 0) + st.get("shmem", 0)
        return st.get("total_rss", 0) + st.get("total_shmem", 0)

    def _sample(self) -> None:
        while not self._halt.wait(0.2):
            try:
                self.resident_peak = max(self.resident_peak, self.resident())
            except OSError:
                return

    def start_sampling(self) -> None:
        self._sampler.start()

    def peak(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return int((self.path / name).read_text())

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def close(self) -> None:
        self._halt.set()
        self._sampler.join(2) if self._sampler.is_alive() else None
        for _ in range(50):
            procs = (self.path / "cgroup.procs").read_text().split()
            if not procs:
                break
            time.sleep(0.2)
        try:
            self.path.rmdir()
        except OSError:
            say(f"   (left the cgroup {self.path}: processes {procs} still in it)")


def run_notebook(venv: CleanVenv, notebook: Path, work: Path, cell_timeout: float = 300) -> tuple[float, int, int]:
    """Executes ``notebook`` through the venv's ``jupyter server`` (as JupyterLab on mybinder runs it), the
    server, its kernel and the ranks all in one capped cgroup; returns (seconds, cgroup peak, resident peak)."""
    from check_wheel import Server, execute_notebook

    base = work / "run" / notebook.stem
    if base.exists():
        shutil.rmtree(base)
    server = Server(venv, base)
    shutil.copytree(REPO / "notebooks", server.root, dirs_exist_ok=True)  # as on binder: its helper files beside
    cells = json.loads(notebook.read_text())["cells"]
    cap = MemoryCap(notebook.stem)
    t0 = time.monotonic()
    cap.start_sampling()
    error = None
    try:
        server.start(preexec_fn=cap.enter)
        status, sess = server.request("POST", "/api/sessions", {
            "path": notebook.name, "name": notebook.name, "type": "notebook", "kernel": {"name": "python3"}})
        if status != 201:
            raise CheckFailed(f"POST /api/sessions answered {status}: {sess}")
        asyncio.run(execute_notebook(server, sess["kernel"]["id"], cells, cell_timeout))
    except CheckFailed as exc:
        error = exc
    finally:
        seconds = time.monotonic() - t0
        server.stop()
        peak, resident, kills = cap.peak(), cap.resident_peak, cap.oom_kills()
        cap.close()
    if kills:
        raise CheckFailed(f"{notebook.name}: {kills} process(es) killed for memory under the 2 GiB cap "
                          f"(peak {peak / 2**20:.0f} MiB)")
    if error is not None:
        raise CheckFailed(f"{notebook.name} failed under the cap (peak {peak / 2**20:.0f} MiB): {error}")
    return seconds, peak, resident


def binder_notebooks() -> list[Path]:
    names = [ln.strip() for ln in (BINDER / "notebooks.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    missing = [n for n in names if not (REPO / n).exists()]
    if missing:
        raise CheckFailed(f"binder/notebooks.txt names missing notebooks: {missing}")
    return [REPO / n for n in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "check-binder")
    ap.add_argument("notebooks", nargs="*", help="Only these notebooks (default: binder/notebooks.txt).")
    args = ap.parse_args(argv)
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    total0 = time.monotonic()
    passed = failed = 0
    try:
        t0 = time.monotonic()
        r2d = repo2docker()
        p = plan(r2d)
        steps = check_plan(p)
        say(f"ok repo2docker {R2D_VERSION} would use {p['pack']} on Python {p['python']}: "
            f"{'; '.join(steps)} [{time.monotonic() - t0:.1f} s]")
        passed += 1
        t0 = time.monotonic()
        venv = build_env(work, str(p["python"]), r2d)
        say(f"ok the same steps in a clean venv: base environment, binder/requirements.txt, binder/postBuild "
            f"[{time.monotonic() - t0:.1f} s]")
        passed += 1
        notebooks = [Path(n).resolve() for n in args.notebooks] or binder_notebooks()
    except CheckFailed as exc:
        say(f"FAILED {exc}")
        say(f"check-binder: {passed} passed, 1 failed [{time.monotonic() - total0:.1f} s]")
        return 1
    for nb in notebooks:
        try:
            seconds, peak, resident = run_notebook(venv, nb, work)
        except CheckFailed as exc:
            failed += 1
            say(f"FAILED {exc}")
            continue
        passed += 1
        say(f"ok {nb.name} under the 2 GiB cap: peak {peak / 2**20:.0f} MiB (resident {resident / 2**20:.0f} MiB) "
            f"[{seconds:.1f} s]")
    say(f"check-binder: {passed} passed, {failed} failed [{time.monotonic() - total0:.1f} s]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
