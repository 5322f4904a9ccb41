"""Every message that crosses a process boundary, typed in one place.

jdist runs in four places: the notebook kernel, the ranks (ipyparallel engines under MPI),
the Jupyter server and the browser. What they send each other:

=====================  ==========================================  =============================
from -> to             what                                        types here
=====================  ==========================================  =============================
kernel -> ranks        set-up options; remote calls                :class:`SetupConfig`, :class:`RankCall`
ranks -> kernel        rank description (reply to ``setup``)       :class:`RankInfo`
ranks -> kernel        data messages on IOPub (``data_pub``)       :data:`DataMessage` (records,
                                                                   progress, cell end, checkpoints)
kernel -> server       cluster state file (0600 JSON)              :class:`ClusterState`
kernel -> server       run folders (``meta.json`` + records)       :class:`RunMeta`, :data:`Record`
server -> browser      REST replies                                :class:`ClusterModel`, :class:`RunSummaryModel`,
                                                                   :class:`RunDetailModel`, :data:`Panel`...
kernel -> browser      the live dashboard widget: new points       :class:`LivePoints` (+ float64 buffers),
                       (custom message), layout, bars, header      :data:`Panel`, :class:`DashboardHead`
                       (widget state)
=====================  ==========================================  =============================

Wire shapes are ``TypedDict`` s (plain JSON-able dicts). The TypeScript side's types are
generated from the REST and widget models (:func:`typescript`, written to
``labextension/src/protocol.ts`` by ``tools/gen_protocol_ts.py``); a test regenerates them
and fails when the committed file differs.

Functions the kernel runs on the ranks are named by :class:`RankCall`, so the kernel never
imports the rank runtime to send a call::

    >>> RankCall("cell_count")
    RankCall('cell_count')
"""

from __future__ import annotations

import importlib
import os
import pickle
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypedDict, Union

#: Bumped when a message changes incompatibly; kernel and ranks must agree (checked at start).
PROTOCOL_VERSION = 3
#: Key under which data messages travel in ipyparallel's ``data_pub``.
DATA_KEY = "jdist"
#: Key under which a remote rank's guard sends its sample (:class:`jdist.stacks.Sample` text) to
#: the kernel, as an IOPub data message whose parent id is :func:`sample_parent_id` (no request of
#: the client: ipyparallel files it apart from every request).
SAMPLE_KEY = "jdist-sample"


def sample_parent_id(rank: int) -> str:
    """The IOPub parent id under which rank ``rank`` sends its samples.

    >>> sample_parent_id(3)
    'jdist-sample-3'
    """
    return f"jdist-sample-{rank}"


def encode_data(message: Any) -> bytes:
    """A rank's message as it travels in ``data_pub``: one pickle (ipyparallel would otherwise
    walk every record's every value on the rank and again in the kernel).

    >>> decode_data(encode_data({"kind": "progress", "cell": 1}))
    {'kind': 'progress', 'cell': 1}
    """
    return pickle.dumps(message, protocol=5)


def decode_data(payload: Any) -> Any:
    """The message :func:`encode_data` made (from the ranks of this cluster, which ipyparallel
    already trusts with pickles: its messages are signed)."""
    return pickle.loads(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else payload

# -- kernel <-> ranks ----------------------------------------------------------------------------


class Owner(TypedDict):
    """The kernel that started a cluster: the ranks end themselves when it is gone."""

    host: str
    pid: int
    controller: list[float]  # [pid, create_time] of the ipyparallel controller


class SetupConfig(TypedDict):
    """What ``jdist.rank.rpc.setup`` receives on every rank."""

    backend: str
    gpus: bool
    timeout: float
    threads: int | None
    precision: str
    work_dir: str | None
    owner: Owner | None
    port: int | None
    cluster_id: str  # the ranks' TORCHELASTIC_RUN_ID
    #: Ranks started on other hosts (--hosts, --slurm): no file of the kernel's host is used, and
    #: samples go back over IOPub. ``ip``/``iface``: the user's --ip/--iface; ``controller_ip``:
    #: the address the controller listens on (rank 0 reaches the kernel's host through it).
    remote: bool
    ip: str | None
    iface: str | None
    controller_ip: str


class RankInfo(TypedDict):
    """One rank, as it describes itself after set-up."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host: str
    pid: int
    device: str
    backend: str
    main_thread: int
    protocol: int
    jdist: str
    slurm_step: str | None  # "<job>.<step>" when Slurm started the rank


#: One metric record: ``rank``, ``cell``, ``seq``, ``step``, ``time``, the automatic metrics of
#: :data:`jdist.metrics.AUTO_METRICS` and every scalar given to ``jdist.log``.
Record = dict[str, Any]
#: Keys every record has besides its metrics (the automatic ones and the logged scalars).
RECORD_KEYS: tuple[str, ...] = ("rank", "seq", "step", "time", "cell")


class RecordsMessage(TypedDict):
    v: int
    kind: Literal["records"]
    cell: int
    records: list[Record]


class ProgressMessage(TypedDict):
    v: int
    kind: Literal["progress"]
    cell: int
    total_steps: int | None


class CellEndMessage(TypedDict):
    """The last message of a cell on a rank: the rest of its records and how many it logged."""

    v: int
    kind: Literal["cell_end"]
    cell: int
    records: list[Record]
    count: int
    total_steps: int | None


class CheckpointEveryMessage(TypedDict):
    """``jdist.checkpoint_every`` settings, with the variable names of the objects it saves
    (the kernel restores them after the ranks died: ``%dist restart``)."""

    v: int
    kind: Literal["checkpoint_every"]
    cell: int
    every: int
    directory: str
    keep: int | None
    names: dict[str, str | None]


class CheckpointSavedMessage(TypedDict):
    v: int
    kind: Literal["checkpoint_saved"]
    cell: int
    path: str
    step: int


DataMessage = Union[RecordsMessage, ProgressMessage, CellEndMessage, CheckpointEveryMessage, CheckpointSavedMessage]
_KINDS = {"records", "progress", "cell_end", "checkpoint_every", "checkpoint_saved"}


def parse_message(payload: Any) -> DataMessage | None:
    """The data message in ``payload``, or None if it is not one of this protocol version's.

    >>> parse_message({"v": PROTOCOL_VERSION, "kind": "progress", "cell": 1, "total_steps": 9})["total_steps"]
    9
    >>> parse_message({"kind": "progress"}) is None   # another version, or someone else's data
    True
    """
    if isinstance(payload, dict) and payload.get("v") == PROTOCOL_VERSION and payload.get("kind") in _KINDS:
        return payload  # type: ignore[return-value]
    return None


class RankCall:
    """A function of :mod:`jdist.rank.rpc`, named, so that the kernel can send it to the ranks
    (``view.apply(RankCall("records"), cell, seqs)``) without importing the rank runtime.
    It pickles as its name; the rank imports the module when called.
    """

    __slots__ = ("name",)
    module = "jdist.rank.rpc"

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankCall, (self.name,))

    def __repr__(self) -> str:
        return f"RankCall({self.name!r})"


# -- kernel -> server ----------------------------------------------------------------------------


class ProcessIdentity(TypedDict):
    pid: int
    create_time: float


class KernelIdentity(TypedDict):
    id: str | None
    connection_file: str | None
    notebook: str | None
    pid: int
    create_time: float


class RankEntry(RankInfo):
    engine_id: int


#: Version of the cluster state file; readers skip other versions.
STATE_VERSION = 2


def clusters_dir(runtime_dir: str | os.PathLike | None = None) -> Path:
    """Where cluster state files go: ``<runtime dir>/jdist/clusters`` (default: ``jupyter_runtime_dir()``)."""
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    return Path(runtime_dir) / "jdist" / "clusters"


class ClusterState(TypedDict):
    """The cluster state file (``<runtime dir>/jdist/clusters/<cluster id>.json``, mode 0600)."""

    version: int
    jdist: str
    cluster_id: str
    host: str
    launcher: str
    kernel: KernelIdentity
    python: str
    controller: ProcessIdentity
    client_file: str
    cluster_file: str
    config: dict[str, Any]
    ranks: list[RankEntry]
    started_at: float
    written_at: float
    run_dir: str


class RunMeta(TypedDict):
    """A run folder's ``meta.json``."""

    run_id: str
    world_size: int
    backend: str
    device_kind: str
    code: str
    total_steps: int | None
    started: float
    ended: float | None
    status: str
    error: str | None
    records: int
    cluster_id: str | None
    hosts: dict[str, str]  # rank (as a JSON key) -> host, when the ranks ran on several hosts


# -- server -> browser (REST; mirrored in labextension/src/protocol.ts) --------------------------

RankStateName = Literal["idle", "busy", "dead", "unknown"]
ClusterStatus = Literal["running", "degraded", "dead"]


class RankModel(TypedDict):
    rank: int
    host: str
    pid: int
    device: str
    local_rank: int | None
    engine_id: int | None
    state: RankStateName


class OptionModel(TypedDict):
    """One ``%%distributed`` option of a cluster: its flag, value, scope and help."""

    name: str
    flag: str
    value: str
    scope: str
    help: str


class ClusterModel(TypedDict):
    cluster_id: str
    kernel_id: str | None
    kernel_pid: int | None
    kernel_state: str | None
    managed: bool
    notebook: str | None
    name: str
    launcher: str
    backend: str
    n: int
    gpus: bool
    timeout: float
    hosts: list[str]
    devices: list[str]
    ranks: list[RankModel]
    options: list[OptionModel]
    status: ClusterStatus
    problem: str | None
    started_at: float | None
    uptime_s: float | None
    current_run: str | None


class ClustersReply(TypedDict):
    clusters: list[ClusterModel]


#: ``[steps, values]``
Series = tuple[list[float], list[Union[float, None]]]


class Sparks(TypedDict):
    loss: Series
    step_time: Series


class RunHeadModel(TypedDict):
    run_id: str
    status: str
    world_size: int
    backend: str
    device_kind: str
    started: float
    ended: float | None
    records: int
    total_steps: int | None
    cluster_id: str | None
    error: str | None
    notebook: str | None
    steps_done: int


class RunSummaryModel(RunHeadModel):
    loss_name: str | None
    last_loss: float | None
    last_step_time_s: float | None
    spark: Sparks


class RunsReply(TypedDict):
    runs: list[RunSummaryModel]


class LineSeries(TypedDict):
    """A line over steps; ``low``/``high``: a band around it (None: no band)."""

    name: str
    color: str
    x: list[float]
    y: list[float | None]
    low: list[float | None] | None
    high: list[float | None] | None


class LinePanel(TypedDict):
    key: str
    kind: Literal["line"]
    title: str
    x_title: str
    series: list[LineSeries]


class BarSeries(TypedDict):
    """One bar per category; ``labels``: write each bar's value above it (values too small to see)."""

    name: str
    color: str
    values: list[float | None]
    labels: bool


class BarPanel(TypedDict):
    key: str
    kind: Literal["bars"]
    title: str
    unit: str
    stacked: bool
    categories: list[str]
    series: list[BarSeries]


Panel = Union[LinePanel, BarPanel]


class RunDetailModel(RunHeadModel):
    code: str
    path: str
    eta_s: float | None
    summary: str
    panels: list[Panel]


class ActionResult(TypedDict):
    ok: bool
    via: str | None
    message: str


class LiveLine(TypedDict):
    """One line series' new points in a :class:`LivePoints` message: ``n`` points whose columns
    (x, y, then low and high when ``band``) are the message's next float64 buffers (NaN: no value).
    ``reset``: drop the series' points first; ``replace_from``: drop its points at x >= it first."""

    panel: str
    series: str
    n: int
    band: bool
    reset: bool
    replace_from: float | None


class LivePoints(TypedDict):
    """Kernel -> browser, the live notebook dashboard's custom widget message: new line points.
    ``seq`` counts the messages of one dashboard from 0 (the browser notes a gap)."""

    type: Literal["points"]
    seq: int
    lines: list[LiveLine]


class DashboardHead(TypedDict):
    """The live notebook dashboard's header and progress line (a widget trait)."""

    title: str
    status: str
    problem: str | None
    done: int
    total: int | None
    progress: str


#: The REST models, in the order the TypeScript file declares them.
REST_MODELS: tuple[Any, ...] = (
    RankModel, OptionModel, ClusterModel, ClustersReply, Sparks, RunHeadModel, RunSummaryModel, RunsReply,
    LineSeries, LinePanel, BarSeries, BarPanel, RunDetailModel, ActionResult, LiveLine, LivePoints, DashboardHead,
)
#: Type aliases of the REST models: (TypeScript name, Python type).
REST_ALIASES: tuple[tuple[str, Any], ...] = (
    ("RankState", RankStateName), ("ClusterStatus", ClusterStatus), ("Series", Series), ("Panel", Panel),
)


def _ts_name(tp: Any) -> str:
    return "I" + tp.__name__.removesuffix("Model")


def _ts_type(tp: Any, aliases: dict[Any, str]) -> str:
    if tp in aliases:
        return aliases[tp]
    if tp is type(None):
        return "null"
    if tp in (int, float):
        return "number"
    if tp is str:
        return "string"
    if tp is bool:
        return "boolean"
    if tp is Any:
        return "any"
    if typing.is_typeddict(tp):
        return _ts_name(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        parts = [_ts_type(a, aliases) for a in args]
        return " | ".join(parts)
    if origin is list:
        inner = _ts_type(args[0], aliases)
        return f"({inner})[]" if " | " in inner else f"{inner}[]"
    if origin is tuple:
        return "[" + ", ".join(_ts_type(a, aliases) for a in args) + "]"
    if origin is dict:
        return f"Record<string, {_ts_type(args[1], aliases)}>"
    raise TypeError(f"no TypeScript type for {tp!r}")


def typescript() -> str:
    """The TypeScript declarations of the REST models (``labextension/src/protocol.ts``)."""
    aliases = {tp: name for name, tp in REST_ALIASES}
    out = [
        "/**",
        " * The jdist server extension's REST models. GENERATED from jdist/protocol.py by",
        " * tools/gen_protocol_ts.py: do not edit (tests/test_protocol.py checks it is current).",
        " */",
        "",
    ]
    for name, tp in REST_ALIASES:
        out += [f"export type {name} = {_ts_type(tp, {k: v for k, v in aliases.items() if k is not tp})};", ""]
    for model in REST_MODELS:  # flattened: TypedDict inheritance is not kept at run time
        out.append(f"export interface {_ts_name(model)} {{")
        out += [f"  {field}: {_ts_type(tp, aliases)};" for field, tp in typing.get_type_hints(model).items()]
        out += ["}", ""]
    return "\n".join(out)
