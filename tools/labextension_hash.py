#!/usr/bin/env python3
"""Hash of the labextension's sources, stored next to the prebuilt output.

``tools/build_labextension.sh`` writes it (``--write``) after building; the test suite
recomputes it (no node needed) to check that ``jdist/labextension`` was built from the
sources in ``labextension/`` as they are now. ``--check`` exits 1 when it is out of date.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / "labextension"
OUTPUT = REPO / "jdist" / "labextension"
STAMP = OUTPUT / "sources.sha256"
#: What goes into the build: every file under these, plus these files.
SOURCE_DIRS = ("src", "style")
SOURCE_FILES = ("package.json", "yarn.lock", "tsconfig.json", ".yarnrc.yml", "dashboard.config.js", "build-dashboard.js")


def source_files() -> list[Path]:
    files = [SOURCES / name for name in SOURCE_FILES]
    for d in SOURCE_DIRS:
        files += [p for p in (SOURCES / d).rglob("*") if p.is_file()]
    return sorted(files)


def sources_hash() -> str:
    """sha256 over the relative path and bytes of every source file (line endings as stored)."""
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.relative_to(SOURCES).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def stored_hash() -> str | None:
    try:
        return json.loads(STAMP.read_text())["sources_sha256"]
    except (OSError, ValueError, KeyError):
        return None


def main(argv: list[str]) -> int:
    if argv[1:] == ["--write"]:
        STAMP.write_text(json.dumps({"sources_sha256": sources_hash(),
                                     "files": [p.relative_to(SOURCES).as_posix() for p in source_files()]}, indent=1) + "\n")
        print(f"wrote {STAMP.relative_to(REPO)}")
        return 0
    if argv[1:] == ["--check"]:
        if stored_hash() == sources_hash():
            print("jdist/labextension is current")
            return 0
        print("jdist/labextension is out of date: run make labextension", file=sys.stderr)
        return 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
