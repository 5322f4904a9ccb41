#!/usr/bin/env python
"""Run a notebook headless in a fresh kernel and report what it computed.

Usage::

    .venv/bin/python tools/run_notebook.py notebooks/01-quickstart.ipynb --out build/

Executes every code cell in order with nbclient (kernel ``python3`` by default),
printing one progress line per code cell with its duration. The executed notebook is
written to ``--out`` (also when a cell fails, for inspection). A failing cell stops
the run with its number and error, and exit code 1.

At the end it prints a result block with the final accuracy and loss, found in the
cells' text output: preferably a line such as ``final: loss=0.1234 accuracy=0.9650``,
else the last ``loss``/``accuracy`` values printed, plus the total time.

The kernel's own stdout/stderr (launcher and engine chatter) goes to
``<out>/<notebook>.kernel.log``, not to the terminal. Unless ``JDIST_RUN_DIR`` is set,
jdist run logs go to ``<out>/runs``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
FINAL_LINE = re.compile(rf"final\b[^\n]*?\bloss\s*[=:]\s*{NUMBER}[^\n]*?\baccuracy\s*[=:]\s*{NUMBER}", re.I)
FINAL_LINE_SWAPPED = re.compile(rf"final\b[^\n]*?\baccuracy\s*[=:]\s*{NUMBER}[^\n]*?\bloss\s*[=:]\s*{NUMBER}", re.I)
ACCURACY = re.compile(rf"\b(?:test[ _])?acc(?:uracy)?\s*[=:]\s*{NUMBER}", re.I)
LOSS = re.compile(rf"\b(?:train[ _])?loss\s*[=:]?\s*{NUMBER}", re.I)


def say(msg: str = "", end: str = "\n") -> None:
    sys.stdout.write(msg + end)
    sys.stdout.flush()


def cell_label(source: str, width: int = 64) -> str:
    """A one-line name for a cell: its first meaningful line (comments and blank lines
    skipped); for a cell magic, the magic line and the first line of its body.

    >>> cell_label("%%distributed -n 2\\n# hi\\nx = 1\\ny = 2")
    '%%distributed -n 2 | x = 1 ...'
    """
    lines = [ln.strip() for ln in source.splitlines()]
    meaningful = [ln for ln in lines if ln and not ln.startswith("#")]
    if not meaningful:
        return lines[0] if lines else ""
    shown = 2 if meaningful[0].startswith("%%") and len(meaningful) > 1 else 1
    text = " | ".join(meaningful[:shown])
    if len(meaningful) > shown:
        text += " ..."
    return text if len(text) <= width else text[: width - 3] + "..."


def output_text(cell: Any) -> str:
    """All text a code cell showed: streams, text/plain of results and displays, errors."""
    parts = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            text = out.get("data", {}).get("text/plain", "")
            parts.append(text if isinstance(text, str) else "".join(text))
        elif kind == "error":
            parts.append("\n".join(out.get("traceback", [])))
    return ANSI.sub("", "\n".join(parts))


def find_results(nb: Any) -> dict[str, float | None]:
    """Final loss and accuracy from the notebook's outputs (last occurrence wins)."""
    texts = [output_text(c) for c in nb.cells if c.cell_type == "code"]
    loss = accuracy = None
    for text in texts:  # preferred: an explicit "final: loss=... accuracy=..." line
        for m in FINAL_LINE.finditer(text):
            loss, accuracy = float(m.group(1)), float(m.group(2))
        for m in FINAL_LINE_SWAPPED.finditer(text):
            accuracy, loss = float(m.group(1)), float(m.group(2))
    if loss is None or accuracy is None:  # fallback: the last values printed anywhere
        for text in texts:
            for line in text.splitlines():
                if accuracy is None or "final" not in line.lower():
                    for m in ACCURACY.finditer(line):
                        accuracy = float(m.group(1))
                for m in LOSS.finditer(line):
                    loss = float(m.group(1))
    return {"loss": loss, "accuracy": accuracy}


def describe_error(exc: BaseException) -> tuple[str, str]:
    """(one-line summary, traceback text without colour codes) of a cell error."""
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    tb = getattr(exc, "traceback", None)
    text = tb if isinstance(tb, str) else str(exc)
    # nbclient's text is "...following cell:\n----\n<source>\n----\n\n<traceback>": keep the traceback
    sep = "-" * 18 + "\n"
    if text.count(sep) >= 2:
        text = text.rsplit(sep, 1)[1]
    return f"{ename}: {evalue}".strip(), ANSI.sub("", text).strip("\n").rstrip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", type=Path, help="the .ipynb to run")
    ap.add_argument("--out", type=Path, default=Path("build"), help="folder for the executed notebook (default: build/)")
    ap.add_argument("--kernel", default="python3", help="kernel name (default: python3)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default: 600)")
    ap.add_argument("--tail", type=int, default=30, help="traceback lines to show for a failing cell (default: 30)")
    args = ap.parse_args(argv)

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    if not args.notebook.is_file():
        say(f"error: no notebook at {args.notebook}")
        return 2
    nb = nbformat.read(args.notebook, as_version=4)
    args.out.mkdir(parents=True, exist_ok=True)
    out_nb = args.out / args.notebook.name
    kernel_log = args.out / (args.notebook.stem + ".kernel.log")
    os.environ.setdefault("JDIST_RUN_DIR", str((args.out / "runs").resolve()))

    code_cells = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    n = len(code_cells)
    say(f"Running {args.notebook} ({n} code cells, kernel {args.kernel})")

    client = NotebookClient(
        nb,
        kernel_name=args.kernel,
        timeout=args.timeout,
        allow_errors=False,
        record_timing=True,
        coalesce_streams=True,
        resources={"metadata": {"path": str(args.notebook.resolve().parent)}},
    )
    t_start = time.perf_counter()
    failure: tuple[int, str, str] | None = None
    with open(kernel_log, "w") as log:
        t0 = time.perf_counter()
        say("kernel: starting...", end="")
        try:
            with client.setup_kernel(stdout=log, stderr=log):
                say(f" ready ({time.perf_counter() - t0:.1f} s)")
                for k, (index, cell) in enumerate(code_cells, start=1):
                    say(f"[{k}/{n}] {cell_label(cell.source)}", end="")
                    t0 = time.perf_counter()
                    try:
                        client.execute_cell(cell, index, execution_count=k)
                    except CellTimeoutError:
                        say(" TIMEOUT")
                        failure = (k, f"no result within {args.timeout} s (--timeout)", "")
                        break
                    except DeadKernelError:
                        say(" KERNEL DIED")
                        failure = (k, f"the kernel died (see {kernel_log})", "")
                        break
                    except CellExecutionError as exc:
                        say(f" FAILED ({time.perf_counter() - t0:.1f} s)")
                        failure = (k, *describe_error(exc))
                        break
                    say(f" ({time.perf_counter() - t0:.1f} s)")
        except KeyboardInterrupt:
            say("\ninterrupted")
            nbformat.write(nb, out_nb)
            return 130
        except Exception as exc:  # the kernel did not start
            say(" FAILED")
            say(f"error: could not start kernel {args.kernel!r}: {exc} (see {kernel_log})")
            return 1
    total = time.perf_counter() - t_start
    nbformat.write(nb, out_nb)

    if failure is not None:
        k, summary, tb = failure
        index = code_cells[k - 1][0]
        say("")
        say(f"error: code cell {k}/{n} (notebook cell {index + 1}) failed: {summary}")
        lines = tb.splitlines()
        if lines:
            shown = lines[-args.tail:]
            if len(lines) > len(shown):
                say(f"  ... ({len(lines) - len(shown)} more lines in {out_nb})")
            say("\n".join("  " + ln for ln in shown))
        say(f"Executed notebook (up to the failure): {out_nb}")
        return 1

    res = find_results(nb)

    def fmt(value: float | None) -> str:
        return "not found" if value is None else f"{value:.4f}"

    say("")
    say("Result")
    say(f"  final accuracy: {fmt(res['accuracy'])}")
    say(f"  final loss:     {fmt(res['loss'])}")
    say(f"  total time:     {total:.1f} s ({n} code cells)")
    say(f"  notebook:       {out_nb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
