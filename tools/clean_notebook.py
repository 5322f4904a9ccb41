#!/usr/bin/env python
"""Strip a notebook for the repository: no outputs, except the reference outputs nbval checks.

Usage::

    .venv/bin/python tools/run_notebook.py notebooks/01-quickstart.ipynb --out build/
    .venv/bin/python tools/clean_notebook.py notebooks/01-quickstart.ipynb --from build/01-quickstart.ipynb

Every cell loses its outputs, execution count and execution metadata, except cells
marked ``# NBVAL_CHECK_OUTPUT``: ``pytest --nbval-lax`` compares those with the stored
outputs (and only for cells with an execution count), so they keep, or with ``--from``
take from the executed copy, their outputs and execution count.
Keep such cells small and deterministic. Without ``--from`` the checked cells keep what
they have. Writes in place (or to ``--out``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MARK = "NBVAL_CHECK_OUTPUT"


def is_checked(cell) -> bool:  # noqa: ANN001
    return cell.cell_type == "code" and any(ln.strip().startswith("#") and MARK in ln for ln in cell.source.splitlines())


def main(argv: list[str] | None = None) -> int:
    import nbformat

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--from", dest="executed", type=Path, default=None,
                    help="an executed copy (same cells) to take the checked cells' outputs from")
    ap.add_argument("--out", type=Path, default=None, help="write here instead of in place")
    args = ap.parse_args(argv)

    nb = nbformat.read(args.notebook, as_version=4)
    executed = nbformat.read(args.executed, as_version=4) if args.executed else None
    if executed is not None and [c.source for c in executed.cells] != [c.source for c in nb.cells]:
        print(f"error: {args.executed} does not have the same cells as {args.notebook}", file=sys.stderr)
        return 1
    kept = 0
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        if is_checked(cell):
            if executed is not None:
                cell.outputs = executed.cells[i].outputs
                cell.execution_count = executed.cells[i].execution_count
            # nbval skips (and rejects outputs of) cells without an execution count
            if cell.execution_count is None and cell.outputs:
                cell.execution_count = sum(1 for c in nb.cells[: i + 1] if c.cell_type == "code")
            for out in cell.outputs:
                if "execution_count" in out:
                    out["execution_count"] = cell.execution_count
                out.get("metadata", {}).clear()
            kept += 1
        else:
            cell.execution_count = None
            cell.outputs = []
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    nbformat.validate(nb)
    nbformat.write(nb, args.out or args.notebook)
    print(f"{args.out or args.notebook}: outputs cleared; {kept} checked cell(s) keep their reference output")
    return 0


if __name__ == "__main__":
    sys.exit(main())
