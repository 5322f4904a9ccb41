"""jdist: interactive distributed PyTorch training in Jupyter.

In the notebook::

    %load_ext jdist
    %%distributed -n 2 --backend ddp
    model = jdist.prepare(torch.nn.Linear(8, 1))   # runs on every rank
    jdist.log(step=0, loss=0.5)

The package runs in four places, and its layout says which (docs/architecture.md):
``jdist.kernel`` (the notebook kernel: magics, cluster, cell supervisor, dashboard),
``jdist.rank`` (the ranks: session, training, checkpoints, backends), ``jdist.server`` (the
Jupyter server extension) and small pure modules any of them uses (``jdist.metrics``,
``jdist.protocol``, ``jdist.codec``, ``jdist.options``, ``jdist.plugins``, ``jdist.errors``,
``jdist.common.stacks``, ``jdist.common.paths``, ``jdist.common.waiting``...).

Public names, all flat on ``jdist``:

* on the ranks (inside ``%%distributed`` cells): :func:`prepare`, :func:`log`, :func:`progress`,
  :func:`info`, :func:`precision`, :func:`mesh`, :func:`sharding`; training helpers :func:`backward`, :func:`clip_grad_norm_`,
  :func:`no_sync`, :func:`is_sync_step`, :func:`scale_lr`, :func:`warmup`; checkpoints
  :func:`save_checkpoint`, :func:`load_checkpoint`, :func:`latest_checkpoint`,
  :func:`checkpoint_every`, :func:`restored_step`; framework integrations :class:`HFCallback`,
  :class:`LightningCallback`, :class:`AccelerateTracker` (docs/frameworks.md); under
  ``--backend deepspeed``: :func:`deepspeed_config`, :func:`hf_deepspeed_config` (docs/backends.md);
* in the notebook kernel: :func:`last_run` (the most recent run, ``.history`` as a DataFrame),
  :func:`runs`, :func:`run_memory` (how much memory runs may hold), and ``%load_ext jdist``;
* anywhere: :class:`Run`, :func:`read_run`, :data:`AUTO_METRICS`.

Names are resolved on first use: ``import jdist`` loads neither the rank runtime (torch) in the
kernel nor kernel code on the ranks.
"""

from __future__ import annotations

import importlib
from typing import Any

try:  # written from the git tags when jdist is built or installed (pyproject.toml, [tool.hatch.version])
    from ._version import __version__
except ImportError:  # a source tree that was never built nor installed
    __version__ = "0.0.0+unknown"

#: name -> module that defines it (imported on first use, then cached here).
_LAZY = {
    # ranks
    "prepare": "jdist.rank.api",
    "log": "jdist.rank.api",
    "progress": "jdist.rank.api",
    "info": "jdist.rank.api",
    "precision": "jdist.rank.api",
    "mesh": "jdist.rank.api",
    "sharding": "jdist.rank.mesh.sharding",
    "backward": "jdist.rank.training",
    "clip_grad_norm_": "jdist.rank.training",
    "no_sync": "jdist.rank.training",
    "scale_lr": "jdist.rank.training",
    "warmup": "jdist.rank.training",
    "is_sync_step": "jdist.rank.training",
    "save_checkpoint": "jdist.rank.checkpoint",
    "load_checkpoint": "jdist.rank.checkpoint",
    "latest_checkpoint": "jdist.rank.checkpoint",
    "checkpoint_every": "jdist.rank.checkpoint",
    "restored_step": "jdist.rank.checkpoint",
    "HFCallback": "jdist.rank.integrations.hf",
    "LightningCallback": "jdist.rank.integrations.lightning",
    "AccelerateTracker": "jdist.rank.integrations.accelerate",
    "deepspeed_config": "jdist.rank.backends.deepspeed",
    "hf_deepspeed_config": "jdist.rank.backends.deepspeed",
    "should_prune": "jdist.rank.tune",
    # kernel
    "load_ipython_extension": "jdist.kernel.magics",  # %load_ext jdist
    "last_run": "jdist.kernel.sinks",
    "runs": "jdist.kernel.sinks",
    "run_memory": "jdist.kernel.sinks",
    "tune": "jdist.kernel.tune",
    "last_sweep": "jdist.kernel.tune",
    # anywhere
    "Run": "jdist.metrics",
    "read_run": "jdist.metrics",
    "AUTO_METRICS": "jdist.metrics",
}
_SUBMODULES = {"kernel", "rank", "server", "metrics", "protocol", "options", "errors", "plugins", "stacks", "procs",
               "keras", "ray"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # jdist.log runs every step: resolve once
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'jdist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_SUBMODULES])


__all__ = list(_LAZY)
