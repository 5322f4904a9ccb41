"""Turning an engine into a rank: the steps of ``setup``, in the order they run.

:func:`setup` (called by the kernel on every engine at once, ``RankCall("setup")``) reads the
MPI world (:func:`mpi_world`), chooses the process group's address when the ranks span hosts
(:func:`rendezvous_address`, :func:`socket_interface`), pins the device (the backend's ``pin_device``),
installs the guard (:func:`install_guard`), sets up the backend and the session
(:func:`start_session`), applies the rank-side options (:func:`apply_options`: the same code a
live change runs) and opens the cell namespace (:func:`open_namespace`), all under
:func:`watch_setup` (stacks for the kernel if it takes longer than ``--timeout``). What happens to the
process afterwards (the kernel gone, SIGTERM, exit) is :mod:`jdist.rank.process`.

On an engine (the kernel sends it as ``RankCall("setup")`` to every engine at once)::

    info = setup(config)            # a jdist.protocol.SetupConfig
    info["rank"], info["world_size"]  # (0, 2)
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Callable

from jdist.protocol import NetworkPlan, RankInfo, SetupConfig

from . import process
from .namespace import install_exit
from .session import RankSession, activate, describe_rank


@dataclass(frozen=True)
class World:
    """This rank's place in the MPI world."""

    comm: Any  # mpi4py MPI.COMM_WORLD
    rank: int
    size: int
    local_rank: int
    local_size: int
    hostname: str
    hosts: list[str]  # every rank's host, by rank


def setup(config: SetupConfig) -> RankInfo:
    """Initialise this engine as one rank; returns its :class:`RankInfo` (see the module doc)."""
    from .stderr import capture

    capture()  # fd 2 through a file: a library's last words before a crash are not lost (jdist.common.last_words)
    stop_watch = watch_setup(config)
    try:
        return _setup(config)
    finally:
        stop_watch()


def _setup(config: SetupConfig) -> RankInfo:
    from jdist.plugins import backend_spec

    world = mpi_world()
    network = config.get("network")
    master_addr = "127.0.0.1" if len(set(world.hosts)) == 1 else rendezvous_address(world, network)
    if master_addr != "127.0.0.1":
        socket_interface(master_addr, network.get("iface") if network else None, world)
    spec = backend_spec(config["backend"])
    backend_cls = spec.load()
    device = backend_cls.pin_device(world, bool(config.get("gpus")))
    own = {o.name for o in spec.options} | set(backend_cls.own_rank_options)
    options = config.get("options") or {}
    data_pub = _data_pub()
    guard = install_guard(spec, world.rank, None if network else config.get("work_dir"), data_pub)
    s = start_session(world, device, master_addr, spec, guard, data_pub, config,
                      {k: v for k, v in options.items() if k in own}, backend_cls())
    learn_meshes(s)
    apply_options(s, {k: v for k, v in options.items() if k not in own}, at_start=True)
    open_namespace(s)
    if config.get("owner"):
        process.watch_owner(config["owner"], world.rank == 0)
    s.report_env = tuple(config.get("report_env") or ())
    return describe_rank(s)


def learn_meshes(s: RankSession) -> None:
    """On torch ranks, every device mesh the code builds is noted with its dimension names (the records'
    communication time per dimension: :mod:`jdist.rank.mesh.dims`)."""
    from .backends.torch_group import TorchBackend

    if isinstance(s.backend, TorchBackend):
        from .mesh.dims import learn_meshes as install
        from .torchrun import new_group

        install(new_group)  # (a mesh's groups: their sockets noted by the guard, as new_group's)


def watch_setup(config: SetupConfig) -> Callable[[], None]:
    """If this rank's set-up takes longer than ``--timeout``, a thread writes the main thread's stack, and
    again every ``--timeout`` s (the kernel shows the newest, where the rank was when it gave up waiting),
    where the kernel reads them: ``setup-stacks-<pid>.txt`` in the cluster's folder (ranks on the kernel's
    host), else this process's stderr (the launcher's output). Returns what ends the watch.

    The thread reads the frames under the GIL (``sys._current_frames``), which a set-up waiting in MPI, a
    socket or a process group's store releases. Not ``faulthandler.dump_traceback_later``: its thread reads
    other threads' frames without the GIL, and crashed a TensorFlow rank whose main thread was importing
    TensorFlow (SIGSEGV in ``_PyInterpreterFrame_GetLine``, from a core dump; about once in 15 full test runs,
    with ``--timeout 5``). A set-up stuck in C code that holds the GIL gets no stack (the kernel says so)."""
    import threading

    from jdist.common.stacks import SETUP_DUMP_PREFIX, format_thread, setup_dump_header

    from .guard import frames_of

    work_dir = None if config.get("network") else config.get("work_dir")
    path = os.path.join(work_dir, f"{SETUP_DUMP_PREFIX}{os.getpid()}.txt") if work_dir else None
    main = threading.main_thread().ident or 0
    try:
        if path:
            from mpi4py import MPI  # the engine's MPI is up: a local question, it cannot wait for others

            out = open(path, "w")
            out.write(setup_dump_header(os.getpid(), main, MPI.COMM_WORLD.Get_rank()))
            out.flush()
        elif sys.__stderr__ is not None:
            out = sys.__stderr__
        else:
            return lambda: None
    except Exception:  # no dump is no reason to fail the set-up (whose own steps then say what is wrong)
        return lambda: None
    done, lock = threading.Event(), threading.Lock()

    def watch() -> None:
        while not done.wait(float(config.get("timeout", 60))):
            text = format_thread(main, frames_of(sys._current_frames().get(main)))
            with lock:
                if done.is_set():
                    return
                out.write(text)
                out.flush()

    threading.Thread(target=watch, name="jdist-setup-watch", daemon=True).start()

    def stop() -> None:
        with lock:
            done.set()
        if path:
            out.close()
            try:
                os.unlink(path)
            except OSError:
                pass

    return stop


def mpi_world() -> World:
    """Rank and size from ``MPI.COMM_WORLD``; local rank from the ranks sharing this host's memory."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    hostname = socket.gethostname()
    return World(comm, rank, comm.Get_size(), local.Get_rank(), local.Get_size(), hostname, comm.allgather(hostname))


def rendezvous_address(world: World, network: NetworkPlan | None) -> str:
    """Rank 0 chooses the address of its host that the process group uses, and tells the others:
    ``--ip`` if it is an address of rank 0's host, else ``--iface``'s address there, else the
    address its route to the kernel's host leaves from (never a loopback address)."""
    from jdist.common.network import address_of, interface_of, is_loopback, route_source

    plan: dict[str, Any] = dict(network or {})
    addr, error = None, None
    if world.rank == 0:
        ip, iface, controller_ip = plan.get("ip"), plan.get("iface"), plan.get("controller_ip") or "127.0.0.1"
        try:
            if ip and interface_of(ip) is not None:
                addr = ip
            elif iface:
                addr = address_of(iface)
                if addr is None:
                    error = f"--iface {iface}: rank 0's host {world.hostname} has no such interface"
            else:
                addr = route_source(controller_ip)
        except OSError as exc:
            error = f"rank 0 on {world.hostname} has no route to {controller_ip} ({exc})"
        if addr is not None and is_loopback(addr):
            error = (f"rank 0 on {world.hostname} would use loopback address {addr} between hosts; "
                     "give --ip ADDR or --iface NAME")
    addr, error = world.comm.bcast((addr, error), root=0)
    if error:
        raise RuntimeError(error)
    return str(addr)


def socket_interface(master_addr: str, iface: str | None, world: World) -> str:
    """Tell gloo and NCCL the interface of this host that reaches rank 0 (unless the user set them):
    ``--iface``, else the one the route to ``master_addr`` leaves from; never ``lo`` between hosts."""
    from jdist.common.network import interface_of, route_source

    name = iface or interface_of(route_source(master_addr))
    if name is None or name == "lo":
        raise RuntimeError(f"rank {world.rank} on {world.hostname} reaches rank 0's address {master_addr} only "
                           f"over {name or 'no interface'}; give --iface NAME (the network between the hosts)")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
    return name


def _data_pub() -> Any:
    """The engine's IOPub data publisher (None outside an engine)."""
    from IPython import get_ipython

    shell = get_ipython()
    return getattr(shell, "data_pub", None) if shell is not None else None


def install_guard(spec: Any, rank: int, work_dir: str | None, data_pub: Any) -> Any:
    """The rank's guard (stack dumps, samples, releases). ``work_dir``: a folder of the kernel's
    host for its files (local ranks); None: ranks on other hosts send samples over IOPub, and
    end on SIGTERM removing their MPI shared memory (:mod:`jdist.rank.process`)."""
    from .guard import Guard

    guard = Guard(spec.backward_waits, spec.collective_paths)
    guard.install(rank, work_dir, report=None if work_dir else sample_sender(data_pub, rank))
    if work_dir is None:
        process.end_on_sigterm(guard)
    return guard


def sample_sender(data_pub: Any, rank: int) -> Callable[[str], None] | None:
    """How a remote rank's guard sends a sample to the kernel: an IOPub data message whose parent
    is :func:`jdist.protocol.sample_parent_id` in the session of the kernel's client (taken from
    this set-up request), so ipyparallel files it apart from every request."""
    if data_pub is None:
        return None
    from jdist.codec import encode_data
    from jdist.protocol import SAMPLE_KEY, sample_parent_id

    parent = dict(data_pub.parent_header or {})
    parent["msg_id"] = sample_parent_id(rank)
    session, socket_ = data_pub.session, data_pub.pub_socket

    def send(text: str) -> None:
        from ipyparallel.serialize import serialize_object

        data = {SAMPLE_KEY: encode_data(text)}
        session.send(socket_, "data_message", content={"keys": list(data)}, parent=parent,
                     buffers=serialize_object(data), ident=data_pub.topic)

    return send


def start_session(world: World, device: Any, master_addr: str, spec: Any, guard: Any, data_pub: Any,
                  config: SetupConfig, backend_options: dict[str, Any], backend: Any) -> RankSession:
    """The backend's group and this rank's :class:`RankSession` (made current, its publisher
    running), with the environment the backend's framework expects (``Backend.environment``: torchrun's on
    torch ranks, :mod:`jdist.rank.torchrun`)."""
    from .backends.base import RankContext
    from .channel import DataPubChannel, NullChannel

    ctx = RankContext(rank=world.rank, world_size=world.size, local_rank=world.local_rank,
                      local_world_size=world.local_size, hostname=world.hostname, device=device,
                      master_addr=master_addr, timeout_s=float(config.get("timeout", 60)), comm=world.comm,
                      work_dir=None if config.get("network") else config.get("work_dir"), port=config.get("port"),
                      guard=guard, options=dict(backend_options))
    guard.marker = backend.collectives_started
    s = RankSession(ctx=ctx, backend=backend, spec=spec,
                    channel=DataPubChannel(data_pub) if data_pub is not None else NullChannel(), guard=guard,
                    comm_timed=backend.times_comm)
    backend.setup(ctx, s.timer)
    backend.environment(ctx, config.get("cluster_id") or "jdist")
    previous = activate(s)
    if previous is not None:
        previous.stop_publisher()
    s.start_publisher()
    return s


#: ``OMP_NUM_THREADS`` as the rank process inherited it from the user's environment, before jdist set it:
#: without ``--threads`` it wins over cores / ranks, as torchrun keeps it.
INHERITED_OMP = os.environ.get("OMP_NUM_THREADS")


def default_threads(inherited: str | None, cores: int, local_ranks: int) -> int:
    """torch threads per rank when ``--threads`` is not given: the user's ``OMP_NUM_THREADS``, else cores / ranks.

    >>> default_threads("3", 2, 2), default_threads(None, 8, 2), default_threads("lots", 2, 4)
    (3, 4, 1)
    """
    if inherited and inherited.strip().isdigit() and int(inherited) > 0:
        return int(inherited)
    return max(1, cores // local_ranks)


def _set_threads(s: RankSession, threads: int | None) -> None:
    import torch

    if threads is None and s.ctx.device_kind == "cuda":
        return  # GPU ranks keep torch's own choice unless asked
    n = int(threads) if threads else default_threads(INHERITED_OMP, os.cpu_count() or 1, s.ctx.local_world_size)
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)  # what the ranks' torchrun environment says


def _set_precision(s: RankSession, precision: str | None) -> None:
    from .training import apply_precision

    apply_precision(s, precision or "fp32")


def _set_mesh(s: RankSession, text: str | None) -> None:
    from .mesh.api import set_mesh

    set_mesh(s, text)


def _set_auto_metrics(s: RankSession, on: bool | None) -> None:
    from .auto_metrics import disable, enable

    if on is None or on:
        enable(s)
    else:
        disable(s)


#: How each option applied on the ranks (``applied_by="ranks"`` in :mod:`jdist.options`) takes
#: effect on a rank, at start and when it changes on a running cluster.
APPLY: dict[str, Callable[[RankSession, Any], None]] = {
    "threads": _set_threads,
    "precision": _set_precision,
    "auto_metrics": _set_auto_metrics,
    "mesh": _set_mesh,
}


def apply_options(s: RankSession, values: dict[str, Any], at_start: bool = False) -> None:
    """Apply rank-side option values: jdist's own by :data:`APPLY`, the backend's own (and jdist's that
    it applies itself, ``own_rank_options``) by :meth:`Backend.apply_option <jdist.rank.backends.Backend.apply_option>`."""
    own = {o.name for o in s.spec.options} if s.spec is not None else set()
    own |= set(getattr(s.backend, "own_rank_options", ()))
    for name, value in values.items():
        if name in own and s.backend is not None:
            s.backend.apply_option(name, value)
        elif name in APPLY:
            APPLY[name](s, value)
        elif not at_start:
            raise ValueError(f"No rank applies option {name!r}: it is not one of jdist's rank-side options "
                             f"({', '.join(APPLY)}) nor of --backend {s.backend_name}.")


def open_namespace(s: RankSession) -> None:
    """``rank``, ``world_size``, ``local_rank``, ``device`` and ``jdist`` in the cell namespace, and
    the IPython hooks that begin and end each cell's record stream."""
    import jdist
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    ctx = s.ctx
    shell.user_ns.update(rank=ctx.rank, world_size=ctx.world_size, local_rank=ctx.local_rank, device=ctx.device,
                         jdist=jdist)
    if s.backend is not None:
        shell.user_ns.update(s.backend.namespace())
    install_exit(shell)
    from .debug import relay as debug

    debug.install()  # breakpoint() / pdb.set_trace(): relayed to the notebook on the ranks chosen per cell
    for event, fn in (("pre_run_cell", _pre_cell), ("post_run_cell", _post_cell)):
        if fn not in shell.events.callbacks[event]:
            shell.events.register(event, fn)


def _pre_cell(info: Any = None) -> None:
    from .session import current

    s = current()
    if s is not None:
        s.begin_cell()


def _post_cell(result: Any = None) -> None:
    from .debug import relay as debug
    from .session import current

    error = getattr(result, "error_in_exec", None)
    debug.note_failure(error)  # for %dist debug (a post-mortem)
    debug.cell_ended()  # a breakpoint()'s pdb still stepping lets go
    s = current()
    if s is not None:
        if s.backend is not None:
            s.backend.cell_ended(error)
        s.end_cell()
