"""``jdist.keras.Callback``: what Keras's ``model.fit`` computes, per rank, on jdist's dashboard.

One record per training batch on every rank, at the global step (counted over every ``fit`` this
callback saw): the batch's logs (``loss`` and the compiled metrics, Keras's running means over the
epoch so far), plus jdist's step time and memory. The epoch's validation values (``val_*``) at its
last step. ``jdist.progress`` gets epochs x steps per epoch at the start, when Keras knows them.

Under ``MultiWorkerMirroredStrategy`` tf-keras hands callbacks the *sum* of the replicas' batch
values (its ``reduce_per_replica``: ``distribute_reduction_method`` "auto" is "sum" off TPUs), so
the loss and accuracy of each batch would read 2x on 2 ranks (measured: batch logs 2.92 and 0.547
where the epoch's were 1.46 and 0.273); the callback divides them by the replicas in sync, which
makes its last record of an epoch equal Keras's epoch values (tested).

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


def summed_replicas(model: Any) -> int:
    """How many replicas' values tf-keras sums into each batch's logs of ``model.fit`` (1: none summed):
    under a multi-worker strategy with ``distribute_reduction_method`` "auto" or "sum"."""
    strategy = getattr(model, "distribute_strategy", None)
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    multi_worker = getattr(getattr(strategy, "extended", None), "_num_workers", 1) > 1
    method = getattr(model, "distribute_reduction_method", "auto")
    return replicas if multi_worker and method in ("auto", "sum") else 1


class Callback(_tf.keras.callbacks.Callback):
    """Streams Keras's per-batch logs, per rank, to jdist (``model.fit(..., callbacks=[...])``)."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0  # the next batch's global step
        self.scale = 1.0  # what the batch logs are multiplied by (1 / replicas where tf-keras summed them)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        import jdist

        self.scale = 1.0 / summed_replicas(self.model)
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        jdist.progress(total_steps=self.step + epochs * steps if epochs and steps else None)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        import jdist

        values = scalars(_floats(logs))
        if self.scale != 1.0:
            values = {k: v * self.scale for k, v in values.items()}
        jdist.log(step=self.step, **values)
        self.step += 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        val = {k: v for k, v in _floats(logs).items() if k.startswith("val_")}
        if val:
            import jdist

            jdist.log(step=self.step - 1, **scalars(val))
