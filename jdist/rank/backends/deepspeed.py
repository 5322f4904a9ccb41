"""DeepSpeed ZeRO on jdist's process group: ``--backend deepspeed --zero 1|2|3 --offload none|optimizer|all``.

``jdist.prepare(model, opt, ...)`` builds one ``deepspeed.initialize`` engine per model with its
optimizer, on the group jdist already formed (``dist_init_required=False``: no DeepSpeed launcher,
no second rendezvous). The config is jdist's, with the user's ``ds_config`` merged over it:

* ``zero_optimization.stage`` from ``--zero``; ``--offload optimizer`` moves optimizer state to
  host memory, ``--offload all`` also the parameters (ZeRO-3 only);
* ``gradient_accumulation_steps`` from ``grad_accum`` (the engine divides the loss and steps every
  K-th micro-step: jdist calls ``engine.backward`` and ``engine.step`` on every micro-step);
* ``bf16``/``fp16`` from ``--precision`` (DeepSpeed's own mixed precision: low-precision
  parameters, fp32 master weights in the optimizer; floating-point inputs are cast to the engine's
  dtype and outputs back to fp32, as jdist's autocast does for the other backends);
* ``gradient_clipping`` 0 (DeepSpeed's default is 1.0, which would make the same cell train
  differently than under DDP); ``jdist.clip_grad_norm_(model, max_norm)`` sets it for the engine's
  next step. The engine clips inside ``opt.step()``, so the norm returned is the one it measured at
  its last step;
* ``zero_allow_untested_optimizer`` and ``zero_force_ds_cpu_optimizer: false``: any torch optimizer
  works, offload included, without DeepSpeed's JIT-compiled optimizers.

A new ``jdist.prepare`` of a model ends the engines of earlier calls first (``engine.destroy()``, one
line saying so): DeepSpeed's hooks keep an engine alive after its variable is rebound, so a re-run
cell would otherwise leak one engine per run. Models that train together are prepared in one call.

Checkpoints are DeepSpeed's own (``engine.save_checkpoint``, every rank writes its shards) with
jdist's client state (step, RNG, loader, scheduler). After a release the engine holds the old group:
it is prepared again and restored from a checkpoint (``%dist restart`` does both).

DeepSpeed's one-time C++ op build (``shm_comm``, about 30 s on a fresh machine) is cached under
``~/.cache/jdist/torch_extensions/<python environment>`` (``TORCH_EXTENSIONS_DIR`` when set).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from .base import CommTimer, Preparation, RankContext, StateBytes, timed_call
from .torch_group import TorchBackend

#: What DeepSpeed's engine would do differently from the same cell under DDP, and jdist's choice.
DEFAULTS: dict[str, Any] = {
    "gradient_clipping": 0.0,
    "zero_allow_untested_optimizer": True,
    "zero_force_ds_cpu_optimizer": False,
    "steps_per_print": 2**31 - 1,
    "wall_clock_breakdown": False,
}
#: The collectives of DeepSpeed's communication backend that are timed for the comm metric.
TIMED = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter_tensor", "all_gather_into_tensor",
         "all_gather", "broadcast", "all_to_all_single", "reduce_scatter", "all_gather_coalesced")
CHECKPOINT_TAG = "jdist"
#: One folder per Python environment: torch's extension builder rebuilds an op whose build flags (the
#: include and library paths of the environment's torch) changed, so two venvs sharing one folder rebuilt
#: DeepSpeed's op (~35 s) each time the other had used it.
EXTENSIONS_DIR = (Path.home() / ".cache" / "jdist" / "torch_extensions"
                  / f"py{sys.version_info[0]}{sys.version_info[1]}-{hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]}")


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``, dictionaries key by key.

    >>> merged({"zero_optimization": {"stage": 2, "overlap_comm": False}}, {"zero_optimization": {"stage": 3}})
    {'zero_optimization': {'stage': 3, 'overlap_comm': False}}
    """
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def build_config(zero: int, offload: str, grad_accum: int, precision: str, micro_batch: int = 1,
                 user: dict[str, Any] | None = None) -> dict[str, Any]:
    """The DeepSpeed config jdist builds for one engine, with ``user`` merged over it.

    >>> c = build_config(3, "all", 4, "bf16")
    >>> c["zero_optimization"], c["gradient_accumulation_steps"], c["bf16"], c["gradient_clipping"]
    ({'stage': 3, 'offload_optimizer': {'device': 'cpu'}, 'offload_param': {'device': 'cpu'}}, 4, {'enabled': True}, 0.0)
    """
    zero_cfg: dict[str, Any] = {"stage": int(zero)}
    if offload in ("optimizer", "all"):
        zero_cfg["offload_optimizer"] = {"device": "cpu"}
    if offload == "all":
        zero_cfg["offload_param"] = {"device": "cpu"}
    config = {**DEFAULTS, "train_micro_batch_size_per_gpu": int(micro_batch),
              "gradient_accumulation_steps": int(grad_accum), "zero_optimization": zero_cfg}
    if precision in ("bf16", "fp16"):
        config[precision] = {"enabled": True}
    return merged(config, user or {})


class DeepSpeedBackend(TorchBackend):
    """``--backend deepspeed``: ZeRO engines over jdist's torch.distributed group (see the module doc)."""

    name = "deepspeed"
    checkpoint_layout = "dir"
    owns_accumulation = True
    owns_precision = True

    def __init__(self) -> None:
        super().__init__()
        self.precision = "fp32"
        self.engines: list[Any] = []  # of the last jdist.prepare call
        self.current: Any = None  # the engine whose forward ran last (jdist.backward's)
        self.hf_config: Any = None  # transformers' HfDeepSpeedConfig, alive while it should apply

    def setup(self, ctx: RankContext, timer: CommTimer) -> None:
        # DeepSpeed picks its accelerator when first imported: CPU ranks use the CPU even where CUDA exists
        os.environ["DS_ACCELERATOR"] = "cuda" if ctx.device_kind == "cuda" else "cpu"
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
        for name, value in (("RANK", ctx.rank), ("LOCAL_RANK", ctx.local_rank), ("WORLD_SIZE", ctx.world_size)):
            os.environ.setdefault(name, str(value))
        super().setup(ctx, timer)
        deepspeed = import_deepspeed()
        quiet()
        with _silenced():
            deepspeed.init_distributed(dist_backend="nccl" if ctx.device_kind == "cuda" else "gloo",
                                       auto_mpi_discovery=False, dist_init_required=False)
        time_collectives(timer, ctx.device_kind)

    def set_precision(self, precision: str) -> None:
        self.precision = precision  # engines prepared from now on

    def auto_metric_hooks(self, steps: Any) -> list[Any]:
        """torch's hooks, and DeepSpeed's engine (any engine, the script's own ``deepspeed.initialize``
        included): ``engine.backward(loss)`` is one backward whose loss is ``loss / gradient_accumulation_steps``
        (the engine's own scaling inside it is not noted again), and ``engine.step()`` on an accumulation
        boundary ends the step (also when the engine skipped the update for an fp16 overflow). The engine's
        collectives are timed through its communication backend (:func:`time_collectives`)."""
        from deepspeed.runtime.engine import DeepSpeedEngine

        from ..auto_metrics import patch

        def make_backward(real: Any) -> Any:
            def backward(engine: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
                if steps.mute:
                    return real(engine, loss, *args, **kwargs)
                scale = kwargs.get("scale_wrt_gas", args[1] if len(args) > 1 else True)
                steps.root(loss, 1.0 / engine.gradient_accumulation_steps() if scale else 1.0)
                steps.mute += 1
                try:
                    return real(engine, loss, *args, **kwargs)
                finally:
                    steps.mute -= 1

            return backward

        def make_step(real: Any) -> Any:
            def step(engine: Any, *args: Any, **kwargs: Any) -> Any:
                managed = getattr(engine, "managed_gradient_accumulation", lambda: True)()
                boundary = engine.is_gradient_accumulation_boundary() or not managed
                out = real(engine, *args, **kwargs)
                if boundary:
                    steps.stepped()
                return out

            return step

        return [*super().auto_metric_hooks(steps), patch(DeepSpeedEngine, "backward", make_backward),
                patch(DeepSpeedEngine, "step", make_step)]

    def prepare(self, p: Preparation) -> tuple[list[Any], list[Any]]:
        import deepspeed

        ctx = self.require_ctx()
        options = dict(p.model_options)
        user = options.pop("ds_config", None) or {}
        micro_batch = options.pop("micro_batch_size", None)
        if options:
            raise TypeError(f"jdist.prepare: unknown option(s) for --backend deepspeed: {', '.join(sorted(options))}. "
                            "It takes ds_config={...} (merged over jdist's DeepSpeed config) and micro_batch_size=N.")
        if not isinstance(user, dict):
            raise TypeError("jdist.prepare(ds_config=...) takes a dict (a DeepSpeed config), merged over jdist's.")
        for opt, model in p.optimizers:
            if model is None or all(model is not m for m in p.models):
                raise TypeError("--backend deepspeed builds an engine from a model and its optimizer together: "
                                "jdist.prepare(model, opt) in one call.")
        engines = {id(m): m for m in p.models if _is_engine(m)}
        fresh = [m for m in p.models if id(m) not in engines]
        if fresh:
            self.end_engines(keep=list(engines.values()))
        for model in fresh:
            optimizers = [opt for opt, m in p.optimizers if m is model]
            if len(optimizers) > 1:
                raise TypeError("--backend deepspeed: one optimizer per model (DeepSpeed's engine steps one).")
            zero = int(ctx.options.get("zero", 2))
            if not optimizers and zero < 3:
                zero = 0  # ZeRO-1/2 shard optimizer state and gradients: without an optimizer, nothing to shard
            offload = ctx.options.get("offload", "none") if optimizers or zero == 3 else "none"
            config = build_config(zero, offload, p.grad_accum, self.precision, micro_batch or 1, user)
            with _silenced():
                engine, *_ = deepspeed.initialize(model=model.to(ctx.device),
                                                  optimizer=optimizers[0] if optimizers else None,
                                                  config=config, dist_init_required=False)
            engine.register_forward_pre_hook(self._forward_starts, with_kwargs=True)
            engine.register_forward_hook(_outputs_to_fp32)
            engines[id(model)] = engine
        self.engines = [engines[id(m)] for m in p.models]
        optimizers = [EngineOptimizer.of(engines[id(m)]) for _, m in p.optimizers]
        return self.engines, optimizers

    def _forward_starts(self, engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.current = engine
        dtype = _low_precision(engine)
        if dtype is None:
            return None
        from ..training import map_tensors

        def cast(t: Any) -> Any:
            return t.to(dtype) if t.is_floating_point() else t

        return map_tensors(args, cast), map_tensors(kwargs, cast)

    def end_engines(self, keep: Sequence[Any] = ()) -> None:
        """End the engines of earlier ``jdist.prepare`` calls (but ``keep``), with one line on rank 0."""
        import gc

        ended = [e for e in self.engines if all(e is not k for k in keep)]
        if not ended:
            return
        from ..session import session

        train = session().train
        for engine in ended:
            with contextlib.suppress(Exception):
                engine.destroy()
            train.models.discard(engine)
            for opt in list(train.optimizers):
                if getattr(getattr(opt, "optimizer", None), "engine", None) is engine:
                    train.optimizers.discard(opt)
        self.engines = [e for e in self.engines if all(e is not x for x in ended)]
        if any(self.current is x for x in ended):
            self.current = None
        count = len(ended)
        del ended
        gc.collect()
        assert self.ctx is not None
        if self.ctx.rank == 0:
            print(f"jdist: ended {count} DeepSpeed engine(s) of an earlier jdist.prepare and freed their state "
                  "(DeepSpeed keeps an engine alive until it is destroyed); models that train together go in one "
                  "jdist.prepare call.")

    def prepare_model(self, model: Any, **options: Any) -> Any:
        return self.prepare(Preparation(models=[model], optimizers=[], model_options=options))[0][0]

    def backward(self, loss: Any, **kwargs: Any) -> None:
        engine = self.current
        if engine is None:
            raise RuntimeError("jdist.backward: no DeepSpeed engine ran a forward pass yet; call the model "
                               "jdist.prepare returned before backward.")
        engine.backward(loss, **kwargs)

    def clip_grad_norm_(self, model: Any, max_norm: float, norm_type: float = 2.0) -> float:
        if norm_type != 2.0:
            raise ValueError("--backend deepspeed clips the 2-norm only (DeepSpeed's gradient_clipping).")
        engine = _engine_of(model)
        engine._config.gradient_clipping = float(max_norm)
        if hasattr(engine.optimizer, "clip_grad"):
            engine.optimizer.clip_grad = float(max_norm)
        norm = engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def unwrap(self, model: Any) -> Any:
        return getattr(model, "module", model)

    def param_ids(self, model: Any) -> set[int]:
        return {id(p) for p in self.unwrap(model).parameters()}

    def local_state_bytes(self, models: Sequence[Any], optimizers: Sequence[Any]) -> StateBytes:
        """Local bytes of parameters (ZeRO-3: this rank's partition), gradients (ZeRO-2/3: the
        partition this rank reduces) and optimizer state (fp32 master partitions and the torch
        optimizer's state over them), wherever they live (offload: host memory)."""
        params = grads = optim = 0
        count = _Held().new_bytes

        for model in models:
            for p in self.unwrap(model).parameters():
                params += count(getattr(p, "ds_tensor", None)) if hasattr(p, "ds_tensor") else count(p)
                grads += count(p.grad)
            engine = model if _is_engine(model) else None
            zero = getattr(engine, "optimizer", None) if engine is not None else None
            if zero is None:
                continue
            for t in _zero_gradients(zero):
                grads += count(t)
            for t in _zero_master(zero):
                optim += count(t)
                grads += count(t.grad)  # offload: gradients are gathered into the master partitions' .grad
            inner = getattr(zero, "optimizer", zero)
            for st in getattr(inner, "state", {}).values():
                for v in st.values():
                    optim += count(v)
        return StateBytes(params, grads, optim)

    def save_state(self, path: Path, model: Any, optimizer: Any, meta: dict[str, Any]) -> None:
        """DeepSpeed's checkpoint (every rank writes its shards) with jdist's ``meta`` as client state."""
        engine = _engine_of(model)
        meta = {**meta, "has_optimizer": optimizer is not None}
        with _silenced():
            engine.save_checkpoint(str(path), tag=CHECKPOINT_TAG, client_state={"jdist": meta},
                                   exclude_frozen_parameters=False)

    def load_state(self, path: Path, model: Any, optimizer: Any) -> dict[str, Any]:
        engine = _engine_of(model)
        ctx = self.require_ctx()
        saved = self._saved_world_size(path)
        if saved is not None and saved != ctx.world_size:
            raise ValueError(f"{path} holds ZeRO shards of {saved} ranks; this cluster has {ctx.world_size}. Resume "
                             f"on {saved} ranks (%%distributed -n {saved} --restart), or make one full state dict "
                             f"with DeepSpeed's zero_to_fp32.py in {path} and load that into a fresh model.")
        with _silenced():
            loaded, client = engine.load_checkpoint(str(path), tag=CHECKPOINT_TAG, load_optimizer_states=optimizer is not None,
                                                    load_lr_scheduler_states=False)
        meta = (client or {}).get("jdist")
        if loaded is None or meta is None:
            raise ValueError(f"{path} holds no DeepSpeed checkpoint of jdist's that this engine can load; save it "
                             "with jdist.save_checkpoint under --backend deepspeed.")
        if optimizer is not None and not meta.get("has_optimizer", True):
            raise ValueError(f"{path} holds no optimizer state; load it without optimizer=.")
        return meta

    @staticmethod
    def _saved_world_size(path: Path) -> int | None:
        shards = list((Path(path) / CHECKPOINT_TAG).glob("*optim_states.pt")) or \
            list((Path(path) / CHECKPOINT_TAG).glob("zero_pp_rank_*_model_states.pt"))
        ranks = {s.name.split("zero_pp_rank_")[1].split("_")[0] for s in shards if "zero_pp_rank_" in s.name}
        return len(ranks) or None

    def reattach(self, model: Any, group: Any) -> bool | None:
        return False if _is_engine(model) else None

    def describe_rebuild(self, reattached: Sequence[str], stale: Sequence[str]) -> tuple[str | None, str | None]:
        lost = (f"DeepSpeed engine(s) {', '.join(stale)} hold the old group; prepare them again and load "
                "jdist.latest_checkpoint, or %dist restart" if stale else None)
        return None, lost

    def teardown(self) -> None:
        self.end_engines()
        super().teardown()


def forget_groups() -> None:
    """Make DeepSpeed form its process groups again (its clone of the world group, the data-parallel and
    expert groups it caches) once jdist destroyed the default group, with every group made after it (a
    release broke them all; the spec's ``forget_groups``). Without it the next engine took the broken clone.
    (DeepSpeed's own reset, made for its ``destroy_process_group``; a DeepSpeed without it fails here, and
    :func:`~jdist.rank.backends.torch_group.forget_library_groups` says so in one line.)"""
    from deepspeed.utils import groups

    groups._release_process_group_references(group=None)


def deepspeed_config(grad_accum: int = 1, micro_batch_size: int = 1, ds_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The DeepSpeed config ``jdist.prepare`` would build now on this rank (``--zero``, ``--offload``,
    ``--precision``, these arguments, ``ds_config`` merged over it): for code that calls DeepSpeed
    itself. Needs ``--backend deepspeed``.

    >>> engine, *_ = deepspeed.initialize(model=m, optimizer=o, config=jdist.deepspeed_config())  # doctest: +SKIP
    """
    backend = _backend()
    opts = backend.require_ctx().options
    return build_config(int(opts.get("zero", 2)), opts.get("offload", "none"), grad_accum, backend.precision,
                     micro_batch_size, ds_config)


def hf_deepspeed_config(grad_accum: int = 1, micro_batch_size: int = 1, ds_config: dict[str, Any] | None = None) -> Any:
    """Tell Hugging Face transformers about ZeRO-3 before a model is built, so ``from_pretrained`` /
    ``from_config`` / a model class create its parameters as shards (nothing whole in memory). Returns
    transformers' ``HfDeepSpeedConfig`` (kept alive on the rank as long as the cluster runs).

    >>> jdist.hf_deepspeed_config(); model = AutoModelForCausalLM.from_pretrained(name)  # doctest: +SKIP
    """
    from transformers.integrations import HfDeepSpeedConfig

    backend = _backend()
    backend.hf_config = HfDeepSpeedConfig(deepspeed_config(grad_accum, micro_batch_size, ds_config))
    return backend.hf_config


def _backend() -> DeepSpeedBackend:
    from ..session import session

    backend = session().backend
    if not isinstance(backend, DeepSpeedBackend):
        raise RuntimeError("This needs --backend deepspeed: %%distributed --backend deepspeed --restart.")
    return backend


class EngineOptimizer:
    """What ``jdist.prepare`` wraps for the optimizer of a DeepSpeed engine: ``step()`` is
    ``engine.step()`` (on every micro-step; the engine counts them), ``zero_grad()`` is left to the
    engine (it zeroes after each optimizer step), the rest is the engine's optimizer's."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @classmethod
    def of(cls, engine: Any) -> Any:
        """The view of ``engine``'s optimizer, a ``torch.optim.Optimizer`` (torch is imported on use)."""
        return _optimizer_class()(engine)

    @property
    def inner(self) -> Any:
        return self.engine.optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.inner.param_groups = value

    @property
    def state(self) -> Any:
        return getattr(self.inner, "state", {})

    @state.setter
    def state(self, value: Any) -> None:
        self.inner.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return getattr(self.inner, "defaults", {})

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.inner.defaults = value

    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise TypeError("--backend deepspeed: opt.step() takes no closure (DeepSpeed's engine.step()).")
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # the engine zeroes gradients after each optimizer step; on micro-steps they add up

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"EngineOptimizer({type(self.inner).__name__})"


def import_deepspeed() -> Any:
    """``import deepspeed`` without the ``import mlflow`` that DeepSpeed's autotuner makes when MLflow is
    installed: 2.5 s of the 3.3 s DeepSpeed's import took on the 2-core machine (0.5-0.9 s without it),
    paid by every rank at every start. DeepSpeed uses MLflow only to log the experiments of its autotuner,
    which its own launcher runs (``deepspeed --autotuning``), never a jdist rank; ``import mlflow`` in a
    cell works as before.

    Example (in a fresh process; tests/test_deepspeed.py checks it on the ranks):
        >>> ds = import_deepspeed()  # doctest: +SKIP
        >>> ds.autotuning.autotuner.has_mlflow, "mlflow" in sys.modules  # doctest: +SKIP
        (False, False)
    """
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hidden = "mlflow" not in sys.modules
    if hidden:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # (import mlflow raises ImportError)
    try:
        import deepspeed
    finally:
        if hidden and sys.modules.get("mlflow", "") is None:
            del sys.modules["mlflow"]
    return deepspeed


def quiet() -> None:
    """DeepSpeed's info logging and torch's deprecation warnings for the collectives DeepSpeed calls
    (250 lines in 60 ZeRO-3 steps) stay out of cell output; DeepSpeed's warnings still show."""
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r".*torch\.distributed\.\w+`? is deprecated")
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*_get_pg_default_device.*")
    with contextlib.suppress(ImportError):
        from deepspeed.utils import logger

        logger.setLevel(logging.WARNING)
        logger.addFilter(_chosen_by_jdist)


def _chosen_by_jdist(record: logging.LogRecord) -> bool:
    """DeepSpeed's warnings about what jdist's config sets on purpose are left out."""
    return "untested optimizer" not in record.getMessage()


@contextlib.contextmanager
def _silenced() -> Any:
    """DeepSpeed's prints at set-up ("... built successfully", config dumps) go nowhere; its
    errors still raise."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def time_collectives(timer: CommTimer, device_kind: str) -> None:
    """Time each collective DeepSpeed's communication backend runs (its ``cdb``, an object of its own
    that calls torch.distributed): the comm metric, as DDP's hook and FSDP's collectives report it."""
    from deepspeed import comm

    cdb = comm.comm.cdb
    if cdb is None or getattr(cdb, "_jdist_timed", False):
        return
    for name in TIMED:
        call = getattr(cdb, name, None)
        if call is not None:
            setattr(cdb, name, _timed(call, timer, device_kind))
    cdb._jdist_timed = True


def _timed(call: Callable[..., Any], timer: CommTimer, device_kind: str) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        return timed_call(timer, device_kind, lambda: call(*args, **kwargs), bool(kwargs.get("async_op")))

    return timed


@functools.cache
def _optimizer_class() -> type:
    import torch

    return type("EngineOptimizer", (EngineOptimizer, torch.optim.Optimizer), {})


def _is_engine(model: Any) -> bool:
    from deepspeed.runtime.engine import DeepSpeedEngine

    return isinstance(model, DeepSpeedEngine)


def _engine_of(model: Any) -> Any:
    if not _is_engine(model):
        raise TypeError(f"--backend deepspeed: pass the model jdist.prepare returned (a DeepSpeed engine), not a "
                        f"{type(model).__name__}.")
    return model


def _low_precision(engine: Any) -> Any:
    """The dtype of a bf16/fp16 engine's parameters, None for fp32."""
    import torch

    return torch.bfloat16 if engine.bfloat16_enabled() else torch.float16 if engine.fp16_enabled() else None


def _outputs_to_fp32(engine: Any, args: Any, output: Any) -> Any:
    if _low_precision(engine) is None:
        return None
    from ..training import to_fp32

    return to_fp32(output)


#: Where a ZeRO optimizer keeps gradients besides ``param.grad``: the reduced partitions at a step
#: (``averaged_gradients``), the partition accumulated between micro-steps (ZeRO-1/2:
#: ``all_grad_tensors``, ``grads_in_partition``; ZeRO-3 offload: ``grad_partitions_flat_buffer``).
GRADIENT_BUFFERS = ("averaged_gradients", "all_grad_tensors", "grads_in_partition", "grad_partitions_flat_buffer")


def _zero_gradients(zero: Any) -> list[Any]:
    """The gradient buffers a ZeRO optimizer holds now (views of one another are counted once by :class:`_Held`)."""
    out: list[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, (list, tuple)):
            for item in v:
                walk(item)
        elif v is not None and hasattr(v, "numel"):
            out.append(v)

    for name in GRADIENT_BUFFERS:
        walk(getattr(zero, name, None))
    return out


class _Held:
    """Bytes of tensors by memory held: a tensor adds only the bytes of its storage that no tensor
    counted before covers (DeepSpeed keeps flat buffers and views into them under several names).

    >>> import torch
    >>> flat = torch.zeros(10); held = _Held()
    >>> held.new_bytes(flat[:6]), held.new_bytes(flat), held.new_bytes(flat[2:4]), held.new_bytes(torch.zeros(3))
    (24, 16, 0, 12)
    """

    def __init__(self) -> None:
        self.spans: dict[tuple[str, int], list[tuple[int, int]]] = {}

    def new_bytes(self, t: Any) -> int:
        if t is None or not hasattr(t, "untyped_storage"):
            return 0
        size = t.numel() * t.element_size()
        if size == 0:
            return 0
        start = t.storage_offset() * t.element_size()
        spans = self.spans.setdefault((str(t.device), t.untyped_storage().data_ptr()), [])
        covered = sum(max(0, min(start + size, e) - max(start, b)) for b, e in spans)  # spans stay disjoint
        lo, hi, apart = start, start + size, []
        for b, e in spans:  # those the new range touches become one with it
            if e < start or b > start + size:
                apart.append((b, e))
            else:
                lo, hi = min(lo, b), max(hi, e)
        spans[:] = [*apart, (lo, hi)]
        return size - covered


def _zero_master(zero: Any) -> list[Any]:
    """The fp32 master partitions a ZeRO optimizer keeps (its optimizer state besides the torch state)."""
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition"):
        held = getattr(zero, name, None)
        if held:
            return [t for t in held if t is not None]
    return []


