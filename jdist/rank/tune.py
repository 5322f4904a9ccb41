"""A sweep's trials on the ranks: slots of ranks, each slot the torch default process group.

``jdist.tune`` in the kernel (:mod:`jdist.kernel.tune`) tiles the world into slots of ``per_trial``
ranks (:func:`enter_slots`, collective over MPI): on each rank the default process group becomes
its slot's, so DDP, FSDP and a ``dist.all_reduce`` without ``group=`` stay inside the trial. The
kernel then runs one trial per slot at a time (:func:`run_trial`, sent as a cell to the slot's
ranks), and gives the world group back at the end (:func:`leave_slots`, the models prepared before
the sweep re-attached).

The objective gets a :class:`Trial`: ``suggest_*`` asks the kernel's Optuna trial (every rank gets
the same value; parameters the kernel sampled with the trial need no round trip), ``report`` and
``jdist.log`` feed the pruner, ``should_prune`` gives every rank of the slot the same answer at the
same call, so the slot stops together. Requests travel as data messages on the rank's IOPub channel; the kernel answers on the
engine's control channel (both signed by ipyparallel's session key; no socket of jdist's own).

On the ranks, inside an objective::

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)   # the same value on every rank of the slot
        ...
        jdist.log(step=step, val_loss=v)
        if jdist.should_prune():                                 # the same answer on every rank of the slot
            return v
        return v
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import os
import sys
import queue
import signal
import threading
import time
from typing import Any, Callable

from jdist.protocol import PROTOCOL_VERSION, TUNE_REPLY, TuneMessage

from .channel import on_control
from .session import session

#: How often a rank checks whether its slot partners reached the agreement before a trial (seconds).
POLL_S = 0.0005
#: How long a rank waits for the kernel's answer to a request before raising.
ANSWER_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Slot:
    """This rank's slot while a sweep runs."""

    index: int
    size: int
    comm: Any  # the slot's MPI communicator
    world_ctx: Any  # the RankContext of the world, given back by leave_slots
    sweep: int
    replies: queue.Queue = dataclasses.field(default_factory=queue.Queue)
    failed: bool = False  # the last trial raised on this rank: the slot's group may be broken


_slot: Slot | None = None
_trial: Trial | None = None
_sweeps = 0
#: trial number -> why the kernel stopped it (a stop can arrive before the trial began on this rank)
_stops: dict[int, str] = {}
_stop_lock = threading.Lock()  # the control thread's stop and the main thread's trial change


def enter_slots(per_trial: int) -> dict[str, int]:
    """Make this rank's slot (ranks ``r // per_trial``) the default process group; collective on every rank.

    Models prepared before stay in the namespace but cannot synchronise until :func:`leave_slots`.
    """
    global _slot, _sweeps
    from .backends.torch_group import destroy_process_group, init_process_group

    s = session()
    world = s.ctx
    if world.comm is None:
        raise RuntimeError("jdist.tune needs MPI ranks (a %%distributed cluster).")
    if per_trial < 1 or world.world_size % per_trial:
        raise ValueError(f"per_trial={per_trial} does not divide the {world.world_size} ranks into slots.")
    # every rank says whether it can take part before any of them changes its group: a rank that raised
    # alone would leave the others waiting in the Split below
    mine = "its slots are already set up (a sweep is running)" if _slot is not None else None
    problems = world.comm.allgather(mine)
    if any(problems):
        raise RuntimeError("; ".join(f"rank {r}: {p}" for r, p in enumerate(problems) if p) +
                           ". Nothing was changed on the ranks.")
    _sweeps += 1
    index = world.rank // per_trial
    comm = world.comm.Split(index, world.rank)
    world.comm.Barrier()  # every rank leaves the world group together
    destroy_process_group()
    one_host = len(set(comm.allgather(world.hostname))) == 1  # the kernel refuses slots across hosts
    ctx = dataclasses.replace(world, rank=comm.Get_rank(), world_size=per_trial, comm=comm, port=None,
                              master_addr="127.0.0.1" if one_host else world.master_addr,
                              store_tag=f"sweep{_sweeps}-slot{index}-")
    init_process_group(ctx)
    _use_ctx(s, ctx)
    _slot = Slot(index, per_trial, comm, world, _sweeps)
    _stops.clear()
    if s.guard is not None:  # a SIGINT releases a collective only when it stops the running trial
        s.guard.may_release = _stopping
    if not on_control(TUNE_REPLY, _on_reply):
        raise RuntimeError("jdist.tune runs trials on ipyparallel engines; this rank has no engine kernel.")
    return {"slot": index, "slot_rank": ctx.rank}


def leave_slots() -> bool:
    """End the slots: the slot's group is destroyed and the world's context is back; the caller then
    forms the world group again (:func:`jdist.rank.rpc.tune_leave`). False if no sweep ran here."""
    global _slot
    from .backends.torch_group import destroy_process_group

    s = session()
    slot = _slot
    if slot is None:
        return False
    on_control(TUNE_REPLY, None)
    if s.guard is not None:
        s.guard.may_release = None
    _stops.clear()
    try:
        destroy_process_group()
    except Exception:  # a group a trial broke may complain while shutting down; it is gone either way
        pass
    _remove_stores(s.ctx)
    _use_ctx(s, slot.world_ctx)
    _slot = None
    slot.comm.Free()
    return True


def repair_if_broken(slot: Slot) -> bool:
    """Collective over the slot's ranks, before each trial: if the last trial failed on any of them (a
    raise, a release, an interrupt), the slot gets a new process group. Whether it did."""
    from .backends.torch_group import recreate_process_group

    s = session()
    mine = slot.failed or bool(s.guard is not None and s.guard.broken)
    if not any_rank(slot.comm, mine):
        return False
    recreate_process_group(s.ctx)
    slot.failed = False
    return True


def any_rank(comm: Any, flag: bool, poll_s: float = POLL_S) -> bool:
    """Whether ``flag`` is true on any rank of ``comm`` (collective), waiting without spinning: MPICH's
    blocking collectives poll a core while they wait, and with more ranks than cores the rank that waits
    takes the CPU its slot partner needs to get there (measured: 20 ms gaps between trials, 8 ranks on 2
    cores)."""
    import numpy as np
    from mpi4py import MPI

    mine = np.array([int(flag)], dtype=np.int32)
    out = np.zeros(1, dtype=np.int32)
    request = comm.Iallreduce(mine, out, op=MPI.MAX)
    while not request.Test():
        time.sleep(poll_s)
    return bool(out[0])


def _use_ctx(s: Any, ctx: Any) -> None:
    s.ctx = ctx
    if s.backend is not None and hasattr(s.backend, "ctx"):
        s.backend.ctx = ctx


def _remove_stores(ctx: Any) -> None:
    if ctx.rank == 0 and ctx.work_dir and ctx.store_tag:
        for name in os.listdir(ctx.work_dir):
            if name.startswith(f"store-{ctx.store_tag}"):
                try:
                    os.unlink(os.path.join(ctx.work_dir, name))
                except FileNotFoundError:
                    pass


def _require_slot() -> Slot:
    if _slot is None:
        raise RuntimeError("No sweep runs on this rank: trials run through jdist.tune(...) in the notebook.")
    return _slot


# -- the kernel's answers and stops: on the engine's control thread -------------------------------
def _on_reply(content: dict[str, Any]) -> None:
    slot = _slot
    if slot is None:
        return
    if "stop" in content:
        stop_trial(int(content["trial"]), str(content["stop"]))
    else:
        slot.replies.put(content)


def stop_trial(number: int, why: str) -> None:
    """Stop trial ``number`` on this rank: KeyboardInterrupt in its objective, now if it runs, else as it
    begins; a blocked collective of it is released (:meth:`jdist.rank.guard.Guard.release`).

    The kernel stops a trial this way, not with a signal to the process: a SIGINT sent as one trial
    ends can reach the next one, queued behind it on the same engine, on one rank of its slot only.
    """
    with _stop_lock:
        _stops[number] = why
        if _trial is not None and _trial.number == number:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def _stopping() -> bool:
    """Whether the kernel stopped the trial running now (a SIGINT then interrupts it)."""
    trial = _trial
    return trial is not None and trial.number in _stops


def _on_sigint(signum: int, frame: Any) -> None:
    """The main thread's SIGINT handler while a trial runs: KeyboardInterrupt if the kernel stopped this
    trial; a signal meant for the trial before is dropped."""
    if _stopping():
        raise KeyboardInterrupt


# -- trials --------------------------------------------------------------------------------------
class Trial:
    """What the objective gets on every rank of its slot: Optuna's ``Trial`` methods that a
    distributed objective uses, answered by the kernel's study.

    ``number`` and ``params`` are the kernel's trial's; ``suggest_float/int/categorical`` give
    every rank of the slot the same value; ``report(value, step)`` feeds the pruner (slot rank 0's
    value); ``should_prune()`` answers every rank the same at its n-th call; ``set_user_attr`` keeps a
    value with the trial (slot rank 0's).
    """

    def __init__(self, number: int, slot: Slot, given: dict[str, tuple[str, dict[str, Any], Any]] | None = None):
        self.number = number
        self.params: dict[str, Any] = {}
        self.distributions: dict[str, tuple[str, dict[str, Any]]] = {}  # name -> (kind, args) as suggested
        self.user_attrs: dict[str, Any] = {}
        self.constraints: list[float] | None = None
        self.datetime_start = datetime.datetime.now()
        self._given = given or {}  # name -> (kind, args, value) the kernel sampled with the trial
        self._slot = slot
        self._seq = 0
        self._prune_calls = 0

    # -- suggestions: the kernel's trial answers every rank the same
    def suggest_float(self, name: str, low: float, high: float, step: float | None = None,
                      log: bool = False) -> float:
        return self._suggest(name, "float", low=low, high=high, step=step, log=log)

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return self._suggest(name, "int", low=low, high=high, step=step, log=log)

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self._suggest(name, "categorical", choices=list(choices))

    def suggest_uniform(self, name: str, low: float, high: float) -> float:
        return self.suggest_float(name, low, high)

    def suggest_loguniform(self, name: str, low: float, high: float) -> float:
        return self.suggest_float(name, low, high, log=True)

    def _suggest(self, name: str, kind: str, **args: Any) -> Any:
        if name in self.params:
            return self.params[name]
        given = self._given.get(name)
        if given is not None and given[0] == kind and given[1] == args:  # no round trip to the kernel
            value = given[2]
        else:
            value = self._ask("suggest", {"name": name, "kind": kind, "args": args})
        self.params[name] = value
        self.distributions[name] = (kind, args)
        return value

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float) -> float:
        return self.suggest_float(name, low, high, step=q)

    def report(self, value: float, step: int) -> None:
        """Give the pruner ``value`` at ``step`` (slot rank 0's is used; ``jdist.log`` of the sweep's
        ``metric`` does the same)."""
        if self._slot.comm.Get_rank() == 0:
            self._send("report", {"value": float(value), "step": int(step)})

    def should_prune(self) -> bool:
        """Whether the kernel's pruner stops this trial now. Every rank of the slot gets the same answer
        at its n-th call (the kernel decides once per call number), so SPMD code stops together; the
        records logged so far reach the kernel first. One round trip to the kernel (a few ms)."""
        session().publish_due()
        self._prune_calls += 1
        return bool(self._ask("should_prune", {"index": self._prune_calls}))

    def set_constraint(self, constraint: Any) -> None:
        self.constraints = [float(c) for c in constraint]
        self.set_user_attr("constraint", self.constraints)

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value
        if self._slot.comm.Get_rank() == 0:
            self._send("user_attr", {"key": key, "value": value})

    # -- transport
    def _send(self, op: str, payload: dict[str, Any]) -> int:
        s = session()
        self._seq += 1
        message: TuneMessage = {"v": PROTOCOL_VERSION, "kind": "tune", "cell": s.stream.cell, "trial": self.number,
                                "op": op, "seq": self._seq, "payload": payload}
        s.publish(message)
        return self._seq

    def _ask(self, op: str, payload: dict[str, Any]) -> Any:
        """Ask the kernel and wait for its answer. Not a collective: each rank asks for itself (the kernel
        gives every rank the same suggestion and the same pruning decision), so code that calls the
        trial on slot rank 0 only (``optuna_integration.TorchDistributedTrial``) works too."""
        return self._wait(self._send(op, payload))

    def _wait(self, seq: int) -> Any:
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"trial {self.number}: the kernel did not answer within {ANSWER_TIMEOUT_S:g} s "
                                   "(is jdist.tune still running in the notebook?)")
            try:
                reply = self._slot.replies.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if reply.get("trial") == self.number and reply.get("seq") == seq:
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return reply.get("value")


def run_trial(number: int, objective: str | Callable[[Trial], Any],
              given: dict[str, tuple[str, dict[str, Any], Any]] | None = None) -> float | list[float] | None:
    """Run trial ``number`` of the sweep on this slot and return its value: ``objective`` (a function,
    or its name in the cell namespace) gets a :class:`Trial`. ``given``: parameters the kernel sampled
    with the trial (name -> (kind, args, value)); a ``suggest_*`` of one of them the same way needs no
    round trip.

    The kernel sends it with ``apply`` (not as a cell: an engine drops the cells queued behind one that
    raised, and the kernel queues the next trial behind the running one); it runs as one cell of the
    record stream, so ``jdist.log`` works as in a ``%%distributed`` cell.
    """
    global _trial
    from .namespace import get

    slot = _require_slot()
    fn = get(objective) if isinstance(objective, str) else objective
    if not callable(fn):
        raise TypeError(f"jdist.tune: {objective!r} on the ranks is a {type(fn).__name__}, not a function of one trial.")
    trial = Trial(number, slot, given)
    _optuna_compat()
    s = session()
    s.begin_cell()
    before = set(map(id, [*s.train.models, *s.train.optimizers]))
    try:
        # from here a SIGINT interrupts only a stopped trial (ipykernel puts its own handler back after the
        # request); the repair is never interrupted: a rank leaving it alone would leave its partners in it
        signal.signal(signal.SIGINT, _on_sigint)
        repaired = repair_if_broken(slot)
        if slot.comm.Get_rank() == 0:
            trial._send("started", {"time": time.time(), "repaired": repaired})
        try:
            with _stop_lock:
                for old in [n for n in _stops if n < number]:  # trials this rank will not run again
                    del _stops[old]
                _trial = trial
            if _stopping():
                raise KeyboardInterrupt(f"trial {number} was stopped before it began: {_stops[number]}")
            return _as_value(fn(trial))
        except BaseException:
            slot.failed = True
            raise
        finally:
            _end_trial(number)
    finally:
        for kept in (s.train.models, s.train.optimizers):  # the trial's own: not re-attached to the world
            for obj in [o for o in kept if id(o) not in before]:  # group at the sweep's end
                kept.discard(obj)
        s.end_cell()


def _end_trial(number: int) -> None:
    """No trial runs from now on (a stop for ``number`` that is on its way is dropped)."""
    global _trial
    while True:
        try:
            with _stop_lock:
                _trial = None
                _stops.pop(number, None)
            return
        except KeyboardInterrupt:  # the stop arrived as the trial ended: it has ended
            continue


def _optuna_compat() -> None:
    """Let code written for ``optuna_integration.TorchDistributedTrial`` take this trial on slot rank 0:
    :class:`Trial` counts as an Optuna trial, and the group TorchDistributedTrial keeps from its first
    use (a module global) is forgotten before each trial, since the slot's group is new in every sweep
    and after a repair."""
    global _registered
    if not _registered and ("optuna" in sys.modules or _installed("optuna_integration")):
        import optuna

        optuna.trial.BaseTrial.register(Trial)
        _registered = True
    module = sys.modules.get("optuna_integration.pytorch_distributed.pytorch_distributed")
    if module is not None and hasattr(module, "_g_pg"):
        module._g_pg = None


_registered = False


def _installed(name: str) -> bool:
    """Whether module ``name`` is imported or importable, without importing it. ``find_spec`` raises
    ValueError for a module in ``sys.modules`` whose ``__spec__`` is None: ``optuna_integration`` replaces
    itself there with a lazy module that has none, once imported."""
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _as_value(value: Any) -> float | list[float] | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return float(value.item() if hasattr(value, "item") else value)


def current_trial() -> Trial:
    """The trial running on this rank (inside an objective run by ``jdist.tune``)."""
    if _trial is None:
        raise RuntimeError("jdist.should_prune() works inside an objective that jdist.tune(...) runs; "
                           "no trial runs on this rank.")
    return _trial


def should_prune() -> bool:
    """Whether the sweep's pruner stops the running trial now: every rank of its slot gets the same
    answer at the same call (:meth:`Trial.should_prune`).

    >>> import jdist
    >>> jdist.should_prune()   # doctest: +SKIP
    False
    """
    return current_trial().should_prune()
