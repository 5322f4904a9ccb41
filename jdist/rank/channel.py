"""Where a rank's messages to the kernel go.

On an ipyparallel engine the channel is the engine's ``data_pub``: each message travels as a
signed IOPub message of the running cell (no socket of jdist's own). :class:`ListChannel`
keeps them in a list (tests, or a script run without a kernel); :class:`NullChannel` drops them.

Example:
    >>> ch = ListChannel()
    >>> ch.publish({"v": 3, "kind": "progress", "cell": 1, "total_steps": 10})
    >>> ch.messages[0]["kind"]
    'progress'
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from jdist.codec import encode_data
from jdist.protocol import DATA_KEY, DataMessage


class KernelChannel(Protocol):
    def publish(self, message: DataMessage) -> None:
        """Send ``message`` to the kernel (best effort; the kernel repairs lost records)."""


class DataPubChannel:
    """The IPython engine's ``data_pub`` (ipyparallel's ``ZMQDataPublisher``); messages travel
    pickled once (:func:`jdist.codec.encode_data`)."""

    def __init__(self, data_pub: Any):
        self.data_pub = data_pub

    def publish(self, message: DataMessage) -> None:
        self.data_pub.publish_data({DATA_KEY: encode_data(message)})


class ListChannel:
    """Keeps every message in :attr:`messages`."""

    def __init__(self) -> None:
        self.messages: list[DataMessage] = []

    def publish(self, message: DataMessage) -> None:
        self.messages.append(message)


class NullChannel:
    """Drops every message (a rank without a kernel to talk to)."""

    def publish(self, message: DataMessage) -> None:
        pass


def on_control(msg_type: str, handle: Callable[[dict[str, Any]], dict[str, Any] | None] | None) -> bool:
    """Call ``handle(content)`` on the engine's control thread for each ``msg_type`` message the kernel sends
    (each is acknowledged as ``<msg_type>_ack``, with what ``handle`` returned); ``handle`` None stops. False
    where this process is no engine."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return False
    if handle is None:
        kernel.control_handlers.pop(msg_type, None)
        return True

    def receive(stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        answer = handle(parent["content"]) or {}
        kernel.session.send(stream, msg_type + "_ack", {**answer, "status": "ok"}, parent, ident=ident)

    kernel.control_handlers[msg_type] = receive
    return True
