"""Training helpers on the ranks, the same for every backend: ``prepare``, mixed precision,
gradient accumulation, clipping and learning-rate rules.

``jdist.prepare(model, opt, sched, loader, grad_accum=K)`` returns the objects in the
order given. Models are wrapped by the backend (DDP, FSDP2 shards, Horovod broadcast);
their ``forward`` runs under ``torch.autocast`` when the cluster's precision is bf16/fp16
(``%%distributed --precision``) and skips gradient sync on accumulation micro-steps.
Optimizers come back as :class:`PreparedOptimizer`: ``step()``/``zero_grad()`` do nothing on
micro-steps and use the GradScaler under fp16. Schedulers step only when the optimizer
did. The loop stays plain PyTorch::

    model, opt = jdist.prepare(model, opt, grad_accum=4)
    for xb, yb in loader:
        loss = loss_fn(model(xb), yb)
        jdist.backward(loss)                 # divides by grad_accum, scales under fp16
        jdist.clip_grad_norm_(model, 1.0)    # backend-correct; no-op on micro-steps
        opt.step(); opt.zero_grad()          # no-ops on micro-steps

This module imports torch: it is loaded on the ranks only (``jdist.backward`` etc. are
resolved lazily by ``jdist/__init__``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import torch

from jdist.options import PRECISIONS

from .backends import Backend
from .backends.base import Preparation
from .session import RankSession, TrainState, session

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _train() -> TrainState:
    return session().train


def set_precision(train: TrainState, precision: str) -> None:
    """Autocast dtype for prepared models from now on: ``"fp32"``, ``"bf16"`` or ``"fp16"``.

    >>> tr = TrainState(); set_precision(tr, "bf16"); tr.precision
    'bf16'
    """
    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision!r}: use one of {', '.join(PRECISIONS)}.")
    train.precision = precision
    if precision != "fp16":
        train.scaler = None


def apply_precision(s: RankSession, precision: str) -> None:
    """``--precision`` on this rank (at start or live): prepared models use it from their next
    forward; a backend that owns precision is told."""
    set_precision(s.train, precision)
    if s.backend is not None:
        s.backend.set_precision(precision)


def is_sync_step() -> bool:
    """Whether the current micro-step synchronises gradients and steps the optimizer
    (always True without gradient accumulation)."""
    return _train().sync


def scaler(s: RankSession) -> Any:
    """The session's fp16 GradScaler (made by the backend on first use)."""
    if s.train.scaler is None:
        assert s.backend is not None
        s.train.scaler = s.backend.grad_scaler()
    return s.train.scaler


def map_tensors(obj: Any, fn: Any) -> Any:
    """``fn`` applied to every tensor in ``obj`` (tensors, lists, tuples, named tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        converted = [map_tensors(o, fn) for o in obj]
        return type(obj)(*converted) if hasattr(obj, "_fields") else type(obj)(converted)
    if isinstance(obj, dict):
        return type(obj)((k, map_tensors(v, fn)) for k, v in obj.items())
    return obj


def to_fp32(out: Any) -> Any:
    """bf16/fp16 tensors in a model's output as fp32 (what autocast users expect back)."""
    return map_tensors(out, lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t)


def _wrap_forward(model: Any, s: RankSession) -> None:
    """Autocast + accumulation bookkeeping around ``model.forward`` (instance attribute)."""
    if getattr(model, "_jdist_forward", None) is not None:
        return
    inner = model.forward
    backend = s.backend
    assert backend is not None
    tr = s.train
    device_type = s.ctx.device.type
    checked = [not backend.averages_in_optimizer]
    autocast = not backend.owns_precision

    def forward(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and model.training:
            if not checked[0]:
                checked[0] = True
                _warn_if_unaveraged(model, backend, tr)
            k = tr.grad_accum
            tr.sync = k <= 1 or tr.micro % k == k - 1
            if k > 1 and not backend.owns_accumulation:
                backend.set_gradient_sync(model, tr.sync)
            tr.micro += 1
            tr.forwards += 1
        dtype = _DTYPES[tr.precision]
        if dtype is None or not autocast:
            return inner(*args, **kwargs)
        with torch.autocast(device_type, dtype=dtype):
            out = inner(*args, **kwargs)
        return to_fp32(out)

    model.forward = forward
    model._jdist_forward = inner


def _warn_if_unaveraged(model: Any, backend: Backend, tr: TrainState) -> None:
    params = {id(p) for p in model.parameters()}
    if any(id(p) in params for opt in tr.optimizers for g in opt.param_groups for p in g["params"]):
        return
    import warnings

    warnings.warn(
        f"--backend {backend.name} averages gradients in the optimizer, and no prepared optimizer holds this "
        "model's parameters: each rank would train on its own gradients. Prepare them together: "
        "model, opt = jdist.prepare(model, opt).",
        RuntimeWarning,
        stacklevel=3,
    )


def backward(loss: torch.Tensor, **kwargs: Any) -> None:
    """``loss.backward()`` for jdist training: divides by ``grad_accum`` and applies the fp16
    GradScaler. Needed instead of ``loss.backward()`` under fp16 or gradient accumulation.

    >>> jdist.backward(loss_fn(model(xb), yb))   # doctest: +SKIP
    """
    s = session()
    tr, backend = s.train, _require_backend(s)
    if tr.grad_accum > 1 and not backend.owns_accumulation:
        loss = loss / tr.grad_accum
    if _jdist_scales(tr, backend):
        loss = scaler(s).scale(loss)
    backend.backward(loss, **kwargs)
    tr.backwards += 1


def clip_grad_norm_(model: Any, max_norm: float, norm_type: float = 2.0) -> float | None:
    """Clip gradients to a global norm across all ranks, correctly for the backend
    (FSDP: over the shards; Horovod: after the all-reduce; fp16: after unscaling).

    Returns the total norm before clipping, or None on an accumulation micro-step
    (gradients are not complete yet, so nothing is clipped).

    >>> norm = jdist.clip_grad_norm_(model, 1.0)   # doctest: +SKIP
    """
    s = session()
    tr = s.train
    if not tr.sync:
        return None
    backend = _require_backend(s)
    params = {id(p) for p in model.parameters()}
    for opt in tr.optimizers:
        if not any(id(p) in params for g in opt.param_groups for p in g["params"]):
            continue  # another model's optimizer
        backend.synchronize(opt.optimizer)
        if _jdist_scales(tr, backend) and tr.scaler is not None:
            tr.scaler.unscale_(opt.optimizer)
    return backend.clip_grad_norm_(model, max_norm, norm_type)


def _jdist_scales(tr: TrainState, backend: Backend) -> bool:
    """Whether jdist's GradScaler scales the loss: fp16, unless the backend's engine owns the
    precision, or owns accumulation (it steps on every micro-step, so it scales too)."""
    return tr.precision == "fp16" and not (backend.owns_precision or backend.owns_accumulation)


@contextlib.contextmanager
def no_sync(model: Any) -> Iterator[None]:
    """Skip gradient synchronisation for the backward passes inside (manual accumulation;
    with ``grad_accum=K`` jdist does this for you). Horovod needs ``grad_accum`` instead.

    >>> with jdist.no_sync(model):                      # doctest: +SKIP
    ...     jdist.backward(loss_fn(model(xb), yb))
    """
    backend = _require_backend(session())
    backend.set_gradient_sync(model, False)
    try:
        yield
    finally:
        backend.set_gradient_sync(model, True)


def _require_backend(s: RankSession) -> Backend:
    if s.backend is None:
        raise RuntimeError("jdist's training helpers need a jdist cluster: call them inside a %%distributed cell or a "
                           "script run with jdist run (under another launcher only jdist.log works).")
    return s.backend


class PreparedOptimizer(torch.optim.Optimizer):
    """The optimizer ``jdist.prepare`` returns: steps only on synchronising micro-steps,
    through the GradScaler under fp16. Everything else is the wrapped ``optimizer``'s.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, backend: Backend):
        # no super().__init__: state and param groups are the wrapped optimizer's
        self.optimizer = optimizer
        self.backend = backend
        self.steps = 0  # optimizer steps taken (not skipped)
        self._backwards_at_step = _train().backwards

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        s = session()
        tr, backend = s.train, self.backend
        if backend.owns_accumulation:  # the engine counts micro-steps and scales losses itself
            with backend.step_context(self.optimizer):
                out = backend.optimizer_step(self.optimizer, closure)
            self.steps += tr.sync
            return out
        if not tr.sync:
            return None  # accumulation micro-step: gradients keep adding up
        scales = _jdist_scales(tr, backend)
        if (scales or tr.grad_accum > 1) and tr.backwards == self._backwards_at_step:
            raise RuntimeError(
                "With --precision fp16 or grad_accum > 1, compute gradients with jdist.backward(loss) "
                "instead of loss.backward(): it scales the loss for the GradScaler and for accumulation."
            )
        self._backwards_at_step = tr.backwards
        out = None
        if scales:
            sc = scaler(s)
            backend.synchronize(self.optimizer)  # gradients complete before unscaling
            before = sc.get_scale()
            with backend.step_context(self.optimizer):
                out = sc.step(self.optimizer, closure) if closure is not None else sc.step(self.optimizer)
            sc.update()
            if sc.get_scale() >= before:  # a lower scale means inf/nan: the step was skipped
                self.steps += 1
        else:
            with backend.step_context(self.optimizer):
                out = backend.optimizer_step(self.optimizer, closure)
            self.steps += 1
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        if _train().sync or self.backend.owns_accumulation:
            if set_to_none:  # every optimizer's default; Horovod's zero_grad takes no argument
                self.optimizer.zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=False)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"PreparedOptimizer({self.optimizer!r})"


class PreparedScheduler:
    """An LR scheduler that steps only when its optimizer really stepped (not on
    accumulation micro-steps, not on fp16 steps skipped for inf/nan)."""

    def __init__(self, scheduler: Any, optimizer: PreparedOptimizer | None):
        self.scheduler = scheduler
        self.optimizer = optimizer
        self._seen = optimizer.steps if optimizer is not None else 0

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.optimizer is not None:
            if self.optimizer.steps <= self._seen:
                return
            self._seen = self.optimizer.steps
        self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"PreparedScheduler({self.scheduler!r})"


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau))


def prepare(s: RankSession, objs: tuple[Any, ...], grad_accum: int | None = None, **options: Any) -> list[Any]:
    """Prepare ``objs`` for the session's backend (see :func:`jdist.prepare`): the models and
    optimizers together through :meth:`Backend.prepare <jdist.rank.backends.Backend.prepare>`,
    each optimizer with the model whose parameters it holds; then schedulers and loaders."""
    from .data import ResumableLoader

    backend, tr = _require_backend(s), s.train
    if grad_accum is not None:
        if int(grad_accum) < 1:
            raise ValueError(f"grad_accum={grad_accum}: give the number of micro-batches per optimizer step, >= 1.")
        tr.grad_accum = int(grad_accum)
        tr.micro = 0
        tr.sync = True
    out: list[Any] = [None] * len(objs)
    optimizer_options = {k: v for k, v in options.items() if k in backend.optimizer_options}
    model_options = {k: v for k, v in options.items() if k not in backend.optimizer_options}
    if model_options and not any(isinstance(o, torch.nn.Module) for o in objs):
        raise TypeError(f"jdist.prepare: options {', '.join(sorted(model_options))} are for the model; pass the "
                        "model in the same call.")
    model_at = [i for i, o in enumerate(objs) if isinstance(o, torch.nn.Module)]
    opt_at = [i for i, o in enumerate(objs) if isinstance(o, torch.optim.Optimizer) and not isinstance(o, PreparedOptimizer)]
    models = [objs[i] for i in model_at]
    earlier = [m for m in list(tr.models) if all(m is not x for x in models)]
    prep = Preparation(models=models, optimizers=[(objs[i], _model_of(objs[i], models, earlier, backend)) for i in opt_at],
                       model_options=model_options, optimizer_options=optimizer_options, grad_accum=tr.grad_accum)
    prepared_models, prepared_opts = backend.prepare(prep)
    for i, prepared in zip(model_at, prepared_models):
        _wrap_forward(prepared, s)
        tr.models.add(prepared)
        out[i] = prepared
    for i, inner in zip(opt_at, prepared_opts):
        out[i] = PreparedOptimizer(inner, backend)
        tr.optimizers.add(out[i])
    for i, obj in enumerate(objs):
        if isinstance(obj, (PreparedOptimizer, PreparedScheduler, ResumableLoader)):
            out[i] = obj
        elif _is_scheduler(obj):
            out[i] = PreparedScheduler(obj, _optimizer_of(obj.optimizer, out, tr))
        elif isinstance(obj, torch.utils.data.DataLoader):
            out[i] = ResumableLoader(obj)
        elif out[i] is None:
            raise TypeError(
                f"jdist.prepare does not know what to do with a {type(obj).__name__}; pass torch.nn.Module, "
                "torch.optim.Optimizer, LR scheduler or DataLoader objects."
            )
    s.prepared()
    return out


def _model_of(optimizer: torch.optim.Optimizer, models: list[Any], earlier: list[Any], backend: Backend) -> Any:
    """The model whose parameters the optimizer holds, among ``models`` (this call's) and
    ``earlier`` (prepared before), by :meth:`Backend.param_ids` (so also parameters a prepared
    model replaced); the only model of this call if none holds them."""
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for model in [*models, *earlier]:
        if ids & backend.param_ids(model):
            return model
    return models[0] if len(models) == 1 else None


def _optimizer_of(optimizer: Any, prepared: list[Any], tr: TrainState) -> PreparedOptimizer | None:
    """The prepared optimizer a scheduler drives: the same object, its wrapped optimizer, or the
    optimizer it was made from (Horovod's DistributedOptimizer is a new object sharing the
    original's param-group dicts)."""
    groups = getattr(optimizer, "param_groups", None)
    for candidate in [*prepared, *tr.optimizers]:
        if not isinstance(candidate, PreparedOptimizer):
            continue
        if optimizer in (candidate, candidate.optimizer):
            return candidate
        if groups and candidate.param_groups and groups[0] is candidate.param_groups[0]:
            return candidate
    return None


def scale_lr(lr: float, rule: str = "linear", world_size: int | None = None, base_world_size: int = 1) -> float:
    """Learning rate for ``world_size`` ranks from one tuned for ``base_world_size``:
    ``"linear"`` (Goyal et al. 2017: lr x k, for SGD with large batches) or ``"sqrt"``
    (lr x sqrt(k), common for Adam). ``world_size`` defaults to this cluster's.

    >>> scale_lr(0.1, "linear", world_size=8)
    0.8
    >>> round(scale_lr(1e-3, "sqrt", world_size=4), 6)
    0.002
    """
    if world_size is None:  # (this world's: a resize scales the rates again, jdist.rank.elastic)
        s = session()
        world_size = s.ctx.world_size
        if rule in ("linear", "sqrt"):
            s.lr_rule = (rule, base_world_size)
    k = world_size / base_world_size
    if rule == "linear":
        return lr * k
    if rule == "sqrt":
        return lr * math.sqrt(k)
    raise ValueError(f"scale_lr rule={rule!r}: use 'linear' or 'sqrt'.")


def warmup(optimizer: Any, steps: int, start_factor: float | None = None, then: Any = None) -> Any:
    """Linear learning-rate warmup over ``steps`` optimizer steps, from ``start_factor`` x lr
    (default ``1/world_size``: start at the single-rank rate when lr was scaled with
    :func:`scale_lr`) up to lr; ``then``: a scheduler to continue with afterwards.
    Returns a scheduler; already prepared when ``optimizer`` is.

    >>> sched = jdist.warmup(opt, steps=100)               # doctest: +SKIP
    >>> sched = jdist.warmup(opt, 100, then=CosineAnnealingLR(opt, 900))  # doctest: +SKIP
    """
    if steps < 1:
        raise ValueError(f"warmup steps={steps}: give at least 1 step.")
    if start_factor is None:
        start_factor = 1.0 / session().ctx.world_size
    sched: Any = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=start_factor, end_factor=1.0,
                                                   total_iters=steps)
    if then is not None:
        inner_then = then.scheduler if isinstance(then, PreparedScheduler) else then
        sched = torch.optim.lr_scheduler.SequentialLR(optimizer, [sched, inner_then], milestones=[steps])
    if isinstance(optimizer, PreparedOptimizer):
        return PreparedScheduler(sched, optimizer)
    return sched
