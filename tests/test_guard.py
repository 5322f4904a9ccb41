"""jdist.rank.guard without a cluster: which sockets belong to a process group (real sockets on loopback)."""

from __future__ import annotations

import socket

from jdist.rank.guard import Guard, socket_fds


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
