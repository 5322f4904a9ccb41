"""A launcher of one's own: local MPI ranks that each get a tag (``--tag NAME``) in their environment.

It owns its option (``--tag``, which also selects it), checks it, hands it to the ranks, and gets
it back from each rank through ``report_env`` (``RankInfo["launcher"]``): the way a scheduler's
launcher (PBS, LSF) would pass its own settings and learn its job id.
"""

from __future__ import annotations

from typing import Any, Sequence

from jdist.kernel.launch.local_mpi import LocalMPILauncher
from jdist.options import ClusterConfig, Option, Scope

TAG = Option("tag", ("--tag",), "A tag every rank gets as $JDIST_TAG (starts the ranks with --launcher tagged).",
             Scope.RESTART, type=str, metavar="NAME", implies=True)


class TaggedLauncher(LocalMPILauncher):
    name = "tagged"
    options = (TAG,)
    report_env = ("JDIST_TAG",)

    @classmethod
    def check(cls, config: ClusterConfig) -> None:
        if not config.get("tag"):
            raise ValueError("--launcher tagged needs the tag: give --tag NAME.")

    def where(self) -> str:
        return f" tagged {self.option('tag')}"

    def configure(self, ipp_config: Any) -> None:
        super().configure(ipp_config)
        ipp_config.MPILauncher.environment = {**ipp_config.MPILauncher.environment, "JDIST_TAG": self.option("tag")}

    def watch(self, ranks: Sequence[Any]) -> None:
        super().watch(ranks)
        self.tags = [info["launcher"]["JDIST_TAG"] for info in ranks]  # what each rank reported
