"""``jdist.HFCallback``: the Hugging Face ``Trainer``'s logs on jdist's dashboard.

One record per optimizer step on every rank: the values the ``Trainer`` logs (``loss``,
``grad_norm``, ``learning_rate``, ``epoch``...) at the steps it logs them, jdist's step time
and memory at every step. The total steps and the batch size (per device x accumulation)
go to ``jdist.progress`` when training begins.

Example (in a ``%%distributed`` cell):
    >>> trainer = Trainer(model=model, args=args, train_dataset=ds,
    ...                   callbacks=[jdist.HFCallback()])   # doctest: +SKIP
    >>> trainer.train()                                    # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from jdist.errors import need

from . import scalars

_transformers = need("transformers", "jdist.HFCallback", "hf")

#: Keys of the summary the Trainer logs once at the end of training (not a step's values).
SUMMARY = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss")


class HFCallback(_transformers.TrainerCallback):
    """Streams the ``Trainer``'s logged values, per rank and step, to jdist."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import jdist

        from ..auto_metrics import logs_itself

        logs_itself()  # the Trainer's steps are logged here: no automatic records beside them

        jdist.progress(total_steps=state.max_steps or None,
                       batch_size=args.per_device_train_batch_size * args.gradient_accumulation_steps)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not control.should_log:  # otherwise on_log comes next, for this same step
            import jdist

            jdist.log(step=state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "train_runtime" in logs:
            return  # the end-of-training summary: jdist has its own (jdist.last_run().summary())
        import jdist

        jdist.log(step=state.global_step, **scalars(logs))
