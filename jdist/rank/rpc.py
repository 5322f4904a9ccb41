"""Every function the kernel runs on the ranks, in one place: a thin facade.

The kernel names them with :class:`jdist.protocol.RankCall` (``RankCall("records")``), so
it never imports this module; ipyparallel runs them on the engines (``view.apply``). Set-up is
:mod:`jdist.rank.bootstrap`, the process's end :mod:`jdist.rank.process`; the others work on
the rank's session.
"""

from __future__ import annotations

from typing import Any

from jdist.protocol import RankInfo, Record, SetupConfig

from . import bootstrap, process
from .session import session


def setup(config: SetupConfig) -> RankInfo:
    """Initialise this engine as one rank (:func:`jdist.rank.bootstrap.setup`)."""
    return bootstrap.setup(config)


def teardown(finalize_within: float = 2.0) -> None:
    """Release the backend and finalize MPI before the cluster stops (:func:`jdist.rank.process.teardown`)."""
    process.teardown(finalize_within)


def exit_process() -> None:
    """End this rank's process at once (:func:`jdist.rank.process.exit_process`)."""
    process.exit_process()


def set_owner(pid: int) -> None:
    """The cluster now belongs to process ``pid`` (:func:`jdist.rank.process.set_owner`)."""
    process.set_owner(pid)


def doctor() -> dict[str, Any]:
    """This rank's facts for a bug report (:func:`jdist.rank.doctor.rank_facts`)."""
    from .doctor import rank_facts

    return rank_facts()


def cell_ranks(ranks: list[int]) -> None:
    """The next cell runs on ``ranks`` only (``--targets``): until its end, collectives on groups with other
    ranks are refused (:mod:`jdist.rank.collectives`)."""
    session().cell_ranks = tuple(ranks)


def cell_count() -> tuple[int, int]:
    """(current cell id, records logged in it) on this rank."""
    stream = session().stream
    return stream.cell, stream.seq


def records(cell: int, seqs: list[int]) -> list[Record]:
    """Records of the current cell with the given sequence numbers, as far as still kept: the
    kernel's repair of the stream."""
    return session().stream.records(cell, seqs)


def guard_state() -> dict[str, str | None]:
    """Whether this rank broke the process group (a release), where it was waiting, and why its
    communication cannot be used again in this process (``unusable``: the ranks must restart)."""
    s = session()
    state = s.guard.state() if s.guard is not None else {"broken": None, "released_from": None, "started": None}
    return {**state, "unusable": s.backend.unusable() if s.backend is not None else None}


def break_group(why: str) -> None:
    """Make every pending collective of this rank's process groups fail (all ranks call it before
    :func:`rebuild_group` when the ranks started different numbers of collectives: one that only some
    started, e.g. an asynchronous one, would pair with the next one the others start)."""
    s = session()
    if s.guard is not None:
        s.guard.break_group(why)


def rebuild_group() -> dict[str, Any]:
    """Re-create the process group after a release broke it (all ranks at once, over MPI).

    Variables stay. The backend re-creates its group (:meth:`Backend.recreate_group
    <jdist.rank.backends.Backend.recreate_group>`) and re-attaches each prepared model where it can;
    what it says about them (:meth:`~jdist.rank.backends.Backend.describe_rebuild`) is what the
    kernel prints. Returns ``{"released_from", "reattached", "stale", "kept", "lost"}``.
    """
    from .namespace import names_of_objects

    s = session()
    released = s.guard.state()["released_from"] if s.guard is not None else None
    reattached: list[str] = []
    stale: list[str] = []
    if s.backend is not None:
        group = s.backend.recreate_group()
        names = names_of_objects()
        for model in list(s.train.models):
            label = names.get(id(model), type(model).__name__)
            done = s.backend.reattach(model, group)
            if done is True:
                reattached.append(label)
            elif done is False:
                stale.append(label)
    kept, lost = s.backend.describe_rebuild(sorted(reattached), sorted(stale)) if s.backend else (None, None)
    remade = s.ctx.remade if s.backend is not None else None  # a mesh's groups (jdist.rank.mesh.groups)
    if remade is not None:
        kept = "; ".join(filter(None, [kept, remade.kept()])) or None
        lost = "; ".join(filter(None, [lost, remade.lost()])) or None
    return {"released_from": released, "reattached": sorted(reattached), "stale": sorted(stale), "kept": kept,
            "lost": lost}


def apply_options(values: dict[str, Any]) -> None:
    """Live changes of rank-side options (``--precision``, ``--threads``, a backend's own live
    options) on a running cluster (:func:`jdist.rank.bootstrap.apply_options`)."""
    bootstrap.apply_options(session(), values)


def get_global(name: str) -> Any:
    """The value of ``name`` in this rank's cell namespace (``%dist pull``)."""
    from .namespace import get

    return get(name)


def restore_latest(directory: str, names: dict[str, str | None], every: int, keep: int | None) -> dict[str, Any]:
    """Load the newest automatic checkpoint into the same variables (``%dist restart``)."""
    from .checkpoint import restore_latest as restore

    return restore(directory, names, every, keep)


def elastic_snapshot(directory: str) -> dict[str, Any]:
    """Save what a resize carries into ``directory`` (:func:`jdist.rank.elastic.snapshot`; collective)."""
    from .elastic import snapshot

    return snapshot(directory)


def elastic_restore(directory: str, manifest: dict[str, Any], checkpoint: dict[str, Any] | None = None,
                    grad_accum: int | None = None) -> dict[str, Any]:
    """Load a resize's snapshot into the replayed set-up's variables (:func:`jdist.rank.elastic.restore`)."""
    from .elastic import restore

    return restore(directory, manifest, checkpoint, grad_accum)


def has_function(name: str) -> bool:
    """Whether ``name`` is a function in this rank's cell namespace (``jdist.tune``'s objective)."""
    from .namespace import user_ns

    return callable(user_ns().get(name))


def tune_enter(per_trial: int) -> dict[str, int]:
    """A sweep starts: slots of ``per_trial`` ranks as default groups (:func:`jdist.rank.tune.enter_slots`)."""
    from . import tune

    return tune.enter_slots(per_trial)


def tune_trial(number: int, objective: Any, given: dict[str, Any] | None = None) -> Any:
    """Run one trial of the sweep on this slot; its value (:func:`jdist.rank.tune.run_trial`)."""
    from . import tune

    return tune.run_trial(number, objective, given)


def tune_leave() -> dict[str, Any]:
    """The sweep ended (:func:`jdist.rank.tune.leave_slots`): the world group again, the models prepared
    before the sweep re-attached to it (:func:`rebuild_group`'s answer)."""
    from . import tune

    if tune.leave_slots() and session().backend is not None:
        return rebuild_group()
    return {"reattached": [], "stale": [], "kept": None, "lost": None, "released_from": None}


def debug_failure() -> dict[str, Any] | None:
    """When this rank's last failing cell failed, and with what (:func:`jdist.rank.debug.relay.failure`)."""
    from .debug import relay as debug

    return debug.failure()


def debug_start() -> dict[str, Any]:
    """Open a post-mortem on this rank's last failure (:func:`jdist.rank.debug.relay.start`)."""
    from .debug import relay as debug

    return debug.start()


def debug_command(line: str) -> dict[str, Any]:
    """One pdb command in the open post-mortem (:func:`jdist.rank.debug.relay.command`)."""
    from .debug import relay as debug

    return debug.command(line)


def debug_end() -> None:
    """Close the post-mortem (:func:`jdist.rank.debug.relay.end`)."""
    from .debug import relay as debug

    debug.end()


def debug_arm(ranks: list[int] | None) -> None:
    """``breakpoint()`` stops the cells that follow on ``ranks`` (None: on none) (:func:`jdist.rank.debug.relay.arm`)."""
    from .debug import relay as debug

    debug.arm(ranks is not None and session().ctx.rank in ranks)


def dap_start() -> dict[str, Any]:
    """Start debugpy on this rank for the notebook's Debugger panel (:func:`jdist.rank.debug.dap.start`)."""
    from .debug import dap

    return dap.start()


def dap_cell(path: str | None) -> None:
    """Name the next cell's code ``path``, as the notebook's debugger names the cell (:func:`jdist.rank.debug.dap.cell`)."""
    from .debug import dap

    dap.cell(path)
