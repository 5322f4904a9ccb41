"""``jdist.ray``: Ray Train runs on jdist's live dashboard (``pip install 'jdist[ray]'``).

In the notebook kernel, no ``%%distributed`` cluster needed::

    import jdist.ray
    result = jdist.ray.fit(TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2)))

``jdist.log`` inside ``train_func`` and ``ray.train.report`` both reach the dashboard, per worker
(docs/frameworks.md#ray-train). :func:`fit` is :func:`jdist.kernel.raytrain.fit`, loaded on first
use like the names of :mod:`jdist`.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"fit": "jdist.kernel.raytrain"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jdist.ray' has no attribute {name!r}")


__all__ = list(_LAZY)
