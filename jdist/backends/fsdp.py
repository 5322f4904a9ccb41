"""``--backend fsdp``: PyTorch FSDP2 ``fully_shard`` (:class:`jdist.rank.backends.fsdp.FSDPBackend`)."""

from __future__ import annotations

from jdist.plugins import BackendSpec


SPEC = BackendSpec("fsdp", "jdist.rank.backends.fsdp:FSDPBackend", slots=True,
                   help="PyTorch FSDP2 fully_shard (parameters, gradients and optimizer state sharded)")
