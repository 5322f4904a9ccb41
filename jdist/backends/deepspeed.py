"""``--backend deepspeed``: DeepSpeed ZeRO engines on jdist's process group
(:class:`jdist.rank.backends.deepspeed.DeepSpeedBackend`), with its options ``--zero`` and ``--offload``."""

from __future__ import annotations

from jdist.common.stacks import COLLECTIVE_PATHS
from jdist.options import ClusterConfig, Option, Scope
from jdist.plugins import BackendSpec

INSTALL_HINT = (
    "DeepSpeed is not installed in this environment: pip install 'jdist[deepspeed]' (DeepSpeed 0.19; `make test` "
    "installs it), then %dist restart. Or pick --backend fsdp for sharded training."
)


ZERO = Option("zero", ("--zero",), "DeepSpeed ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also "
              "parameters (default 2). Engines prepared from then on use it.", Scope.LIVE, type=int,
              choices=(1, 2, 3), metavar="1|2|3", applied_by="ranks", default=2,
              message="ZeRO-{} for models prepared from now on (jdist.prepare).")
OFFLOAD = Option("offload", ("--offload",), "DeepSpeed offload to host memory: none, optimizer (its state), or all "
                 "(optimizer state and parameters; needs --zero 3). Engines prepared from then on use it.",
                 Scope.LIVE, choices=("none", "optimizer", "all"), applied_by="ranks", default="none",
                 message="offload {} for models prepared from now on (jdist.prepare).")


def check(config: ClusterConfig) -> None:
    """What DeepSpeed cannot run on jdist's ranks, as one line with the fix."""
    zero, offload = int(config.get("zero", 2)), config.get("offload", "none")
    if offload == "all" and zero != 3:
        raise ValueError(f"--offload all moves parameters to host memory, which only ZeRO-3 partitions: give --zero 3, "
                         f"or --offload optimizer with --zero {zero}.")
    if config.precision == "fp16" and not config.gpus:
        raise ValueError("--backend deepspeed runs fp16 (with its loss scaling) on GPU ranks only: on CPU ranks use "
                         "--precision bf16, or start GPU ranks with --gpus N.")


SPEC = BackendSpec("deepspeed", "jdist.rank.backends.deepspeed:DeepSpeedBackend", requires=("deepspeed",),
                   install_hint=INSTALL_HINT, backward_waits=True,
                   collective_paths=(*COLLECTIVE_PATHS, "/deepspeed/comm/", "/deepspeed/runtime/zero/"),
                   options=(ZERO, OFFLOAD), check=check, forget_groups="jdist.rank.backends.deepspeed:forget_groups",
                   help="DeepSpeed ZeRO engines (stage 1/2/3, optional offload) on jdist's process group")
