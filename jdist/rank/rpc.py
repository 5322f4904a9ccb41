"""Every function the kernel runs on the ranks, in one place.

The kernel names them with :class:`jdist.protocol.RankCall` (``RankCall("records")``), so
it never imports this module; ipyparallel runs them on the engines (``view.apply``).
:func:`setup` builds the rank's session; the others work on it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from jdist.protocol import Owner, RankInfo, Record, SetupConfig

from .session import RankSession, activate, current, describe_rank, session


def setup(config: SetupConfig) -> RankInfo:
    """Initialise this engine as one rank (called by the kernel on every engine at once).

    Reads rank and world size from MPI, pins the device, sets the torch threads of CPU ranks,
    installs the guard, sets up the backend, gives the rank the torchrun environment
    (:mod:`jdist.rank.torchrun`), and puts ``rank``, ``world_size``, ``local_rank``,
    ``device`` and ``jdist`` into the cell namespace. Returns this rank's :class:`RankInfo`.
    """
    import torch
    from mpi4py import MPI

    from jdist.plugins import backend_spec

    from . import torchrun, training
    from .backends.base import RankContext
    from .channel import DataPubChannel, NullChannel
    from .guard import Guard

    comm = MPI.COMM_WORLD
    rank, world_size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_world_size = local.Get_rank(), local.Get_size()
    hostname = socket.gethostname()
    hosts = comm.allgather(hostname)
    master_addr = "127.0.0.1" if len(set(hosts)) == 1 else _master_address(comm, rank, config)
    if master_addr != "127.0.0.1":
        _socket_interface(master_addr, config.get("iface"), rank, hostname)

    if config.get("gpus"):
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            raise RuntimeError(
                f"rank {rank} on {hostname} is local rank {local_rank} but only {visible} CUDA device(s) "
                f"are visible there; ask for fewer --gpus, or use -n {world_size} for CPU ranks."
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(config.get("threads") or max(1, (os.cpu_count() or 1) // local_world_size))

    spec = backend_spec(config["backend"])
    guard = Guard(spec.backward_waits, spec.collective_paths)
    remote = bool(config.get("remote"))
    work_dir = None if remote else config.get("work_dir")  # a folder of the kernel's host
    ctx = RankContext(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size,
                      hostname=hostname, device=device, master_addr=master_addr,
                      timeout_s=float(config.get("timeout", 60)), comm=comm, work_dir=work_dir,
                      port=config.get("port"), guard=guard)
    from IPython import get_ipython

    shell = get_ipython()
    data_pub = getattr(shell, "data_pub", None) if shell is not None else None
    guard.install(rank, work_dir, report=_sample_sender(data_pub, rank) if remote else None)
    if remote:  # hydra or srun end the ranks with SIGTERM (a stop, a dead peer, the kernel's reaper)
        _note_mpi_shm()
        guard.on_terminate = _terminated
        signal.signal(signal.SIGTERM, lambda signum, frame: _terminated())
    backend = spec.load()()
    guard.marker = backend.collectives_started
    s = RankSession(ctx=ctx, backend=backend, spec=spec,
                    channel=DataPubChannel(data_pub) if data_pub is not None else NullChannel(), guard=guard)
    backend.setup(ctx, s.timer)
    torchrun.install(ctx, config.get("cluster_id") or "jdist")
    training.set_precision(s.train, config.get("precision") or "fp32")
    previous = activate(s)
    if previous is not None:
        previous.stop_publisher()
    s.start_publisher()

    import jdist

    if shell is not None:
        shell.user_ns.update(rank=rank, world_size=world_size, local_rank=local_rank, device=device, jdist=jdist)
        for event, fn in (("pre_run_cell", _pre_cell), ("post_run_cell", _post_cell)):
            if fn not in shell.events.callbacks[event]:
                shell.events.register(event, fn)
    if config.get("owner"):
        _watch_owner(config["owner"], rank == 0)
    return describe_rank(s)


def _master_address(comm: Any, rank: int, config: SetupConfig) -> str:
    """Rank 0 chooses the address of its host that the process group uses, and tells the others:
    ``--ip`` if it is an address of rank 0's host, else ``--iface``'s address there, else the
    address its route to the kernel's host leaves from (never a loopback address)."""
    from jdist.network import address_of, interface_of, is_loopback, route_source

    addr, error = None, None
    if rank == 0:
        ip, iface = config.get("ip"), config.get("iface")
        try:
            if ip and interface_of(ip) is not None:
                addr = ip
            elif iface:
                addr = address_of(iface)
                if addr is None:
                    error = f"--iface {iface}: rank 0's host {socket.gethostname()} has no such interface"
            else:
                addr = route_source(config.get("controller_ip") or "127.0.0.1")
        except OSError as exc:
            error = f"rank 0 on {socket.gethostname()} has no route to {config.get('controller_ip')} ({exc})"
        if addr is not None and is_loopback(addr):
            error = (f"rank 0 on {socket.gethostname()} would use loopback address {addr} between hosts; "
                     "give --ip ADDR or --iface NAME")
    addr, error = comm.bcast((addr, error), root=0)
    if error:
        raise RuntimeError(error)
    return str(addr)


def _socket_interface(master_addr: str, iface: str | None, rank: int, hostname: str) -> str:
    """Tell gloo and NCCL the interface of this host that reaches rank 0 (unless the user set them):
    ``--iface``, else the one the route to ``master_addr`` leaves from; never ``lo`` between hosts."""
    from jdist.network import interface_of, route_source

    name = iface or interface_of(route_source(master_addr))
    if name is None or name == "lo":
        raise RuntimeError(f"rank {rank} on {hostname} reaches rank 0's address {master_addr} only over "
                           f"{name or 'no interface'}; give --iface NAME (the network between the hosts)")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
    return name


def _sample_sender(data_pub: Any, rank: int) -> Any:
    """How a remote rank's guard sends a sample to the kernel: an IOPub data message whose parent
    is :func:`jdist.protocol.sample_parent_id` in the session of the kernel's client (taken from
    this set-up request), so ipyparallel files it apart from every request."""
    if data_pub is None:
        return None
    from jdist.protocol import SAMPLE_KEY, encode_data, sample_parent_id

    parent = dict(data_pub.parent_header or {})
    parent["msg_id"] = sample_parent_id(rank)
    session, socket_ = data_pub.session, data_pub.pub_socket

    def send(text: str) -> None:
        from ipyparallel.serialize import serialize_object

        data = {SAMPLE_KEY: encode_data(text)}
        session.send(socket_, "data_message", content={"keys": list(data)}, parent=parent,
                     buffers=serialize_object(data), ident=data_pub.topic)

    return send


def _pre_cell(info: Any = None) -> None:
    s = current()
    if s is not None:
        s.begin_cell()


def _post_cell(result: Any = None) -> None:
    s = current()
    if s is not None:
        s.end_cell()


def _watch_owner(owner: Owner, stop_controller: bool, interval: float = 1.0) -> None:
    """End this rank if the kernel that started the cluster is gone (killed, crashed).

    A kernel that exits normally stops its cluster; one that is SIGKILLed cannot. Then
    rank 0 also ends the controller, identified by PID and start time (never by name),
    and every rank exits, which ends the MPI job: nothing is left behind.
    """
    import psutil

    from jdist.procs import alive, pid_alive

    if owner["host"] != socket.gethostname():
        return  # the kernel runs on another machine: its PID means nothing here
    pid, created = owner["controller"]
    controller = {"pid": int(pid), "create_time": created}

    def watch() -> None:
        while pid_alive(owner["pid"]):
            time.sleep(interval)
        if stop_controller and alive(controller):
            psutil.Process(int(pid)).terminate()
        _unlink_mpi_shm()
        os._exit(0)

    threading.Thread(target=watch, name="jdist-owner-watch", daemon=True).start()


def teardown(finalize_within: float = 2.0) -> None:
    """Release the backend on this rank and finalize MPI (called by the kernel on every rank at once
    before it stops the cluster).

    MPI is finalized only if every rank gets here within ``finalize_within`` seconds (a rank still
    busy would leave the others blocked in ``MPI_Finalize``). A finalized job ends at once when its
    ranks exit; without it mpiexec waits for them about 2 s more (``MPI4PY_RC_FINALIZE=false``
    keeps a rank whose peers died from waiting in ``MPI_Finalize`` at exit).
    """
    s = current()
    if s is not None:
        s.log_hooks.clear()
        s.stop_publisher()
        if s.backend is not None:
            s.backend.teardown()
        s.backend = None
    from mpi4py import MPI

    if MPI.Is_finalized():
        return
    everyone = MPI.COMM_WORLD.Ibarrier()
    deadline = time.monotonic() + finalize_within
    while not everyone.Test():
        if time.monotonic() > deadline:
            return  # not every rank is here: leave MPI as it is
        time.sleep(0.002)
    MPI.Finalize()


def exit_process() -> None:
    """End this rank's process at once (the kernel stops the cluster; :func:`teardown` ran).

    Skips the interpreter's own shutdown (ipykernel, torch and module clean-up), which takes
    about a second per rank and is of no use to a process whose state is being thrown away.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _unlink_mpi_shm()  # MPI_Finalize did, unless a rank was busy
    os._exit(0)


def _note_mpi_shm() -> None:
    """Tell the shell around this engine our MPI shared-memory segments (it removes them after we end,
    also after a SIGKILL; :data:`jdist.kernel.launch.remote.REMOTE_WRAPPER`)."""
    from jdist.procs import mpi_shm_segments

    note = os.environ.get("JDIST_SHM_NOTE")
    if note:
        with open(note, "w") as f:
            f.writelines(f"{path}\n" for path in sorted(mpi_shm_segments([os.getpid()])))


def _terminated() -> None:
    """SIGTERM on a remote rank: remove this job's MPI shared-memory names, then end at once (the
    default action would leave them in that host's /dev/shm, where nobody else can find them)."""
    _unlink_mpi_shm()
    os._exit(128 + signal.SIGTERM)


def _unlink_mpi_shm() -> None:
    """Remove the names of this job's MPICH shared-memory segments before exiting without
    ``MPI_Finalize`` (see :func:`jdist.procs.mpi_shm_segments`); mappings stay valid."""
    from jdist.procs import mpi_shm_segments

    for path in mpi_shm_segments([os.getpid()]):
        try:
            os.unlink(path)
        except OSError:
            pass


def info() -> RankInfo:
    """This rank's :class:`RankInfo`."""
    return describe_rank(session())


def cell_count() -> tuple[int, int]:
    """(current cell id, records logged in it) on this rank."""
    stream = session().stream
    return stream.cell, stream.seq


def records(cell: int, seqs: list[int]) -> list[Record]:
    """Records of the current cell with the given sequence numbers, as far as still kept: the
    kernel's repair of the stream."""
    return session().stream.records(cell, seqs)


def guard_state() -> dict[str, str | None]:
    """Whether this rank broke the process group (a release) and where it was waiting."""
    guard = session().guard
    return guard.state() if guard is not None else {"broken": None, "released_from": None}


def repair_group() -> dict[str, Any]:
    """Re-create the process group after a release broke it (all ranks at once, over MPI).

    Variables stay. The backend re-attaches models to the new group where it can (DDP);
    models that hold the old group (FSDP's device mesh) are reported by name: prepare them again.
    Returns ``{"released_from", "reattached", "stale"}`` for the kernel's message.
    """
    from .backends import _torch
    from .namespace import names_of_objects

    s = session()
    released = s.guard.state()["released_from"] if s.guard is not None else None
    group = _torch.recreate_process_group(s.ctx)
    reattached, stale = [], []
    names = names_of_objects()
    for model in list(s.train.models):
        label = names.get(id(model), type(model).__name__)
        done = s.backend.reattach(model, group) if s.backend is not None else None
        if done is True:
            reattached.append(label)
        elif done is False:
            stale.append(label)
    return {"released_from": released, "reattached": sorted(reattached), "stale": sorted(stale)}


def set_precision(precision: str) -> None:
    """``--precision`` on a running cluster: prepared models use it from their next forward."""
    from . import training

    training.set_precision(session().train, precision)


def set_threads(threads: int) -> None:
    """``--threads`` on a running cluster: torch's intra-op threads of this rank."""
    import torch

    torch.set_num_threads(int(threads))
    os.environ["OMP_NUM_THREADS"] = str(int(threads))  # what the ranks' torchrun environment says


def get_global(name: str) -> Any:
    """The value of ``name`` in this rank's cell namespace (``%dist pull``)."""
    from .namespace import get

    return get(name)


def restore_latest(directory: str, names: dict[str, str | None], every: int, keep: int | None) -> dict[str, Any]:
    """Load the newest automatic checkpoint into the same variables (``%dist restart``)."""
    from .checkpoint import restore_latest as restore

    return restore(directory, names, every, keep)
