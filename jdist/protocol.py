"""Every message that crosses a process boundary, typed in one place.

jdist runs in four places: the notebook kernel, the ranks (ipyparallel engines under MPI),
the Jupyter server and the browser. What they send each other:

=====================  ==========================================  =============================
from -> to             what                                        types here
=====================  ==========================================  =============================
kernel -> ranks        set-up options; remote calls                :class:`SetupConfig`, :class:`RankCall`
ranks -> kernel        rank description (reply to ``setup``)       :class:`RankInfo`
ranks -> kernel        data messages on IOPub (``data_pub``)       :data:`DataMessage` (records,
                                                                   progress, cell end, checkpoints,
                                                                   a sweep's trial requests)
kernel -> ranks        answers to a trial (engine control channel) ``jdist_tune_reply`` (jdist.rank.tune)
kernel -> server       cluster state file (0600 JSON)              :class:`ClusterState`
kernel -> server       run folders (``meta.json`` + records)       :class:`RunMeta`, :data:`Record`
server -> browser      REST replies                                :class:`ClusterModel`, :class:`RunSummaryModel`,
                                                                   :class:`RunDetailModel`, :data:`Panel`...
kernel -> browser      the live dashboard widget: new points       :class:`LivePoints` (+ float64 buffers),
                       (custom message), layout, bars, header      :data:`Panel`, :class:`DashboardHead`
                       (widget state)
=====================  ==========================================  =============================

Wire shapes are ``TypedDict`` s (plain JSON-able dicts); nothing else lives here. A rank's data
messages travel pickled (:mod:`jdist.codec`). The TypeScript side's types are generated from
the REST and widget models listed in :data:`REST_MODELS` (``tools/gen_protocol_ts.py`` writes
``labextension/src/protocol.ts``; a test fails when the committed file differs).

Functions the kernel runs on the ranks are named by :class:`RankCall`, so the kernel never
imports the rank runtime to send a call::

    >>> RankCall("cell_count")
    RankCall('cell_count')
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Literal, TypedDict, Union

#: Bumped when a message changes incompatibly; kernel and ranks must agree (checked at start).
PROTOCOL_VERSION = 4
#: Key under which data messages travel in ipyparallel's ``data_pub``.
DATA_KEY = "jdist"
#: Key under which a remote rank's guard sends its sample (:class:`jdist.common.stacks.Sample` text) to
#: the kernel, as an IOPub data message whose parent id is :func:`sample_parent_id` (no request of
#: the client: ipyparallel files it apart from every request).
SAMPLE_KEY = "jdist-sample"


def sample_parent_id(rank: int) -> str:
    """The IOPub parent id under which rank ``rank`` sends its samples.

    >>> sample_parent_id(3)
    'jdist-sample-3'
    """
    return f"jdist-sample-{rank}"


# -- kernel <-> ranks ----------------------------------------------------------------------------


class Owner(TypedDict):
    """The kernel that started a cluster: the ranks end themselves when it is gone."""

    host: str
    pid: int
    controller: list[float]  # [pid, create_time] of the ipyparallel controller


class NetworkPlan(TypedDict):
    """How ranks that may run on other hosts than the kernel's find each other (a remote
    launcher's :meth:`~jdist.kernel.launch.RankLauncher.network`). ``controller_ip``: the
    address the controller listens on (rank 0's route to it picks the process group's address);
    ``ip``/``iface``: the user's choice of address or interface, if any."""

    controller_ip: str
    ip: str | None
    iface: str | None


class SetupConfig(TypedDict):
    """What ``jdist.rank.rpc.setup`` receives on every rank."""

    backend: str
    gpus: bool
    timeout: float
    port: int | None
    #: The values of the options the ranks apply (``applied_by="ranks"``: --precision, --threads)
    #: and of the backend's own options, by name (jdist.options).
    options: dict[str, Any]
    work_dir: str | None
    owner: Owner | None
    cluster_id: str  # the ranks' TORCHELASTIC_RUN_ID
    #: None: every rank runs on the kernel's host. Else the ranks may run on other hosts: no file
    #: of the kernel's host is used, and samples go back over IOPub.
    network: NetworkPlan | None
    #: Environment variables each rank reports back (``RankInfo.launcher``): what its launcher
    #: needs to know of the rank (e.g. the Slurm job step).
    report_env: list[str]


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
    launcher: dict[str, str | None]  # the SetupConfig's report_env, as this rank's environment has them


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


class CellEndMessage(TypedDict):
    """The last message of a cell on a rank: the rest of its records, how many it logged, and again the
    cell's checkpoint messages (the latest of each kind, in the order sent): a short cell's messages can all
    arrive before the kernel listens, and then only this last one is kept."""

    v: int
    kind: Literal["cell_end"]
    cell: int
    records: list[Record]
    count: int
    total_steps: int | None
    checkpoints: list[CheckpointEveryMessage | CheckpointSavedMessage]


class TuneMessage(TypedDict):
    """A trial of ``jdist.tune`` to the kernel's study (slot rank 0): ``op`` "suggest" (payload name,
    kind, args) and "should_prune" wait for the kernel's answer on the engine's control channel
    (``{"trial", "seq", "value"}`` or ``"error"``); "started" (time, repaired), "report" (value,
    step) and "user_attr" (key, value) do not. The trial's value is the reply to its ``apply``."""

    v: int
    kind: Literal["tune"]
    cell: int
    trial: int
    op: Literal["started", "suggest", "should_prune", "report", "user_attr"]
    seq: int
    payload: dict[str, Any]


class DebugMessage(TypedDict):
    """A rank stopped at ``breakpoint()`` (``%%distributed --debug-ranks``): pdb's output so far, ending in
    its prompt; the rank waits for the line typed in the notebook, sent on the engine's control channel
    as ``jdist_debug_reply`` (``{"seq", "line"}``)."""

    v: int
    kind: Literal["debug"]
    cell: int
    seq: int
    text: str


class DapMessage(TypedDict):
    """An event of a rank's debugpy (JupyterLab's Debugger panel on a ``%%distributed`` cell: "stopped",
    "continued", "thread", "output"), as debugpy sent it; the kernel renumbers its ids for the panel
    (:mod:`jdist.kernel.debug.dapbridge`). Requests go to the rank on the control channel as ``jdist_dap_request``
    (a DAP request; the answer is the ``response`` of the control reply)."""

    v: int
    kind: Literal["dap"]
    cell: int
    event: dict[str, Any]


#: A run's or a sweep's folder name: also its id in the server's URLs.
FOLDER_NAME = re.compile(r"[A-Za-z0-9_.-]+")

#: Control-channel messages the kernel sends to a rank that waits for an answer (``Client._send_control_request``;
#: the rank registers a control handler for them: :func:`jdist.rank.channel.on_control`).
#: to a trial's request: {"trial", "seq", "value"} or "error"; or the kernel stops a trial: {"trial", "stop": why}
TUNE_REPLY = "jdist_tune_reply"
DEBUG_REPLY = "jdist_debug_reply"  # to a rank stopped at breakpoint(): {"seq", "line"}
DAP_REQUEST = "jdist_dap_request"  # a DAP request for the rank's debugpy: its answer is the reply's "response"


class GpuSample(TypedDict):
    """One GPU of a host (NVML): its index, utilisation (0..1) and memory in use and in all (bytes)."""

    index: int
    util: float | None
    mem_used: int
    mem_total: int


class HostMessage(TypedDict):
    """The load of a rank's host, sent about once a second by the host's lowest rank while a cell
    runs (``jdist.rank.hostload``): CPU busy (0..1, all cores), memory in use and in all (bytes),
    network bytes/s in and out (every interface but loopback), its GPUs."""

    v: int
    kind: Literal["host"]
    cell: int
    host: str
    time: float
    cpu: float | None
    mem_used: int
    mem_total: int
    net_bytes_s: float | None
    gpus: list[GpuSample]


class PipelineMessage(TypedDict):
    """A rank's pipeline actions (``torch.distributed.pipelining``'s schedules, :mod:`jdist.rank.mesh.pipeline`),
    sent with its records: one row per forward ("F"), backward ("B") or weight-gradient ("W") action of a
    micro-batch, ``[step, rank, stage, microbatch, action, start, end]`` (unix seconds; ``step``: the record's)."""

    v: int
    kind: Literal["pipeline"]
    cell: int
    rank: int
    rows: list[list[Any]]


DataMessage = Union[RecordsMessage, ProgressMessage, CellEndMessage, CheckpointEveryMessage, CheckpointSavedMessage,
                    TuneMessage, DebugMessage, DapMessage, HostMessage, PipelineMessage]
_KINDS = {"records", "progress", "cell_end", "checkpoint_every", "checkpoint_saved", "tune", "debug", "dap", "host",
          "pipeline"}


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
    create_time: float  # the process's start, seconds after the machine booted (jdist.common.procs.started)


class KernelIdentity(TypedDict):
    id: str | None
    connection_file: str | None
    notebook: str | None
    pid: int
    create_time: float


class RankEntry(RankInfo):
    engine_id: int


#: Version of the cluster state file; readers skip other versions.
STATE_VERSION = 3


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
    options: list[OptionModel]  # the config's options as the sidebar lists them (described by the kernel)
    ranks: list[RankEntry]
    started_at: float
    written_at: float
    run_dir: str
    paused: list[int]  # ranks stopped at breakpoint() (``--debug-ranks``), waiting for a line typed in the notebook


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
    stragglers: list[dict[str, Any]]  # the ranks named as stragglers (jdist.metrics.stragglers.Straggler's fields)


# -- server -> browser (REST; mirrored in labextension/src/protocol.ts) --------------------------

RankStateName = Literal["idle", "busy", "paused", "dead", "unknown"]
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


class SparkModel(TypedDict):
    """One sparkline of a run in the sidebar's list: a panel's (``jdist.metrics.panels.Spark``).
    ``unit``: ``"s"`` for seconds (written as ms), else ``""``; ``last``: the newest value."""

    key: str
    label: str
    color: str
    unit: str
    x: list[float]
    y: list[float | None]
    last: float | None


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
    sparks: list[SparkModel]


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


class HeatmapPanel(TypedDict):
    """A value per row (a rank) and column (a range of steps), as colour. ``cells``: base64 of one
    byte per cell, row by row: 0..254 from ``low`` to ``high`` (linear), 255 no value; ``x``: the
    last step of each column; ``groups``: the rows' hosts, each ``[host, first row, rows]``
    (empty on one host); ``colors``: the colour scale from ``low`` to ``high``, evenly spaced
    stops to interpolate between; ``legend``: ``[name, colour]`` of the values that are categories (the
    pipeline's actions: drawn as a legend instead of the colour scale; empty: a scale)."""

    key: str
    kind: Literal["heatmap"]
    title: str
    unit: str
    x_title: str
    rows: list[str]
    groups: list[tuple[str, int, int]]
    x: list[float]
    cells: str
    low: float | None
    high: float | None
    colors: list[str]
    legend: list[tuple[str, str]]


class TablePanel(TypedDict):
    """Rows of text under column titles (the slowest ranks); ``note``: a line under them."""

    key: str
    kind: Literal["table"]
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str


Panel = Union[LinePanel, BarPanel, HeatmapPanel, TablePanel]


class RunDetailModel(RunHeadModel):
    code: str
    path: str
    eta_s: float | None
    summary: str
    panels: list[Panel]


SweepStatus = Literal["running", "done", "interrupted", "stopped", "lost"]


class SweepSummaryModel(TypedDict):
    """A ``jdist.tune`` sweep for the sidebar, as the kernel writes it to ``<sweep folder>/sweep.json``
    (``status`` "lost": written "running" by a kernel whose cluster is gone). ``counts``: trials per
    state (COMPLETE, PRUNED, FAIL, INTERRUPTED, RUNNING); ``trials``: the sweep's budget."""

    name: str
    status: SweepStatus
    cluster_id: str | None
    notebook: str | None
    started: float
    ended: float | None
    updated: float
    trials: int
    per_trial: int
    slots: int
    metric: str | None
    direction: str
    counts: dict[str, int]
    best_trial: int | None
    best_value: float | None
    best_params: dict[str, Any] | None
    journal: str


class SweepsReply(TypedDict):
    sweeps: list[SweepSummaryModel]


class SweepDetailModel(SweepSummaryModel):
    """One sweep with its view: the same HTML and SVG the notebook shows (:mod:`jdist.metrics.sweep`)."""

    html: str


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
    RankModel, OptionModel, ClusterModel, ClustersReply, SparkModel, RunHeadModel, RunSummaryModel, RunsReply,
    LineSeries, LinePanel, BarSeries, BarPanel, HeatmapPanel, TablePanel, RunDetailModel, ActionResult, LiveLine, LivePoints, DashboardHead, SweepSummaryModel, SweepsReply,
    SweepDetailModel,
)
#: Type aliases of the REST models: (TypeScript name, Python type).
REST_ALIASES: tuple[tuple[str, Any], ...] = (
    ("RankState", RankStateName), ("ClusterStatus", ClusterStatus), ("Panel", Panel),
    ("SweepStatus", SweepStatus),
)
