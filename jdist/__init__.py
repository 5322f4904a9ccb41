"""jdist: interactive distributed PyTorch training in Jupyter.

In the notebook::

    %load_ext jdist
    %%distributed -n 2 --backend ddp
    model = jdist.prepare(torch.nn.Linear(8, 1))   # runs on every rank
    jdist.log(step=0, loss=0.5)

On the ranks: :func:`prepare`, :func:`log`, :func:`progress`; training helpers
:func:`backward`, :func:`clip_grad_norm_`, :func:`no_sync`, :func:`scale_lr`, :func:`warmup`
(:mod:`jdist.training`); checkpoints :func:`save_checkpoint`, :func:`load_checkpoint`,
:func:`latest_checkpoint`, :func:`checkpoint_every` (:mod:`jdist.checkpoint`).
In the notebook kernel: :func:`last_run` (the most recent run, ``.history`` as a
DataFrame) and :func:`runs`.
"""

from __future__ import annotations

from .metrics import AUTO_METRICS, Run, read_run
from .rank import log, prepare, progress

__version__ = "0.1.0"

# Resolved on first use (PEP 562): jdist.training imports torch, which the notebook kernel
# does not need.
_LAZY = {
    "backward": "training",
    "clip_grad_norm_": "training",
    "no_sync": "training",
    "scale_lr": "training",
    "warmup": "training",
    "is_sync_step": "training",
    "save_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "latest_checkpoint": "checkpoint",
    "checkpoint_every": "checkpoint",
    "restored_step": "checkpoint",
}


def __getattr__(name: str):  # noqa: ANN202
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'jdist' has no attribute {name!r}")


def last_run() -> Run | None:
    """The most recent run of this kernel (a :class:`jdist.metrics.Run`), or None.

    >>> jdist.last_run().history.head()   # doctest: +SKIP
    """
    from .runner import last_run as _last

    return _last()


def runs() -> list[Run]:
    """All runs of this kernel, oldest first."""
    from .runner import all_runs

    return list(all_runs())


def load_ipython_extension(ipython) -> None:  # noqa: ANN001
    """``%load_ext jdist``: registers ``%%distributed`` and ``%dist`` and makes ``jdist`` importable as a name."""
    import sys

    from .magics import DistributedMagics

    ipython.register_magics(DistributedMagics)
    ipython.user_ns.setdefault("jdist", sys.modules[__name__])


__all__ = ["AUTO_METRICS", "Run", "last_run", "load_ipython_extension", "log", "prepare", "progress", "read_run", "runs",
           *_LAZY]
