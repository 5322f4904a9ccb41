"""The typed messages between the processes (jdist.protocol) and the TypeScript side's copy."""

from __future__ import annotations

import pickle
import subprocess
import sys
import typing

from labserver import REPO

from jdist.protocol import (PROTOCOL_VERSION, REST_MODELS, CellEndMessage, RankCall, parse_message, typescript)


def test_the_typescript_types_are_generated_from_the_python_models():
    """labextension/src/protocol.ts must be what tools/gen_protocol_ts.py writes now: a Python model
    changed without regenerating it (and rebuilding the extension) fails here."""
    committed = (REPO / "labextension" / "src" / "protocol.ts").read_text()
    assert committed == typescript(), "run tools/gen_protocol_ts.py, then make labextension"
    out = subprocess.run([sys.executable, str(REPO / "tools" / "gen_protocol_ts.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_every_rest_model_field_is_in_the_typescript():
    ts = typescript()
    for model in REST_MODELS:
        name = "I" + model.__name__.removesuffix("Model")
        block = ts.split(f"export interface {name} {{", 1)[1].split("}", 1)[0]
        for field in typing.get_type_hints(model):
            assert f"  {field}: " in block, (name, field)


def test_the_frontend_uses_the_generated_types_only():
    """No hand-written copy of a REST model is left in the frontend's sources."""
    for path in (REPO / "labextension" / "src").glob("*.ts"):
        if path.name == "protocol.ts":
            continue
        text = path.read_text()
        for model in REST_MODELS:
            assert f"interface I{model.__name__.removesuffix('Model')} " not in text, (path.name, model.__name__)


def test_data_messages_of_another_version_are_ignored():
    msg = CellEndMessage(v=PROTOCOL_VERSION, kind="cell_end", cell=3, records=[], count=0, total_steps=None)
    assert parse_message(msg) == msg
    assert parse_message({**msg, "v": PROTOCOL_VERSION + 1}) is None
    assert parse_message({**msg, "kind": "gossip"}) is None
    assert parse_message(["not", "a", "message"]) is None


def test_a_rank_call_travels_as_its_name():
    call = pickle.loads(pickle.dumps(RankCall("cell_count")))
    assert call.name == "cell_count" and b"jdist.rank" not in pickle.dumps(RankCall("x"))
