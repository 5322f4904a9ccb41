"""``jdist.keras``: Keras training on ``--framework tf`` ranks, on jdist's dashboard.

In a ``%%distributed -n 2 --framework tf`` cell::

    model.fit(ds, epochs=3, callbacks=[jdist.keras.Callback()])

:class:`Callback` is :class:`jdist.rank.integrations.keras.Callback`, loaded on first use like the
names of :mod:`jdist` (docs/frameworks.md#tensorflow).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"Callback": "jdist.rank.integrations.keras"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jdist.keras' has no attribute {name!r}")


__all__ = list(_LAZY)
