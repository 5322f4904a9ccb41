"""``jdist.LightningCallback``: what a ``LightningModule`` logs (``self.log``) on jdist's dashboard.

One record per optimizer step on every rank, with the scalars in ``trainer.callback_metrics``
(the values ``self.log(..., on_step=True)`` gave this step, epoch values when they come).
The estimated total steps and the loader's batch size go to ``jdist.progress`` at the start.

Example (in a ``%%distributed`` cell):
    >>> trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2,
    ...                     callbacks=[jdist.LightningCallback()])   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from jdist.errors import need

from . import scalars

try:  # the lightning package, or the older pytorch_lightning
    import lightning.pytorch as _pl
except ImportError:
    try:
        import pytorch_lightning as _pl
    except ImportError:
        _pl = need("lightning", "jdist.LightningCallback", "lightning")


class LightningCallback(_pl.Callback):
    """Streams ``self.log`` values, per rank and optimizer step, to jdist."""

    def __init__(self) -> None:
        self._last_step = -1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        import jdist

        from ..auto_metrics import logs_itself

        logs_itself()  # the optimizer steps are logged here: no automatic records beside them

        loader = trainer.train_dataloader
        batch = getattr(loader, "batch_size", None)
        total = trainer.estimated_stepping_batches
        jdist.progress(total_steps=int(total) if total != float("inf") else None,
                       batch_size=batch * trainer.accumulate_grad_batches if batch else None)
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self._last_step:
            return  # an accumulation micro-batch: the optimizer has not stepped
        self._last_step = trainer.global_step
        import jdist

        jdist.log(step=trainer.global_step, **scalars(trainer.callback_metrics))
