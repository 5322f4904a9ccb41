"""Security properties of a real running 2-rank cluster (no mocks).

What a user on a shared or networked machine relies on:

* nothing of the cluster listens beyond loopback: the ipyparallel controller (and the
  scheduler / heart-monitor processes it forks), ``mpiexec`` with its ``hydra_pmi_proxy``,
  and the rank processes, including the sockets of the torch.distributed process group
  (TCP listeners and every UDP socket);
* the files that hold the cluster's session key (ipyparallel's connection files) and
  jdist's cluster state file are owner-only (0600) in folders others cannot write, no
  file others can read holds the key, and the key is on no command line (those are
  world-readable in /proc);
* messages are HMAC-signed, and the controller serves no request whose signature is
  wrong, missing or does not match the content (negative tests, each with a positive
  control: the same request correctly signed is answered).

The Jupyter server extension's REST endpoints needing the server token are tested in
tests/test_server.py::test_endpoints_need_the_token (not repeated here).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq
from ipyparallel import interactive
from jupyter_client.session import Session

from jdist.kernel.cluster import ClusterSession
from jdist.options import ClusterConfig

#: Seconds a wrongly signed request gets to be answered (the correctly signed control request
#: just before it is answered in milliseconds).
NO_REPLY_WAIT = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
        c = ClusterSession(ClusterConfig(n=2, timeout=30))
        c.start()
        try:
            yield c
        finally:
            c.stop()


# -- listening sockets -----------------------------------------------------------------------


def _tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def _process_groups(c: ClusterSession) -> dict[str, list[psutil.Process]]:
    mpiexec = [p for launcher in c.ipp.engines.values() for p in _tree(launcher.process.pid)]
    return {
        "controller": _tree(c.ipp.controller.process.pid),  # + its schedulers, heart monitor
        "mpiexec": mpiexec,  # + hydra_pmi_proxy, the ranks under it, their nannies
        "ranks": [p for info in c.ranks for p in _tree(info["pid"])],
    }


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _listening(procs: list[psutil.Process]) -> list[dict[str, Any]]:
    """Every TCP listener and every UDP socket (bound = reachable) of ``procs``."""
    found = []
    for proc in procs:
        try:
            conns = proc.net_connections(kind="inet")
            name, cmd = proc.name(), " ".join(proc.cmdline())[:160]
        except psutil.NoSuchProcess:
            continue
        for conn in conns:
            if conn.type == socket.SOCK_STREAM and conn.status != psutil.CONN_LISTEN:
                continue
            if not conn.laddr:
                continue
            kind = "tcp" if conn.type == socket.SOCK_STREAM else "udp"
            found.append({"pid": proc.pid, "name": name, "cmd": cmd, "proto": kind,
                          "addr": f"{conn.laddr.ip}:{conn.laddr.port}", "ip": conn.laddr.ip})
    return found


@interactive  # pickled by value: this module is not importable on the engines
def _torch_group_in_use():
    """Run a collective so every socket of the process group is open; True if initialised."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return False
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t) == dist.get_world_size()


@pytest.mark.parametrize("group", ["controller", "mpiexec", "ranks"])
def test_cluster_processes_listen_on_loopback_only(cluster, group):
    """TCP listeners and UDP sockets of each part of the cluster are on 127.0.0.1/::1 only.

    The ranks include the torch.distributed sockets (TCPStore, gloo pairs): the group is
    checked to be up and used right before the scan.
    """
    assert cluster.apply(_torch_group_in_use) == [True, True], "torch.distributed is not up on the ranks"
    groups = _process_groups(cluster)
    rank_pids = {info["pid"] for info in cluster.ranks}
    assert rank_pids <= {p.pid for p in groups["mpiexec"]}, "the ranks run under mpiexec"
    sockets = _listening(groups[group])
    assert sockets, f"found no listening socket of the {group} at all: the scan is broken"
    exposed = [s for s in sockets if not _is_loopback(s["ip"])]
    assert not exposed, f"{group} sockets reachable from other machines:\n" + "\n".join(
        f"  {s['proto']} {s['addr']}  pid {s['pid']} {s['name']}: {s['cmd']}" for s in exposed
    )


# -- files -----------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _security_dir(c: ClusterSession) -> Path:
    return Path(c.ipp.profile_dir) / "security"


def _connection_files(c: ClusterSession) -> list[Path]:
    cid = c.ipp.cluster_id
    return [_security_dir(c) / f"ipcontroller-{cid}-{kind}.json" for kind in ("client", "engine")]


def _assert_not_writable_by_others(folder: Path) -> None:
    mode = _mode(folder)
    assert folder.stat().st_uid == os.getuid(), f"{folder} belongs to someone else"
    assert not mode & (stat.S_IWGRP | stat.S_IWOTH), f"{folder} is writable by others ({oct(mode)})"


def test_connection_files_are_owner_only(cluster):
    """ipcontroller-<id>-client.json / -engine.json hold the session key: 0600, private folder."""
    key = cluster.client.session.key.decode()
    for path in _connection_files(cluster):
        assert path.is_file(), f"no connection file {path}"
        assert path.stat().st_uid == os.getuid()
        assert _mode(path) == 0o600, f"{path.name} is {oct(_mode(path))}, not 0600"
        assert json.loads(path.read_text())["key"] == key, f"{path.name} does not hold the client's key"
    _assert_not_writable_by_others(_security_dir(cluster))


def test_state_file_is_owner_only_and_holds_no_key(cluster):
    """jdist's state file is 0600 in a folder others cannot write; it names the client
    connection file (0600) instead of carrying the session key itself."""
    path = cluster.state_file
    assert path is not None and path.is_file(), "no jdist state file was written"
    assert path.stat().st_uid == os.getuid()
    assert _mode(path) == 0o600, f"{path} is {oct(_mode(path))}, not 0600"
    _assert_not_writable_by_others(path.parent)
    text = path.read_text()
    assert cluster.client.session.key.decode() not in text, "the state file carries the session key"
    named = Path(json.loads(text)["client_file"])
    assert named == _connection_files(cluster)[0] and _mode(named) == 0o600


def test_process_group_store_folder_is_owner_only(cluster):
    """The ranks rendezvous through a file store in the cluster's work folder: whoever can
    write there can join or disturb the process group, so the folder is the owner's alone."""
    assert cluster.work_dir is not None, "the cluster has no private work folder: the process group is not private"
    work_dir = Path(cluster.work_dir)
    assert work_dir.is_dir() and work_dir.stat().st_uid == os.getuid()
    assert not _mode(work_dir) & 0o077, f"{work_dir} is {oct(_mode(work_dir))}, not 0700"
    stores = list(work_dir.glob("store-*"))
    assert stores, f"no process-group file store in {work_dir}: the ranks rendezvous some other way"


def _files_under(*roots: Path) -> list[Path]:
    return [p for root in roots if root.is_dir() for p in root.rglob("*") if p.is_file()]


def test_no_file_others_can_read_holds_the_session_key(cluster):
    """Every file of the profile (connection files, cluster file, logs, engine ids) and of
    jdist's runtime folder: those holding the key are 0600; others may be readable."""
    key = cluster.client.session.key
    holders = []
    for path in _files_under(Path(cluster.ipp.profile_dir), cluster.state_file.parent):
        try:
            if key not in path.read_bytes():
                continue
        except OSError:
            continue
        holders.append(path)
        assert not _mode(path) & 0o077, f"{path} holds the session key and is {oct(_mode(path))}"
    assert set(_connection_files(cluster)) <= set(holders), "the scan missed the connection files"


def test_session_key_is_on_no_command_line(cluster):
    """Command lines are readable by every user (/proc/PID/cmdline)."""
    key = cluster.client.session.key.decode()
    procs = {p.pid: p for group in _process_groups(cluster).values() for p in group}
    leaking = [(pid, p.cmdline()) for pid, p in procs.items() if key in " ".join(p.cmdline())]
    assert not leaking, f"session key on command lines: {leaking}"


# -- message signatures ----------------------------------------------------------------------


def test_client_session_signs_with_hmac(cluster):
    session = cluster.client.session
    cfg = json.loads(_connection_files(cluster)[0].read_text())
    assert session.key and len(session.key) >= 16, "empty or short session key: messages unsigned"
    assert session.key == cfg["key"].encode()
    assert session.signature_scheme.startswith("hmac-") and session.auth is not None
    assert session.signature_scheme == cfg["signature_scheme"]


def _session(key: bytes, cfg: dict[str, Any]) -> Session:
    return Session(key=key, signature_scheme=cfg["signature_scheme"], packer="json", unpacker="json")


def _ask(url: str, frames: list[bytes], timeout: float) -> list[bytes] | None:
    """Send ``frames`` on a fresh DEALER socket (as ipyparallel.Client's query socket); the reply or None."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(url)
        sock.send_multipart(frames)
        return sock.recv_multipart() if sock.poll(int(timeout * 1000)) else None
    finally:
        sock.close()
        ctx.term()


REQUESTS = {
    "connection_request": {},
    "queue_request": {"targets": None, "verbose": False},
}


@pytest.mark.parametrize("msg_type", sorted(REQUESTS))
@pytest.mark.parametrize("forgery", ["wrong key", "unsigned", "tampered content"])
def test_controller_serves_no_wrongly_signed_request(cluster, msg_type, forgery):
    """The controller's query socket (the one ipyparallel.Client uses, ``registration`` in
    the client connection file) answers a correctly signed request, and serves none whose
    signature is made with another key, is missing, or does not cover the content sent."""
    cfg = json.loads(_connection_files(cluster)[0].read_text())
    url = f"{cfg['interface']}:{cfg['registration']}"
    right = _session(cfg["key"].encode(), cfg)
    content = REQUESTS[msg_type]

    # positive control: the same request, correctly signed, is answered (and verifies)
    reply = _ask(url, right.serialize(right.msg(msg_type, content=content)), timeout=10)
    assert reply is not None, f"no reply to a correctly signed {msg_type}: the test cannot tell anything"
    _, parts = right.feed_identities(reply)
    answer = right.deserialize(parts)
    assert answer["header"]["msg_type"] == msg_type.replace("_request", "_reply")
    assert answer["content"]["status"] == "ok"

    if forgery == "wrong key":
        forger = _session(b"wrong-key-" + os.urandom(8).hex().encode(), cfg)
        frames = forger.serialize(forger.msg(msg_type, content=content))
    elif forgery == "unsigned":
        forger = _session(b"", cfg)
        frames = forger.serialize(forger.msg(msg_type, content=content))
        assert frames[1] == b"", "an unkeyed session should send an empty signature"
    else:  # signed with the right key, then the content changed in transit
        frames = right.serialize(right.msg(msg_type, content=content))
        tampered = dict(json.loads(frames[-1]), injected=True)
        frames[-1] = json.dumps(tampered).encode()

    reply = _ask(url, frames, timeout=NO_REPLY_WAIT)
    if reply is None:
        return  # ignored: what ipyparallel 9 does
    # An error report is acceptable (it serves nothing); anything else is a breach.
    _, parts = right.feed_identities(reply)
    answer = right.deserialize(parts)
    assert answer["header"]["msg_type"] == "hub_error", (
        f"the controller answered a {forgery} {msg_type} with {answer['header']['msg_type']}: "
        f"{answer['content']}"
    )
    assert "engines" not in answer["content"]
