"""``%dist attach RUN``: take over the ranks a ``jdist run --keep`` left up, with the script's globals.

``jdist run --keep`` writes ``attach.json`` into its run folder (:data:`OFFER`: the cluster id, its
state file, its private folder, the owner process) and waits. Attaching reads it, builds a
:class:`~jdist.kernel.cluster.ClusterSession` around the running controller and ranks
(:meth:`~jdist.kernel.cluster.ClusterSession.attach`: the ranks now end with this kernel), then
writes :data:`ACCEPTED` into the private folder, on which ``jdist run`` lets go of the cluster and
exits. Same user and same machine only (the ranks watch their owner by PID; ``--launcher
local-mpi``).

Example (in a notebook)::

    %dist attach 20261125-101500-3f9a1c
    %%distributed
    print(model)                 # the script's globals, on every rank
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from jdist.common.procs import alive
from jdist.metrics import list_runs

from .cluster import ClusterSession

#: The offer ``jdist run --keep`` writes into its run folder.
OFFER = "attach.json"
#: What the attaching kernel writes into the cluster's private folder (its PID): the offer is taken.
ACCEPTED = "attached"


def find_offer(ref: str, run_dir: str | None = None) -> tuple[Path, dict[str, Any]]:
    """The run folder and offer of run ``ref`` (an id or a unique prefix); ValueError with the fix."""
    offers = [p for p in list_runs(run_dir) if p.name.startswith(ref) and (p / OFFER).exists()]
    if len(offers) != 1:
        if not offers:
            raise ValueError(f"No run {ref!r} offers its ranks: start the script with jdist run --keep, and attach "
                             "while it waits (jdist runs lists the runs).")
        raise ValueError(f"{ref!r} matches {len(offers)} runs ({', '.join(p.name for p in offers)}): give more of the id.")
    return offers[0], json.loads((offers[0] / OFFER).read_text())


def attach(ref: str, run_dir: str | None = None) -> ClusterSession:
    """Take over the cluster that run ``ref`` offers (see the module doc)."""
    folder, offer = find_offer(ref, run_dir)
    if offer["host"] != socket.gethostname():
        raise ValueError(f"Run {folder.name}'s ranks run on {offer['host']}: attach from a kernel on that machine.")
    if not alive(offer["owner"]):
        raise ValueError(f"Run {folder.name}'s jdist run has ended, and its ranks with it.")
    state = json.loads(Path(offer["state_file"]).read_text())
    cluster = ClusterSession.attach(state, Path(offer["work_dir"]))
    (Path(offer["work_dir"]) / ACCEPTED).write_text(str(os.getpid()))
    return cluster


__all__ = ["ACCEPTED", "OFFER", "attach", "find_offer"]
