"""One running cell as ipyparallel sees it: the code that reads ipyparallel's ``AsyncResult`` internals.

:class:`IppCellView` wraps the ``AsyncResult`` of ``view.execute``: which ranks still run,
which failed (as :class:`jdist.errors.RankFailure`), and the IOPub messages of the cell, handed
to a queue. ipyparallel's public API gives neither per-engine futures nor IOPub callbacks, so
this reads ``AsyncResult._children`` (one future per engine, in the order the cell was sent),
each future's ``iopub_callbacks`` and its ``output.metadata``, and the client's IO loop. That
is why ipyparallel is pinned to 9.x (pyproject.toml). The other reads of its private parts:
the engine launcher's ``_output`` (:func:`jdist.kernel.launch.mpi.engine_set_launcher`, a lenient
UTF-8 read), the controller's engine-id file name (removed by ``ClusterSession.stop``) and the
client's ``_send_control_request`` (``ClusterSession.reply``: answers to a running trial or to a rank
stopped at ``breakpoint()``, on the engines' control channel).
"""

from __future__ import annotations

import queue
import threading
from datetime import datetime
from typing import Any, Sequence

from jdist.codec import decode_data
from jdist.errors import ClusterError, RankFailure
from jdist.protocol import DATA_KEY

#: (rank, kind, content): kind is "stream", "display_data", "execute_result" or "data".
Message = tuple[int, str, Any]


class IppCellView:
    """A cell sent to ``ranks`` (in the order of the AsyncResult's targets)."""

    def __init__(self, ar: Any, ranks: Sequence[int]):
        self.ar = ar
        self.ranks = list(ranks)
        self._children = list(ar._children)
        if len(self._children) != len(self.ranks):
            raise ValueError(f"{len(self._children)} engine futures for {len(self.ranks)} ranks")

    def attach(self, inbox: queue.SimpleQueue[Message]) -> None:
        """Hand every IOPub message of the cell to ``inbox`` (from ipyparallel's IO thread: only enqueue there).

        Runs on the client's IO thread itself, which also dispatches IOPub messages: what had
        arrived before (kept in the futures' metadata) is replayed and the callbacks are added
        in one step, so nothing is delivered twice or missed.
        """
        from ipyparallel import serialize

        def callback_for(rank: int) -> Any:
            def callback(msg: dict[str, Any]) -> None:
                kind = msg["header"]["msg_type"]
                if kind == "data_message":
                    data, _ = serialize.deserialize_object(msg["buffers"])
                    if DATA_KEY in data:
                        inbox.put((rank, "data", decode_data(data[DATA_KEY])))
                elif kind in ("stream", "display_data", "execute_result"):
                    inbox.put((rank, kind, msg["content"]))

            return callback

        done = threading.Event()

        def on_io_thread() -> None:
            try:
                for rank, future in zip(self.ranks, self._children):
                    md = future.output.metadata
                    for name in ("stdout", "stderr"):
                        if md[name]:
                            inbox.put((rank, "stream", {"name": name, "text": md[name]}))
                    for content in md["outputs"]:
                        inbox.put((rank, "display_data", content))
                    if md["execute_result"]:
                        inbox.put((rank, "execute_result", md["execute_result"]))
                    if DATA_KEY in md["data"]:  # the latest data message (earlier ones are repaired)
                        inbox.put((rank, "data", decode_data(md["data"][DATA_KEY])))
                    future.iopub_callbacks.append(callback_for(rank))
            finally:
                done.set()

        self.ar._client._io_loop.add_callback(on_io_thread)
        if not done.wait(30):
            raise ClusterError("The ipyparallel client's IO thread does not answer: run %dist restart.")

    def on_each_done(self, callback: Any) -> None:
        """Call ``callback()`` (on ipyparallel's IO thread: only signal there) as each rank's part ends."""
        for child in self._children:
            child.add_done_callback(lambda _future: callback())

    # -- state ------------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.ar.ready()

    def wait(self, timeout: float) -> None:
        self.ar.wait(timeout)

    def wait_for_output(self, timeout: float) -> None:
        self.ar.wait_for_output(timeout=timeout)

    def done_count(self) -> int:
        return sum(c.done() for c in self._children)

    def futures(self, ranks: Sequence[int]) -> dict[int, Any]:
        """Each of ``ranks``' ipyparallel future of this cell (``done()`` once its part ended)."""
        return {r: c for r, c in zip(self.ranks, self._children) if r in ranks}

    def running(self) -> list[int]:
        """Ranks whose part of the cell has not ended."""
        return [r for r, c in zip(self.ranks, self._children) if not c.done()]

    def failed_while_others_run(self) -> bool:
        """Some ranks failed while others still run (they may wait for them in a collective).

        A script run with ``%run`` that raised replies "ok" (IPython shows the error itself), so
        the error message counts too; a clean exit (``sys.exit(0)``) is no failure: the others go on.
        """
        return bool(self.early_failures())

    def early_failures(self) -> list[str]:
        """The error names of the ranks that failed while others still run (``[]``: none, or all ended)."""
        def failed(md: dict[str, Any]) -> str | None:
            err = md.get("error")
            if err is not None:
                ename = getattr(err, "ename", "")
                return ename if RankFailure(0, ename, getattr(err, "evalue", "")).exit_code != 0 else None
            return "UnknownError" if md.get("status") == "error" else None

        done = [c.done() for c in self._children]
        if all(done):
            return []
        names = (failed(md) if d else None for d, md in zip(done, self.ar.metadata))
        return [name for name in names if name is not None]

    def failures(self) -> dict[int, RankFailure]:
        """Per rank whose part failed (engine death included): what failed and when. Ranks still running (stuck
        after a release) are left out: the failure of a rank that ended is kept whatever the others do."""
        from ipyparallel.error import RemoteError

        out: dict[int, RankFailure] = {}
        for rank, child, md in zip(self.ranks, self._children, self.ar.metadata):
            if not child.done():
                continue
            err = md.get("error")
            if err is None and child.exception() is not None:
                err = child.exception()
            if err is None and isinstance(child.result(), RemoteError):
                err = child.result()  # a dead engine's "result" (EngineError)
            if err is None and md.get("status") == "error":
                out[rank] = RankFailure(rank, "UnknownError", "the rank reported an error without details",
                                        completed=_timestamp(md.get("completed")))
                continue
            if err is None:
                continue
            render = getattr(err, "render_traceback", None)
            ename = getattr(err, "ename", None) or type(err).__name__
            evalue = getattr(err, "evalue", None)
            out[rank] = RankFailure(
                rank, ename, str(err) if evalue is None else evalue,  # `raise SystemExit`: evalue ""
                # an exit says its code; the traceback of the exit call says nothing more
                tuple(render()) if callable(render) and ename != "SystemExit" else (),
                _timestamp(md.get("completed")),
            )
        return out


def _timestamp(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value) if isinstance(value, (int, float)) else None
