"""PyTorch DistributedDataParallel: gloo on CPU ranks, NCCL on GPU ranks.

Communication time: on CPU ranks with ``--auto-metrics on`` (the default), DDP's reducer's own statistics, as
for a script's DDP (:meth:`jdist.rank.auto_metrics.AutoSteps.time_by_reducer`: no Python hook). Otherwise a DDP
communication hook around the default all-reduce (:func:`jdist.rank.auto_metrics.timed_comm_hook`): on CPU each
gradient bucket reports the wall-clock interval from the start of its all-reduce to the completion of its future
(with ``--auto-metrics on``: to the end of the backward pass, without a callback); on GPU a pair of CUDA timing
events brackets it (read lazily, so the hook never synchronises). A hook the user registers afterwards runs
inside it.

Gradient compression (``jdist.prepare(model, compression=...)``) is torch's own communication hooks, run
inside that timing: ``"fp16"`` and ``"bf16"`` cast each bucket for its all-reduce (half the bytes), and
``"powersgd"`` is PowerSGD (``powersgd_rank``: the approximation's rank, 1 by default; ``powersgd_start_iter``:
plain all-reduces until that step, 10 by default; error feedback and warm start on). All three run on gloo
(CPU ranks; tested) as torch's hooks do on NCCL (not run here without a GPU); on gloo PowerSGD's buckets run one
after the other (:func:`counted`). Each step's record has the bytes its all-reduces carried (``comm_bytes``):
the compressed buckets, counted by :func:`counted`; a checkpoint keeps PowerSGD's state (:func:`saved_state`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from ..auto_metrics import time_ddp
from .base import TIMING, CommTimer
from .torch_group import TorchBackend


class DDPBackend(TorchBackend):
    """``--backend ddp``: wraps the model in ``DistributedDataParallel`` with a timing comm hook."""

    name = "ddp"

    def prepare_model(self, model: Any, compression: str | None = None, **options: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel as DDP

        hook = compression_hook(compression, options)  # (bad values: one line, before anything is built)
        ctx = self.require_ctx()
        if isinstance(model, DDP):  # the code's own, as it is (compressed if asked)
            ddp = model
        else:
            device_ids = [ctx.device.index] if ctx.device_kind == "cuda" else None
            ddp = DDP(model.to(ctx.device), device_ids=device_ids, **options)
            timed = getattr(ddp, "_jdist_comm", None) is not None or "_jdist_reduced" in ddp.__dict__
            if not timed:  # (--auto-metrics on times every DDP as it is built: CPU ranks by its reducer)
                assert self.timer is not None
                time_ddp(ddp, self.timer, ctx.device_kind)
        if hook is not None:
            assert self.timer is not None
            # inside jdist's timing hook where it has one, else timed by the reducer
            serial = compression == "powersgd" and ctx.device_kind != "cuda"  # (gloo: see counted)
            ddp.register_comm_hook(hook[0], counted(hook, self.timer, list(ddp.module.parameters()), serial))
        return ddp

    def save_state(self, path: Any, model: Any, optimizer: Any, meta: dict[str, Any]) -> None:
        """As every torch backend, and the PowerSGD states of ``model`` (``compression="powersgd"``): each rank's,
        since its error feedback is its own."""
        states = powersgd_states(model)
        if states:  # (every rank has the same model: the gather is collective on all or none)
            meta = {**meta, "powersgd": self.require_ctx().comm.gather([saved_state(*st) for st in states], root=0)}
        super().save_state(path, model, optimizer, meta)

    def load_state(self, path: Any, model: Any, optimizer: Any) -> dict[str, Any]:
        meta = super().load_state(path, model, optimizer)
        states = powersgd_states(model)
        if states or meta.get("powersgd"):
            restore_powersgd(states, meta.get("powersgd"), self.require_ctx(), path)
        return meta

    def set_gradient_sync(self, model: Any, sync: bool) -> None:
        # What DDP.no_sync() does; DDP reads the flag in forward, so it must be set before it.
        model.require_backward_grad_sync = sync

    def unwrap(self, model: Any) -> Any:
        return getattr(model, "module", model)

    def reattach(self, model: Any, group: Any) -> bool | None:
        if hasattr(model, "_update_process_group"):  # a DistributedDataParallel
            model._update_process_group(group)
            return True
        return None


#: ``jdist.prepare(model, compression=...)`` under ``--backend ddp``.
COMPRESSIONS = ("fp16", "bf16", "powersgd")
POWERSGD_OPTIONS = ("powersgd_rank", "powersgd_start_iter")


def compression_hook(compression: str | None, options: dict[str, Any]) -> tuple[Any, Any] | None:
    """The ``(state, hook)`` for DDP's ``register_comm_hook`` that ``compression`` names (None: none), taking the
    PowerSGD options out of ``options``.

    >>> compression_hook(None, {})
    >>> compression_hook("fp16", {})[1].__name__
    'fp16_compress_hook'
    >>> state, hook = compression_hook("powersgd", {"powersgd_rank": 2})
    >>> hook.__name__, state.matrix_approximation_rank, state.start_powerSGD_iter
    ('powerSGD_hook', 2, 10)
    >>> compression_hook("int8", {})
    Traceback (most recent call last):
    ValueError: compression='int8': --backend ddp compresses gradients with 'fp16', 'bf16' or 'powersgd' (or leave it out).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    given = {k: options.pop(k) for k in POWERSGD_OPTIONS if k in options}
    if compression in (None, "none"):
        if given:
            raise ValueError(f"{', '.join(given)}: PowerSGD's options; add compression='powersgd'.")
        return None
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression={compression!r}: --backend ddp compresses gradients with 'fp16', 'bf16' or "
                         "'powersgd' (or leave it out).")
    if compression != "powersgd":
        if given:
            raise ValueError(f"{', '.join(given)}: PowerSGD's options, not {compression}'s; use compression='powersgd'.")
        return None, default_hooks.fp16_compress_hook if compression == "fp16" else default_hooks.bf16_compress_hook
    rank, start = int(given.get("powersgd_rank", 1)), int(given.get("powersgd_start_iter", 10))
    if rank < 1 or start < 2:
        raise ValueError(f"powersgd_rank={rank}, powersgd_start_iter={start}: the rank is >= 1 and the first "
                         "compressed step >= 2 (PowerSGD's error feedback needs plain all-reduces first).")
    # process_group None: the default group at each call (the one jdist re-creates after a release)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=start,
                                   use_error_feedback=True, warm_start=True, random_seed=0)
    return state, powersgd.powerSGD_hook


def _done(fut: Any) -> Any:
    TIMING[0] -= 1
    return fut.value()


def counted(hook: tuple[Any, Any], timer: CommTimer, params: list[Any], serial: bool = False) -> Any:
    """``hook``'s function, reporting to ``timer`` the bytes each bucket's all-reduces carry: the bucket in
    half precision (fp16, bf16); PowerSGD's P and Q matrices and the tensors it leaves uncompressed (the growth
    of its ``total_numel_after_compression``), or the whole bucket in its plain steps before
    ``start_powerSGD_iter``. The collectives it calls, also from its future's callbacks, are its own (not timed or
    counted again: :data:`~jdist.rank.backends.base.TIMING` is raised until its future is done).

    Under PowerSGD it also notes each bucket's order of ``params`` (the model's parameters; DDP re-orders its
    buckets after a new model's first step), so that a checkpoint keeps the state per parameter and a restored
    model gets it in its own order (:func:`saved_state`, :func:`restore_powersgd`): ``.layouts`` and ``.pending``.

    ``serial`` (gloo): a bucket's hook starts once the previous bucket's future is done. PowerSGD all-reduces a
    bucket's P and Q from its future's callbacks, which gloo runs on its own threads, so with several buckets the
    ranks issue those all-reduces and the next bucket's in different orders, and gloo aborts the rank ("Received
    data size doesn't match expected size"; plain torch does the same). The buckets' communication then no longer
    overlaps each other's.
    """
    state, inner = hook
    powersgd = hasattr(state, "total_numel_after_compression")
    position = {id(p): i for i, p in enumerate(params)}
    shapes = [p.shape for p in params]
    layouts: dict[int, tuple[int, ...]] = {}  # bucket index -> the positions of its parameters, in its order
    pending: dict[int, dict[str, Any]] = {}  # position -> a checkpoint's state of that parameter, not yet placed
    last: list[Any] = [None]  # (serial) the previous bucket's future

    def compressed_hook(state, bucket):  # no annotations: DDP checks them at run time
        buffer = bucket.buffer()
        before = 0
        if powersgd:
            before = state.total_numel_after_compression
            index = bucket.index()
            layout = tuple(position[id(p)] for p in bucket.parameters())
            if layouts.get(index, layout) != layout:  # DDP rebuilt its buckets: the flat buffers to the new order
                pending.update(split(state, index, layouts[index], shapes))
                for flat in (state.error_dict, state.p_memory_dict, state.q_memory_dict):
                    flat.pop(index, None)
            layouts[index] = layout
            if pending:
                place(state, index, layout, shapes, pending, buffer.device)
        if last[0] is not None:
            previous, last[0] = last[0], None
            with contextlib.suppress(Exception):  # (a bucket that failed: this one reports it)
                previous.wait()
        TIMING[0] += 1  # until its future is done: PowerSGD all-reduces P and Q in the future's callbacks
        try:
            fut = inner(state, bucket)
        except BaseException:
            TIMING[0] -= 1
            raise
        if powersgd:
            numel = state.total_numel_after_compression - before
            timer.sent((numel or buffer.numel()) * buffer.element_size())
        else:
            timer.sent(buffer.numel() * 2)
        done = fut.then(_done)
        if serial and not bucket.is_last():
            last[0] = done
        return done

    # (not torch's name: DDP refuses a hook named bf16_compress_hook without NCCL, but gloo reduces bfloat16 too)
    compressed_hook.__name__ = f"jdist_{inner.__name__}"
    compressed_hook.layouts, compressed_hook.pending = layouts, pending  # type: ignore[attr-defined]
    compressed_hook.shapes = shapes  # type: ignore[attr-defined]
    return compressed_hook


def powersgd_states(model: Any) -> list[tuple[Any, Any]]:
    """``(hook, state)`` of each of jdist's PowerSGD hooks on a ``DistributedDataParallel`` (DDP's own, or run
    inside jdist's timing hook)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    hooks = list(getattr(model, "_comm_hooks", None) or ())
    timing = getattr(model, "_jdist_comm", None)
    if timing is not None and timing.inner is not None:
        hooks.append((timing.inner[1], timing.inner[0]))
    return [(hook, state) for hook, state in hooks if isinstance(state, PowerSGDState) and hasattr(hook, "layouts")]


def _pieces(state: Any, shapes: list[Any]) -> list[tuple[int, int, int]]:
    """Per parameter of a bucket (its shapes in the bucket's order): (numel, P's numel, Q's numel) in
    PowerSGD's flat buffers (0, 0 where it does not compress the parameter: powerSGD_hook's own test)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    pieces = []
    for shape in shapes:
        numel = math.prod(shape)
        n = shape[0] if len(shape) else 1
        m = numel // n if n else 0
        r = min(n, m, state.matrix_approximation_rank)
        compress = _should_compress(n, m, r, state.min_compression_rate)[0]
        pieces.append((numel, n * r if compress else 0, m * r if compress else 0))
    return pieces


def saved_state(hook: Any, state: Any) -> dict[str, Any]:
    """What a checkpoint keeps of a ``PowerSGDState``: its fields but its process group and flat buffers, and
    per parameter (its position in the model) its error feedback and its P and Q (on the host)."""
    saved = {name: getattr(state, name) for name in state.__slots__
             if name not in ("process_group", "error_dict", "p_memory_dict", "q_memory_dict")}
    per_param: dict[int, dict[str, Any]] = dict(hook.pending)  # (placed at a bucket's next call: still to come)
    for index, layout in hook.layouts.items():
        per_param.update(split(state, index, layout, hook.shapes, host=True))
    saved["per_param"] = per_param
    return saved


def split(state: Any, index: int, layout: tuple[int, ...], shapes: list[Any], host: bool = False) -> dict[int, Any]:
    """Bucket ``index``'s part of PowerSGD's flat buffers, per parameter (``layout``: the positions of its
    parameters in the order the buffers hold them; ``shapes``: every parameter's): position -> ``{"error":
    ..., "p": ..., "q": ...}`` (copies on the host with ``host``)."""
    flat = {"error": state.error_dict.get(index), "p": state.p_memory_dict.get(index),
            "q": state.q_memory_dict.get(index)}
    offsets = {"error": 0, "p": 0, "q": 0}
    per_param = {}
    for pos, sizes in zip(layout, _pieces(state, [shapes[i] for i in layout])):
        piece = {}
        for key, size in zip(("error", "p", "q"), sizes):
            if flat[key] is not None and size:
                part = flat[key][offsets[key]:offsets[key] + size]
                piece[key] = part.detach().cpu().clone() if host else part.clone()
            offsets[key] += size
        per_param[pos] = piece
    return per_param


def place(state: Any, index: int, layout: tuple[int, ...], shapes: list[Any], pending: dict[int, dict[str, Any]],
          device: Any) -> None:
    """Put a checkpoint's per-parameter state of bucket ``index``'s parameters into PowerSGD's flat buffers, in
    the bucket's order now (the flat buffers need every parameter's piece: one missing, that buffer is left to
    PowerSGD, which starts it anew)."""
    import torch

    pieces = _pieces(state, [shapes[i] for i in layout])
    mine = [pending.pop(pos, None) for pos in layout]
    for key, target, size_at in (("error", state.error_dict, 0), ("p", state.p_memory_dict, 1),
                                 ("q", state.q_memory_dict, 2)):
        parts = [piece.get(key) if piece else None for piece in mine]
        sized = [(part, sizes[size_at]) for part, sizes in zip(parts, pieces) if sizes[size_at]]
        if sized and all(part is not None and part.numel() == size for part, size in sized):
            target[index] = torch.cat([part.reshape(-1) for part, _ in sized]).to(device)


def restore_powersgd(states: list[tuple[Any, Any]], saved: list[list[dict[str, Any]]] | None, ctx: Any,
                     path: Any) -> None:
    """Load a checkpoint's PowerSGD states (one list per saving rank) into ``states``: the step count and the
    other fields at once, each parameter's P/Q and this rank's error feedback at its bucket's next all-reduce,
    in that bucket's order. Another world size than the one that saved: P/Q and the step, and a line that the
    error feedback (each rank's own) starts from zero."""
    say = print if ctx.rank == 0 else (lambda *_: None)
    if not states:
        say(f"jdist: {path} holds PowerSGD state, but this model is not compressed with PowerSGD: not used.")
        return
    if not saved or len(saved[0]) != len(states):
        kept = len(saved[0]) if saved else 0
        say(f"jdist: {path} holds {kept} PowerSGD state(s), the model has {len(states)}: PowerSGD starts over "
            "(plain all-reduces until its powersgd_start_iter, no error feedback carried).")
        return
    same_world = len(saved) == ctx.world_size
    if not same_world:
        say(f"jdist: {path} was saved by {len(saved)} ranks, this cluster has {ctx.world_size}: PowerSGD goes on "
            "from the saved step and P/Q, its error feedback (each rank's own) from zero.")
    for (hook, state), fields in zip(states, saved[ctx.rank] if same_world else saved[0]):
        for name, value in fields.items():
            if name != "per_param":
                setattr(state, name, value)
        state.error_dict, state.p_memory_dict, state.q_memory_dict = {}, {}, {}
        hook.layouts.clear()
        hook.pending.clear()
        hook.pending.update({pos: {k: v for k, v in piece.items() if same_world or k != "error"}
                             for pos, piece in fields["per_param"].items()})
