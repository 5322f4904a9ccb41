"""Build DeepSpeed's C++ op that its communication backend loads when it starts (``shm_comm``), once,
into jdist's cache (``~/.cache/jdist/torch_extensions/<python environment>``, or ``TORCH_EXTENSIONS_DIR``): the first
``--backend deepspeed`` cluster on a machine then starts in seconds instead of ~35 s. Run by
``make test``; a second run finds the cached build and returns at once.

    .venv/bin/python tools/build_deepspeed_ops.py
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time

from jdist.rank.backends.deepspeed import EXTENSIONS_DIR


def main() -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # what jdist's CPU ranks use
    target = os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
    try:
        from deepspeed.comm.torch import build_shm_op
    except ImportError:
        print("DeepSpeed is not installed: nothing to build (pip install 'jdist[deepspeed]').")
        return 0
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        op = build_shm_op()
    state = "built or found" if op is not None else "not available on this machine (DeepSpeed uses gloo alone)"
    print(f"DeepSpeed shm_comm op {state} in {target} ({time.perf_counter() - t0:.1f} s).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
