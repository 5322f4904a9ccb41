#!/usr/bin/env python
"""``make check-wheel``: the wheel is the product. Builds the sdist and the wheel as a user gets
them, and runs them the way a user would, outside this checkout.

1. ``python -m build`` (the wheel is built from the sdist, so the sdist is checked too: it must
   carry its version in PKG-INFO, without git) and ``twine check --strict`` on both;
2. a clean venv with only torch, JupyterLab and the wheel (``jdist[examples]``: the quickstart
   needs scikit-learn), nothing from the checkout; every command runs from a folder outside it;
3. ``jdist --version``, ``jdist.__version__``, the installed metadata and the file names agree,
   and ``import jdist`` comes from the venv's site-packages;
4. ``jupyter labextension list`` and ``jupyter server extension list`` show jdist enabled;
5. a real ``jupyter server`` of that venv opens ``01-quickstart.ipynb`` as a session (a kernel of
   that venv) and runs every cell through the kernel's websocket, as JupyterLab does. Cells marked
   ``# NBVAL_CHECK_OUTPUT`` must print what the saved notebook shows; meanwhile the sidebar's
   ``/jdist/api/clusters`` must list the notebook's cluster with its 2 ranks, and afterwards
   ``/jdist/api/runs`` the finished training run.

Prints one line per step with its time, and ``check-wheel: N passed, 0 failed``; exit 1 with the
failing step's one line otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cleanvenv import REPO, CheckFailed, CleanVenv, clean_env, run, say, torch_wheel

NOTEBOOK = REPO / "notebooks" / "01-quickstart.ipynb"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def build(out: Path) -> tuple[Path, Path]:
    """sdist and wheel (the wheel from the sdist) into ``out``; both pass ``twine check --strict``."""
    if out.exists():
        shutil.rmtree(out)
    env = clean_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # build's --installer uv
    run([sys.executable, "-m", "build", "--installer", "uv", "-o", str(out), str(REPO)], env=env, cwd=out.parent,
        what="python -m build", timeout=600)
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise CheckFailed(f"python -m build made {[p.name for p in out.iterdir()]}: expected one sdist and one wheel")
    run([sys.executable, "-m", "twine", "check", "--strict", str(sdists[0]), str(wheels[0])], env=env,
        cwd=out.parent, what="twine check --strict")
    return sdists[0], wheels[0]


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def check_wheel_contents(wheel: Path) -> None:
    """The prebuilt lab extension and the server extension's config travel in the wheel; pytest's set-up does not."""
    names = zipfile.ZipFile(wheel).namelist()
    data = f"jdist-{wheel_version(wheel)}.data/data/"
    needed = [data + "share/jupyter/labextensions/jdist/package.json",
              data + "share/jupyter/labextensions/jdist/static/style.js",
              data + "etc/jupyter/jupyter_server_config.d/jdist.json",
              "jdist/_version.py", "jdist/server/__init__.py"]
    missing = [n for n in needed if n not in names]
    if missing:
        raise CheckFailed(f"the wheel lacks {missing}: check [tool.hatch.build.targets.wheel.shared-data] in pyproject.toml")
    tests = [n for n in names if n.rsplit("/", 1)[-1] == "conftest.py"]
    if tests:
        raise CheckFailed(f"the wheel ships pytest's configuration {tests}: exclude it in [tool.hatch.build.targets.wheel]")


def check_versions(venv: CleanVenv, wheel: Path, env: dict[str, str], cwd: Path) -> str:
    out = run([venv.bin("jdist"), "--version"], env=env, cwd=cwd, what="jdist --version").stdout.strip()
    probe = run([venv.python, "-c",
                 "import jdist, importlib.metadata as m; print(jdist.__version__); print(m.version('jdist')); "
                 "print(jdist.__file__)"], env=env, cwd=cwd, what="import jdist").stdout.split()
    expected = wheel_version(wheel)
    if out != f"jdist {expected}" or probe[0] != expected or probe[1] != expected:
        raise CheckFailed(f"versions disagree: wheel {expected}, `jdist --version` {out!r}, jdist.__version__ "
                          f"{probe[0]!r}, metadata {probe[1]!r}: all must come from pyproject's [tool.hatch.version]")
    if not Path(probe[2]).resolve().is_relative_to(venv.path.resolve()):
        raise CheckFailed(f"import jdist found {probe[2]}, not the venv's copy: the checkout leaked onto sys.path")
    return expected


def check_extensions(venv: CleanVenv, env: dict[str, str], cwd: Path) -> None:
    lab = run([venv.bin("jupyter"), "labextension", "list"], env=env, cwd=cwd, what="jupyter labextension list")
    text = ANSI.sub("", lab.stdout + lab.stderr)
    if not re.search(r"^\s*jdist v\S+ enabled OK", text, re.MULTILINE):
        raise CheckFailed("jupyter labextension list does not show jdist enabled OK:\n" + text)
    srv = run([venv.bin("jupyter"), "server", "extension", "list"], env=env, cwd=cwd,
              what="jupyter server extension list")
    text = ANSI.sub("", srv.stdout + srv.stderr)
    if not re.search(r"^\s*jdist\.server enabled", text, re.MULTILINE) or not re.search(r"jdist\.server\s+\S+\s+OK", text):
        raise CheckFailed("jupyter server extension list does not show jdist.server enabled and OK:\n" + text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The venv's ``jupyter server`` in its own dirs under ``base``."""

    def __init__(self, venv: CleanVenv, base: Path):
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.root = base / "root"
        dirs = {k: base / k for k in ("config", "data", "runtime", "ipython", "runs")}
        for d in (self.root, *dirs.values()):
            d.mkdir(parents=True, exist_ok=True)
        self.env = clean_env(venv.path, JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_DATA_DIR=str(dirs["data"]),
                             JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), IPYTHONDIR=str(dirs["ipython"]),
                             JDIST_RUN_DIR=str(dirs["runs"]))
        self.log_path = base / "jupyter-server.log"
        self.cmd = [venv.bin("jupyter"), "server", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
                    f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                    f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}"]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90, preexec_fn: Any = None) -> None:
        """Start it; ``preexec_fn`` runs in the child first (check_binder: join the memory cgroup)."""
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=self.root, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec_fn)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CheckFailed(f"jupyter server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if self.request("GET", "/api/status")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise CheckFailed(f"jupyter server did not answer within {timeout:.0f} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def request(self, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"token {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.request("POST", "/api/shutdown", timeout=10)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()


class SidebarWatch(threading.Thread):
    """Polls the sidebar's cluster list while the notebook runs; keeps the fullest answer."""

    def __init__(self, server: Server, notebook: str):
        super().__init__(daemon=True)
        self.server, self.notebook = server, notebook
        self.seen: dict[str, Any] | None = None
        self.answers = 0
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            try:
                status, data = self.server.request("GET", "/jdist/api/clusters", timeout=10)
            except OSError as exc:
                self.errors.append(str(exc))
                continue
            if status != 200:
                self.errors.append(f"HTTP {status}: {str(data)[:200]}")
                continue
            self.answers += 1
            for cluster in data.get("clusters", []) if isinstance(data, dict) else []:
                ranks = cluster.get("ranks") or []
                if (cluster.get("name") == self.notebook and len(ranks) == 2
                        and all(r.get("state") in ("idle", "busy") for r in ranks)):
                    self.seen = cluster


def _text(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", "") if isinstance(out.get("text"), str) else "".join(out["text"]))
        elif out.get("output_type") in ("execute_result", "display_data"):
            plain = out.get("data", {}).get("text/plain", "")
            parts.append(plain if isinstance(plain, str) else "".join(plain))
    return ANSI.sub("", "".join(parts)).strip()


async def _kernel_ready(ws: Any, send: Callable[[str, dict[str, Any]], str], timeout: float) -> bool:
    """Ask ``kernel_info`` until the kernel answers over the websocket, as JupyterLab does before it sends
    a cell; a reply to any of the requests counts (a slow kernel answers an earlier one after the next
    was sent). False if none came within ``timeout`` or the websocket closed."""
    deadline = time.monotonic() + timeout
    sent: set[str] = set()
    while time.monotonic() < deadline:
        sent.add(send("kernel_info_request", {}))
        retry = min(deadline, time.monotonic() + 2.0)
        while (left := retry - time.monotonic()) > 0:
            try:
                raw = await asyncio.wait_for(ws.read_message(), left)
            except asyncio.TimeoutError:
                break
            if raw is None:
                return False
            msg = json.loads(raw) if isinstance(raw, str) else {}
            if msg.get("parent_header", {}).get("msg_id") in sent and msg["header"]["msg_type"] == "kernel_info_reply":
                return True
    return False


async def _connect(server: Server, kernel_id: str, wait: float = 60.0) -> tuple[Any, Callable[[str, dict[str, Any]], str]]:
    """A websocket to the kernel that has answered ``kernel_info``. No second try: a kernel that does not
    answer its first client is what a user would meet too (ipykernel 7.0-7.3 left a request unread on
    the shell socket until the next connection, ipykernel#1554, 4 of 60 fresh kernels here; jdist
    requires ipykernel>=7.4, which has the fix)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    session = uuid.uuid4().hex
    url = f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id={session}"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {server.token}"}),
                                 max_message_size=64 << 20)

    def send(msg_type: str, content: dict[str, Any]) -> str:
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": "check", "session": session, "msg_type": msg_type,
                       "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [], "content": content}))
        return msg_id

    if await _kernel_ready(ws, send, wait):
        return ws, send
    ws.close()
    status, state = server.request("GET", f"/api/kernels/{kernel_id}")
    raise CheckFailed(f"the kernel did not answer kernel_info within {wait:.0f} s (GET /api/kernels/{kernel_id}: "
                      f"{status} {state}):\n{server.log()}")


async def execute_notebook(server: Server, kernel_id: str, cells: list[dict[str, Any]],
                           timeout: float) -> list[tuple[int, float]]:
    """Run the code cells over the kernel's websocket (the JSON protocol JupyterLab speaks);
    raises on the first error (except in cells tagged ``raises-exception``) or a check-output cell
    that prints something else."""
    ws, send = await _connect(server, kernel_id)
    times = []
    try:
        for index, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            msg_id = send("execute_request", {"code": source, "silent": False, "store_history": True,
                                              "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
            t0 = time.monotonic()
            outputs: list[dict[str, Any]] = []
            reply, idle = None, False
            while reply is None or not idle:
                left = timeout - (time.monotonic() - t0)
                if left <= 0:
                    raise CheckFailed(f"cell {index} did not finish within {timeout:.0f} s: {source.splitlines()[0]}")
                raw = await asyncio.wait_for(ws.read_message(), left)
                if raw is None:
                    raise CheckFailed(f"the kernel's websocket closed during cell {index}:\n{server.log()}")
                if not isinstance(raw, str):
                    continue  # binary frames (widget buffers)
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if msg["channel"] == "shell" and kind == "execute_reply":
                    reply = msg["content"]
                elif kind == "status" and msg["content"].get("execution_state") == "idle":
                    idle = True
                elif kind in ("stream", "execute_result", "display_data", "error"):
                    outputs.append({"output_type": kind, **msg["content"]})
            times.append((index, time.monotonic() - t0))
            expected = "raises-exception" in cell.get("metadata", {}).get("tags", [])  # nbclient's convention
            if reply.get("status") != "ok" and not expected:
                tb = ANSI.sub("", "\n".join(reply.get("traceback", [])))[-2000:]
                raise CheckFailed(f"cell {index} failed: {reply.get('ename')}: {reply.get('evalue')}\n{tb}")
            if source.lstrip().startswith("# NBVAL_CHECK_OUTPUT"):
                want, got = _text(cell.get("outputs", [])), _text(outputs)
                if want != got:
                    raise CheckFailed(f"cell {index} printed {got!r}, the saved notebook shows {want!r}")
    finally:
        ws.close()
    return times


def leftovers(venv: CleanVenv, wait: float = 20) -> list[str]:
    """Processes still running from the venv (kernel, mpiexec, ranks) after the server stopped."""
    root = str(venv.path.resolve())
    deadline = time.monotonic() + wait
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if root in cmd:
                found.append(f"{proc.name}: {cmd[:120]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def run_quickstart(venv: CleanVenv, base: Path, timeout: float) -> dict[str, Any]:
    server = Server(venv, base)
    shutil.copy(NOTEBOOK, server.root / NOTEBOOK.name)
    nb = json.loads(NOTEBOOK.read_text())
    t0 = time.monotonic()
    server.start()
    started = time.monotonic() - t0
    watch = SidebarWatch(server, NOTEBOOK.name)
    try:
        status, sess = server.request("POST", "/api/sessions", {
            "path": NOTEBOOK.name, "name": NOTEBOOK.name, "type": "notebook", "kernel": {"name": "python3"}})
        if status != 201:
            raise CheckFailed(f"POST /api/sessions answered {status}: {sess}")
        kernel_id = sess["kernel"]["id"]
        venv_root = str(venv.path.resolve())
        probe = [{"cell_type": "code", "outputs": [], "source": [  # the kernel is the venv's, jdist the wheel's
            f"import os, sys, jdist\nassert os.path.realpath(sys.prefix) == {venv_root!r}, sys.prefix\n"
            f"assert os.path.realpath(jdist.__file__).startswith({venv_root!r}), jdist.__file__"]}]
        asyncio.run(execute_notebook(server, kernel_id, probe, 120))
        watch.start()
        times = asyncio.run(execute_notebook(server, kernel_id, nb["cells"], timeout))
        watch.halt.set()
        watch.join(5)
        if watch.seen is None:
            raise CheckFailed(f"/jdist/api/clusters never listed {NOTEBOOK.name}'s cluster with 2 ranks while it ran "
                              f"({watch.answers} answers; errors: {watch.errors[:3]})")
        status, runs = server.request("GET", "/jdist/api/runs")
        listed = runs.get("runs", []) if isinstance(runs, dict) else []
        if status != 200 or not any(r.get("status") == "finished" for r in listed):
            raise CheckFailed(f"/jdist/api/runs answered {status} without a finished run: {str(runs)[:300]}")
    finally:
        watch.halt.set()
        server.stop()
    left = leftovers(venv)
    if left:
        raise CheckFailed(f"processes of the venv still run after the server stopped: {left[:4]}")
    return {"server_start_s": started, "cells": times, "cluster": watch.seen, "runs": len(listed)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "check-wheel", help="Work folder (removed first).")
    ap.add_argument("--cell-timeout", type=float, default=300)
    args = ap.parse_args(argv)
    work = args.out.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    outside = Path(tempfile.mkdtemp(prefix="jdist-check-wheel-"))  # every command's cwd: not the checkout
    passed = 0
    total0 = time.monotonic()
    try:
        t0 = time.monotonic()
        sdist, wheel = build(work / "dist")
        check_wheel_contents(wheel)
        say(f"ok build + twine check: {sdist.name}, {wheel.name} ({wheel.stat().st_size / 1e6:.2f} MB) "
            f"[{time.monotonic() - t0:.1f} s]")
        passed += 1
        t0 = time.monotonic()
        venv = CleanVenv(work / "venv")
        venv.install(str(torch_wheel()), "jupyterlab", f"{wheel}[examples]", what="torch, jupyterlab, the wheel")
        say(f"ok clean venv with torch, JupyterLab and the wheel [{time.monotonic() - t0:.1f} s]")
        passed += 1
        env = clean_env(venv.path, JUPYTER_CONFIG_DIR=str(outside / "cfg"), JUPYTER_DATA_DIR=str(outside / "data"))
        t0 = time.monotonic()
        version = check_versions(venv, wheel, env, outside)
        say(f"ok jdist --version = jdist.__version__ = metadata = {version}, imported from the venv "
            f"[{time.monotonic() - t0:.1f} s]")
        passed += 1
        t0 = time.monotonic()
        check_extensions(venv, env, outside)
        say(f"ok lab extension and server extension enabled [{time.monotonic() - t0:.1f} s]")
        passed += 1
        t0 = time.monotonic()
        result = run_quickstart(venv, outside / "server", args.cell_timeout)
        ranks = result["cluster"].get("ranks", [])
        say(f"ok {NOTEBOOK.name} ran through the venv's jupyter server ({len(result['cells'])} code cells, server "
            f"up in {result['server_start_s']:.1f} s); the sidebar listed its cluster with {len(ranks)} ranks and "
            f"{result['runs']} run(s) [{time.monotonic() - t0:.1f} s]")
        passed += 1
    except CheckFailed as exc:
        say(f"FAILED {exc}")
        say(f"check-wheel: {passed} passed, 1 failed [{time.monotonic() - total0:.1f} s]")
        return 1
    finally:
        shutil.rmtree(outside, ignore_errors=True)
    say(f"check-wheel: {passed} passed, 0 failed [{time.monotonic() - total0:.1f} s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
