#!/usr/bin/env python3
"""Write labextension/src/protocol.ts: the TypeScript types of the server's REST models, generated
from jdist/protocol.py (``--check``: exit 1 if the committed file differs; tests/test_protocol.py
checks it too). Run ``make labextension`` afterwards to rebuild the prebuilt extension.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "labextension" / "src" / "protocol.ts"


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from jdist.protocol import typescript

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
