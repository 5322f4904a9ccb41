"""A Ray Train worker's jdist session (for ``jdist.ray.fit``, :mod:`jdist.ray.bridge`).

Opened on ``train_func``'s first line (:func:`jdist.ray.bridge.in_session`): rank,
world size and local rank come from ``ray.train.get_context()``; the records of ``jdist.log``
(and the automatic metrics: step time, memory) travel to the kernel through the run's Ray queue,
sent by the session's publisher thread every 0.25 s. Closed when ``train_func`` returns or raises
(or, if the worker stops inside it, before the worker shuts down): the last records and their
count go out then. No process group of jdist's: Ray Train makes its own, so
step time has no communication split.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from typing import Any

from jdist.codec import encode_data
from jdist.protocol import DataMessage

from ..filelog import current_device
from ..session import RankSession, activate, current


class QueueChannel:
    """A rank's messages into the run's Ray queue (``("data", rank, payload)``; blocks for the
    queue actor's answer, a few ms, on the publisher thread)."""

    def __init__(self, queue: Any, rank: int):
        self.queue = queue
        self.rank = rank

    def publish(self, message: DataMessage) -> None:
        self.queue.put(("data", self.rank, encode_data(message)))


def open_session(queue: Any) -> RankSession:
    """Make this worker's session current (replacing none: a Ray worker runs one training)."""
    import ray
    import ray.train

    from ..backends.base import RankContext

    ctx_ray = ray.train.get_context()
    ctx = RankContext(rank=ctx_ray.get_world_rank(), world_size=ctx_ray.get_world_size(),
                      local_rank=ctx_ray.get_local_rank(), local_world_size=ctx_ray.get_local_world_size(),
                      hostname=socket.gethostname(), device=current_device(),
                      master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"), timeout_s=0.0)
    # the worker group's placement group: the kernel removes it if it has to kill Ray Train's controller
    queue.put(("placement", ctx.rank, ray.get_runtime_context().get_placement_group_id()))
    s = RankSession(ctx=ctx, backend=None, spec=None, channel=QueueChannel(queue, ctx.rank), comm_timed=False)
    activate(s)
    s.begin_cell()
    s.start_publisher()
    return s


def note_report() -> None:
    """The worker calls ``ray.train.report``: the step of its newest ``jdist.log`` record goes to the
    queue first (the controller's report of it comes after), so the kernel puts the report there."""
    s = current()
    if s is not None and isinstance(s.channel, QueueChannel):
        s.channel.queue.put(("at", s.ctx.rank, s.stream.last_step()))


def close_session(error: BaseException | None = None) -> None:
    """The rest of the records and their count, then no session. ``error``: what the training function
    raised; its whole traceback goes to the queue first (``("failed", rank, ename, evalue, text, when)``),
    so the kernel has it even when Ray Train's controller does not return the worker group's error."""
    s = current()
    if s is None or not isinstance(s.channel, QueueChannel):
        return
    if error is not None and not isinstance(error, KeyboardInterrupt):
        text = "".join(traceback.format_exception(error))
        s.channel.queue.put(("failed", s.ctx.rank, type(error).__name__, str(error), text, time.time()))
    s.stop_publisher()
    s.end_cell()
    activate(None)


__all__ = ["QueueChannel", "close_session", "note_report", "open_session"]
