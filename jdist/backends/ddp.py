"""``--backend ddp`` (the default): PyTorch DistributedDataParallel (:class:`jdist.rank.backends.ddp.DDPBackend`)."""

from __future__ import annotations

from jdist.plugins import BackendSpec


SPEC = BackendSpec("ddp", "jdist.rank.backends.ddp:DDPBackend", backward_waits=True, slots=True,
                   help="PyTorch DistributedDataParallel (gradients all-reduced during backward)")
