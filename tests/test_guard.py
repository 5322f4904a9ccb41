"""jdist.rank.guard without a cluster: which sockets belong to a process group (real sockets on loopback), and
that a watchdog's sample never ends a rank (real processes under the launchers' engine shell)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

from jdist.kernel.launch.mpi import engine_shell
from jdist.rank.guard import Guard, socket_fds

#: A rank's process in brief: sampled (SIGUSR2) before its guard is installed, then the guard, then sampled again
#: while its interpreter shuts down, after the shutdown has taken the Python-level handlers away (a module's
#: object whose clean-up signals it: torch's own clean-up takes seconds there).
SAMPLED_RANK = textwrap.dedent("""
    import os, signal, sys, time, types
    os.kill(os.getpid(), signal.SIGUSR2)
    from jdist.rank.guard import Guard
    Guard().install(0, sys.argv[1])
    class SampledInShutdown:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.1)
    late = types.ModuleType("late"); late.obj = SampledInShutdown(); sys.modules["late"] = late
    print("ran", flush=True)
""")


def test_a_group_socket_on_the_fd_of_a_socket_closed_meanwhile_is_noted_and_broken():
    # an old group freed while the new one connects (a failed trial's traceback held it) closes its fds, and the
    # new group's sockets get those numbers: they are still the new group's, and a release must reach them
    old = socket.create_server(("127.0.0.1", 0))
    reused = old.fileno()
    before = socket_fds()
    old.close()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        assert reused in (listener.fileno(), client.fileno(), accepted.fileno())  # the reuse this is about
        guard = Guard()
        guard.note_group_sockets(before)
        assert guard.group_ports == {listener.getsockname()[1]}
        assert client.fileno() in guard.group_fds
        guard.break_group("released")
        accepted.settimeout(5)
        assert accepted.recv(1) == b""  # shut down: a collective waiting on the pair would now fail
        assert guard.broken == "released"
    finally:
        for sock in (client, accepted, listener):
            sock.close()


def test_sockets_open_before_the_group_are_not_its_own():
    other = socket.create_server(("127.0.0.1", 0))
    before = socket_fds()
    try:
        guard = Guard()
        guard.note_group_sockets(before)
        assert other.getsockname()[1] not in guard.group_ports and other.fileno() not in guard.group_fds
    finally:
        other.close()


def test_a_sample_before_the_guard_or_during_the_interpreters_shutdown_does_not_end_the_rank(tmp_path):
    # seen in CI: "rank 2 died: killed by SIGUSR2" 37 s into a cell under load; SIGUSR2's default action ends a process
    shell = engine_shell(after="exit $code")
    done = subprocess.run(["/bin/sh", "-c", shell, "rank", sys.executable, "-c", SAMPLED_RANK, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
