"""``jdist.keras.Callback``: what Keras's ``model.fit`` computes, per rank, on jdist's dashboard.

One record per training batch on every rank, at the global step (counted over every ``fit`` this
callback saw): the batch's logs as Keras gives them to callbacks (``loss`` and the compiled metrics,
Keras's running means over the epoch so far), plus jdist's step time and memory. The epoch's
validation values (``val_*``) at its last step. ``jdist.progress`` gets epochs x steps per epoch at
the start, when Keras knows them.

Example (in a ``%%distributed --framework tf`` cell)::

    model.fit(ds, epochs=3, callbacks=[jdist.keras.Callback()])
"""

from __future__ import annotations

from typing import Any

from jdist.errors import need

from . import scalars

_tf = need("tensorflow", "jdist.keras.Callback", "tf")


def _floats(logs: dict[str, Any] | None) -> dict[str, Any]:
    """Keras's logs with its tensors read as numbers (``scalars`` keeps the finite ones)."""
    out = {}
    for key, value in (logs or {}).items():
        if hasattr(value, "numpy") and not hasattr(value, "item"):
            value = value.numpy()
        out[key] = value
    return out


class Callback(_tf.keras.callbacks.Callback):
    """Streams Keras's per-batch logs, per rank, to jdist (``model.fit(..., callbacks=[...])``)."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0  # the next batch's global step

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        import jdist

        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        jdist.progress(total_steps=self.step + epochs * steps if epochs and steps else None)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        import jdist

        jdist.log(step=self.step, **scalars(_floats(logs)))
        self.step += 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        val = {k: v for k, v in _floats(logs).items() if k.startswith("val_")}
        if val:
            import jdist

            jdist.log(step=self.step - 1, **scalars(val))
