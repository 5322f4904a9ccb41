"""Asking a cluster's ipyparallel controller about its engines (used by the kernel and the server).

Example:
    >>> engine_states(client)   # doctest: +SKIP
    {0: 'busy', 1: 'idle'}
"""

from __future__ import annotations

import time
from typing import Any


def engine_states(client: Any) -> dict[int, str]:
    """``busy`` or ``idle`` per registered engine id, from the controller's queue status.

    Engines missing from the result are dead (the controller unregistered them). Works with
    any ipyparallel ``Client`` of the cluster: the kernel's own (``%dist status``) or the Jupyter
    server extension's.
    """

    def busy_engines() -> set[int]:
        queue = client.queue_status()
        return {e for e, q in queue.items() if isinstance(q, dict) and (q.get("queue") or q.get("tasks"))}

    busy = busy_engines()
    if busy and not client.outstanding:
        # The controller books a reply slightly after the client got it: ask again once.
        time.sleep(0.1)
        busy = busy_engines()
    return {eid: "busy" if eid in busy else "idle" for eid in client.ids}
