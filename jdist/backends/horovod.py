"""``--backend horovod``: Horovod's DistributedOptimizer over the ranks' MPI world
(:class:`jdist.rank.backends.horovod.HorovodBackend`)."""

from __future__ import annotations

from jdist.common.stacks import COLLECTIVE_PATHS
from jdist.plugins import BackendSpec

INSTALL_HINT = (
    "Horovod is not installed in this environment. Install it with `make horovod` from a jdist checkout "
    "(runs tools/build_horovod.sh: builds Horovod 0.28.1 against your torch with MPI, 3-8 minutes once, "
    "then cached), then %dist restart. Or pick --backend ddp or --backend fsdp."
)


SPEC = BackendSpec("horovod", "jdist.rank.backends.horovod:HorovodBackend", requires=("horovod",),
                   install_hint=INSTALL_HINT,
                   collective_paths=(*COLLECTIVE_PATHS, "/horovod/torch/mpi_ops.py", "/horovod/common/"),
                   spins=True, releases=False,  # its collectives run over MPI: no socket of a group to break
                   help="Horovod DistributedOptimizer over the ranks' MPI world")
