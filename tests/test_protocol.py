"""The typed messages between the processes (jdist.protocol) and the TypeScript side's copy."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
import types
import typing
from typing import Any, Literal, Union

from labserver import REPO

from jdist.metrics import Run
from jdist.protocol import (PROTOCOL_VERSION, REST_MODELS, CellEndMessage, ClusterModel, ClusterState, RankCall,
                            RunDetailModel, RunSummaryModel, parse_message)


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_protocol_ts", REPO / "tools" / "gen_protocol_ts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_typescript_types_are_generated_from_the_python_models():
    """labextension/src/protocol.ts must be what tools/gen_protocol_ts.py writes now: a Python model
    changed without regenerating it (and rebuilding the extension) fails here."""
    committed = (REPO / "labextension" / "src" / "protocol.ts").read_text()
    assert committed == _generator().typescript(), "run tools/gen_protocol_ts.py, then make labextension"
    out = subprocess.run([sys.executable, str(REPO / "tools" / "gen_protocol_ts.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def conforms(value: Any, tp: Any, where: str = "reply") -> list[str]:
    """Where ``value`` differs from the type ``tp`` (a TypedDict: exactly its keys, recursively)."""
    if tp is Any:
        return []
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not a {tp.__name__}"]
        hints = typing.get_type_hints(tp)
        problems = [f"{where}: keys {sorted(set(value) ^ set(hints))} differ from {tp.__name__}"] \
            if set(value) != set(hints) else []
        return problems + [p for k in hints.keys() & value.keys() for p in conforms(value[k], hints[k], f"{where}.{k}")]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        options = [conforms(value, a, where) for a in args]
        return [] if any(not o for o in options) else [f"{where}: {value!r:.60} is none of {tp}"]
    if origin is Literal:
        return [] if value in args else [f"{where}: {value!r} not in {args}"]
    if origin is list:
        return [] if isinstance(value, list) and not (bad := [p for i, v in enumerate(value)
                                                              for p in conforms(v, args[0], f"{where}[{i}]")]) \
            else ([f"{where}: not a list"] if not isinstance(value, list) else bad)
    if origin is tuple:
        if not isinstance(value, (tuple, list)) or len(value) != len(args):
            return [f"{where}: not a {len(args)}-tuple"]
        return [p for i, (v, a) in enumerate(zip(value, args)) for p in conforms(v, a, f"{where}[{i}]")]
    if origin is dict:
        return [] if isinstance(value, dict) else [f"{where}: not a dict"]
    if tp is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    if tp is float:
        return [] if isinstance(value, (int, float)) and not isinstance(value, bool) else [f"{where}: not a number"]
    return [] if isinstance(value, tp) else [f"{where}: {value!r:.60} is not a {tp.__name__}"]


def test_the_rest_replies_the_server_builds_have_exactly_their_models_fields(tmp_path):
    """The producers of the REST replies (not the generator) checked against the models the
    TypeScript is generated from: a field added to a reply and not to its model fails here."""
    from jdist.server.manager import JdistManager
    from jdist.server.runs import run_detail, run_summary

    run = Run("r1", 2, backend="ddp", total_steps=10, hosts={0: "a", 1: "b"})
    run.add([{"rank": r, "seq": s, "cell": 1, "step": s, "time": 100.0 + s, "loss": 1.0 / (s + 1), "val_loss": 2.0,
              "step_time_s": 0.1, "comm_time_s": 0.02, "compute_time_s": 0.08, "mem_bytes": 2**20,
              "mem_peak_bytes": 2**21, "samples_per_s": 320.0, "state_bytes": 4096} for s in range(5) for r in (0, 1)])
    assert conforms(run_summary(run, set(), None), RunSummaryModel) == []
    assert conforms(run_detail(run, {"c"}, "nb.ipynb", tmp_path), RunDetailModel) == []
    m = JdistManager(runtime_dirs=[tmp_path], run_dir=tmp_path)
    try:
        state = ClusterState(version=0, jdist="x", cluster_id="c", host="h", launcher="local-mpi",
                             kernel={"id": "k", "connection_file": None, "notebook": None, "pid": 1, "create_time": 0.0},
                             python="p", controller={"pid": 2, "create_time": 0.0}, client_file="f", cluster_file="g",
                             config={"n": 2, "gpus": False, "backend": "ddp", "timeout": 30.0},
                             options=[{"name": "n", "flag": "-n", "value": "2", "scope": "restart", "help": "ranks"}],
                             ranks=[], started_at=1.0, written_at=1.0, run_dir=str(tmp_path), paused=[])
        assert conforms(m._cluster_view(state, {}, None, {}, {}), ClusterModel) == []
    finally:
        m.close()
    assert conforms({"a": 1, "b": 2}, RunSummaryModel)  # the check itself can fail


def test_the_frontend_uses_the_generated_types_only():
    """No hand-written copy of a REST model is left in the frontend's sources."""
    for path in (REPO / "labextension" / "src").glob("*.ts"):
        if path.name == "protocol.ts":
            continue
        text = path.read_text()
        for model in REST_MODELS:
            assert f"interface I{model.__name__.removesuffix('Model')} " not in text, (path.name, model.__name__)


def test_data_messages_of_another_version_are_ignored():
    msg = CellEndMessage(v=PROTOCOL_VERSION, kind="cell_end", cell=3, records=[], count=0, total_steps=None,
                         checkpoints=[])
    assert parse_message(msg) == msg
    assert parse_message({**msg, "v": PROTOCOL_VERSION + 1}) is None
    assert parse_message({**msg, "kind": "gossip"}) is None
    assert parse_message(["not", "a", "message"]) is None


def test_a_rank_call_travels_as_its_name():
    call = pickle.loads(pickle.dumps(RankCall("cell_count")))
    assert call.name == "cell_count" and b"jdist.rank" not in pickle.dumps(RankCall("x"))


def test_every_name_the_kernel_calls_on_the_ranks_is_a_function_of_rank_rpc():
    """The kernel names rank functions as strings (it never imports jdist.rank.rpc): each ``RankCall("…")`` and
    ``.call("…")`` outside jdist/rank must name a function rpc.py defines, or it would fail only on the ranks."""
    import ast
    import re

    tree = ast.parse((REPO / "jdist" / "rank" / "rpc.py").read_text())
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    called: dict[str, str] = {}
    for path in sorted((REPO / "jdist").rglob("*.py")):
        if "rank" in path.relative_to(REPO / "jdist").parts[:1]:
            continue
        for name in re.findall(r'(?:RankCall\(|\.call\()"([A-Za-z_]+)"', path.read_text()):
            called.setdefault(name, str(path.relative_to(REPO)))
    assert len(called) >= 20, called  # the scan found the calls
    unknown = {name: where for name, where in called.items() if name not in defined}
    assert not unknown, f"not functions of jdist/rank/rpc.py: {unknown}"


def test_protocol_holds_wire_types_only():
    """The codec, the shared paths and the TypeScript generator live elsewhere (one concern each)."""
    import jdist.protocol as protocol

    functions = sorted(n for n, v in vars(protocol).items()
                       if isinstance(v, types.FunctionType) and v.__module__ == protocol.__name__)
    assert functions == ["parse_message", "sample_parent_id"]
