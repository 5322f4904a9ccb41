"""Framework integrations on the ranks: each streams a framework's logged values to jdist.

Code written for a framework runs in ``%%distributed`` cells unchanged (the ranks look like
torchrun workers: :mod:`jdist.rank.torchrun`); these add the framework's metrics to jdist's
dashboard, run log and exports:

* :class:`jdist.HFCallback`: a ``transformers.TrainerCallback`` (``Trainer(callbacks=[jdist.HFCallback()])``);
* :class:`jdist.LightningCallback`: a ``lightning.pytorch.Callback``
  (``Trainer(callbacks=[jdist.LightningCallback()])``);
* :class:`jdist.AccelerateTracker`: an Accelerate tracker (``Accelerator(log_with=jdist.AccelerateTracker())``);
* :class:`jdist.keras.Callback`: a Keras callback on ``--framework tf`` ranks (``model.fit(..., callbacks=[...])``);
* :mod:`jdist.rank.integrations.ray`: the session of a Ray Train worker (``jdist.ray.fit``).

Each module imports its framework; without it the import is one line naming the extra to install.
"""

from __future__ import annotations

import math
from typing import Any


def scalars(values: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, float]:
    """The finite numeric entries of ``values`` as floats (one-element tensors read with ``.item()``),
    names jdist reserves prefixed with ``fw_``.

    >>> scalars({"loss": 0.5, "epoch": 1, "name": "x", "step_time_s": 2.0, "bad": float("nan")})
    {'loss': 0.5, 'epoch': 1.0, 'fw_step_time_s': 2.0}
    """
    from jdist.metrics.records import reserved

    out = {}
    for key, value in values.items():
        if key in skip:
            continue
        if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[f"fw_{key}" if key in reserved() else str(key)] = float(value)
    return out
