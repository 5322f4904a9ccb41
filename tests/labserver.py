"""A real Jupyter server (or JupyterLab) in a subprocess, isolated under a temporary folder.

Used by ``test_server.py`` and ``test_browser.py``. Config, data, runtime, IPython and run
dirs all live under ``base``; the repository's own ``jupyter-config`` enables the server
extension and ``jdist/labextension`` (the prebuilt frontend) is linked into the data dir, so
the test runs what this checkout holds, not what an earlier install left in the venv.
Everything started is stopped by PID.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServerProcess:
    """``jupyter server`` or ``jupyter lab`` on 127.0.0.1 with a token, in its own dirs."""

    def __init__(self, base: Path, app: str = "server", extra_args: list[str] | None = None):
        self.base = base
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dirs = {name: base / name for name in ("config", "data", "runtime", "ipython", "runs", "root")}
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        conf = self.dirs["config"] / "jupyter_server_config.d"
        conf.mkdir(exist_ok=True)
        shutil.copy(REPO / "jupyter-config" / "jupyter_server_config.d" / "jdist.json", conf / "jdist.json")
        labext = self.dirs["data"] / "labextensions"
        labext.mkdir(exist_ok=True)
        (labext / "jdist").symlink_to(REPO / "jdist" / "labextension", target_is_directory=True)
        self.env = dict(os.environ)
        self.env.update(
            JUPYTER_CONFIG_DIR=str(self.dirs["config"]),
            JUPYTER_DATA_DIR=str(self.dirs["data"]),
            JUPYTER_RUNTIME_DIR=str(self.dirs["runtime"]),
            IPYTHONDIR=str(self.dirs["ipython"]),
            JDIST_RUN_DIR=str(self.dirs["runs"]),
            PYTHONUNBUFFERED="1",
        )
        self.env.pop("JUPYTER_PREFER_ENV_PATH", None)
        self.log_path = base / f"jupyter-{app}.log"
        self.cmd = [
            sys.executable, "-m", "jupyter", app, "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.dirs['root']}",
            *(extra_args or []),
        ]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> "JupyterServerProcess":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=self.dirs["root"], start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter {self.cmd[3]} exited ({self.proc.returncode}):\n{self.log()}")
            try:
                status, _ = self.request("GET", "/api/status")
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"jupyter did not answer within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""

    def request(self, method: str, path: str, body: Any = None, token: str | None | bool = True,
                timeout: float = 180) -> tuple[int, Any]:
        """``(status, parsed JSON or text)``; ``token=False`` sends none, a string sends that one."""
        headers = {"Content-Type": "application/json"}
        tok = self.token if token is True else token
        if tok:
            headers["Authorization"] = f"token {tok}"
        data = None if body is None else json.dumps(body).encode()
        if method == "POST" and data is None:
            data = b"{}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def get(self, path: str, **kw: Any) -> Any:
        status, data = self.request("GET", path, **kw)
        assert status == 200, (path, status, data)
        return data

    def new_session(self, path: str) -> dict[str, Any]:
        """A notebook session with a fresh python3 kernel (as JupyterLab opens one)."""
        status, data = self.request("POST", "/api/sessions", {
            "path": path, "name": os.path.basename(path), "type": "notebook", "kernel": {"name": "python3"}})
        assert status == 201, (status, data)
        return data

    def kernel_client(self, kernel_id: str) -> Any:
        """A blocking client on a kernel this server started (via its connection file)."""
        from jupyter_client import BlockingKernelClient

        kc = BlockingKernelClient(connection_file=str(self.dirs["runtime"] / f"kernel-{kernel_id}.json"))
        kc.load_connection_file()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        return kc

    def stop(self) -> None:
        """Shut the server down (it shuts its kernels down); kill by PID what is left."""
        if self.proc is None:
            return
        try:
            self.request("POST", "/api/shutdown", timeout=10)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.proc = None
