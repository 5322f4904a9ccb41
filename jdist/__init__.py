"""jdist: interactive distributed PyTorch training in Jupyter.

In the notebook::

    %load_ext jdist
    %%distributed -n 2 --backend ddp
    model = jdist.prepare(torch.nn.Linear(8, 1))   # runs on every rank
    jdist.log(step=0, loss=0.5)

On the ranks: :func:`prepare`, :func:`log`, :func:`progress`. In the notebook kernel:
:func:`last_run` (the most recent run, ``.history`` as a DataFrame) and :func:`runs`.
"""

from __future__ import annotations

from .metrics import AUTO_METRICS, Run, read_run
from .rank import log, prepare, progress

__version__ = "0.1.0"


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


__all__ = ["AUTO_METRICS", "Run", "last_run", "load_ipython_extension", "log", "prepare", "progress", "read_run", "runs"]
