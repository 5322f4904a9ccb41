"""The job's end when the kernel is gone: a listener in the kernel, a watcher in the job's launcher pod.

The kernel keeps a :class:`Listener` open while its cluster runs (accepting and closing
connections; it closes with the kernel's process, however that ends). The launcher pod of the
``MPIJob`` runs ``python -m jdist.kernel.launch.k8s.heartbeat HOST:PORT --grace S`` (:func:`watch`):
it connects every ``interval`` seconds, and once no connection has succeeded for ``grace`` seconds
it prints one line and exits 0, so the job has succeeded and the MPI Operator deletes its pods. A
kernel that was never reachable ends the job after ``grace`` seconds as well.

Example (a listener, then a watcher that sees it close):
    >>> listener = Listener("127.0.0.1")
    >>> import threading; threading.Timer(0.3, listener.close).start()
    >>> watch(listener.address, grace=0.5, interval=0.1, say=lambda line: None)
    0
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from typing import Callable

#: Seconds between two connects of the watcher, and the timeout of one.
INTERVAL_S = 5.0


class Listener:
    """A TCP listener on ``host`` (port chosen by the system) that accepts and closes every connection,
    in a daemon thread, until :meth:`close`."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.sock = socket.create_server((host, port), backlog=16)
        self.sock.settimeout(0.5)
        host, port = self.sock.getsockname()[:2]
        self.address = f"{host}:{port}"  #: ``host:port`` for :func:`watch`
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="jdist-k8s-heartbeat", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:  # closed
                return
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self.sock.close()
        self._thread.join(timeout=2.0)


def reachable(address: str, timeout: float) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds within ``timeout`` seconds."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def watch(address: str, grace: float, interval: float = INTERVAL_S,
          say: Callable[[str], None] = lambda line: print(line, flush=True)) -> int:
    """Connect to ``address`` every ``interval`` s; return 0 once none succeeded for ``grace`` s."""
    last = time.monotonic()
    seen = False
    while True:
        if reachable(address, timeout=min(interval, 5.0)):
            last, seen = time.monotonic(), True
        elif time.monotonic() - last >= grace:
            say(f"jdist heartbeat: the kernel at {address} "
                f"{'has not answered' if seen else 'never answered'} for {grace:g} s; ending the job.")
            return 0
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    import os

    from .manifests import GRACE_ENV, HEARTBEAT_ENV

    ap = argparse.ArgumentParser(prog="python -m jdist.kernel.launch.k8s.heartbeat",
                                 description="End this job once the jdist kernel at HOST:PORT is gone.")
    ap.add_argument("address", metavar="HOST:PORT", nargs="?", default=os.environ.get(HEARTBEAT_ENV),
                    help=f"the kernel's heartbeat listener (default: ${HEARTBEAT_ENV}, as a TrainJob sets it)")
    ap.add_argument("--grace", type=float, default=float(os.environ.get(GRACE_ENV) or 60.0),
                    help=f"seconds without an answer before the job ends (default: ${GRACE_ENV}, else 60)")
    ap.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between two connects")
    args = ap.parse_args(argv)
    if not args.address:
        ap.error(f"give HOST:PORT or set {HEARTBEAT_ENV}")
    return watch(args.address, args.grace, args.interval)


if __name__ == "__main__":
    sys.exit(main())
