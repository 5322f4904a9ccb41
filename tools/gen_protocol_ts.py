#!/usr/bin/env python3
"""Write labextension/src/protocol.ts: the TypeScript types of the server's REST models, generated
from jdist/protocol.py (``--check``: exit 1 if the committed file differs; tests/test_protocol.py
checks it too). Run ``make labextension`` afterwards to rebuild the prebuilt extension.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "labextension" / "src" / "protocol.ts"
sys.path.insert(0, str(REPO))


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
    from jdist.protocol import REST_ALIASES, REST_MODELS

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


def main(argv: list[str]) -> int:
    text = typescript()
    if argv[1:] == ["--check"]:
        if TARGET.exists() and TARGET.read_text() == text:
            print(f"{TARGET.relative_to(REPO)} is current")
            return 0
        print(f"{TARGET.relative_to(REPO)} is out of date: run tools/gen_protocol_ts.py", file=sys.stderr)
        return 1
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
