"""How a rank's data messages travel in ipyparallel's ``data_pub``: one pickle each.

The message types are in :mod:`jdist.protocol`; this is their encoding. The records of a
``records`` or ``cell_end`` message travel as columns (a :class:`jdist.metrics.store.RecordBatch`:
one numpy array per field), which the kernel adds to a run without walking a dict per record; a
batch is a sequence of records, so a reader that iterates it still gets dicts.
"""

from __future__ import annotations

import pickle
from typing import Any

#: The message kinds whose records travel as columns.
COLUMNAR = ("records", "cell_end")


def encode_data(message: Any) -> bytes:
    """A rank's message as it travels in ``data_pub``: one pickle (ipyparallel would otherwise
    walk every record's every value on the rank and again in the kernel).

    >>> decode_data(encode_data({"kind": "progress", "cell": 1}))
    {'kind': 'progress', 'cell': 1}
    >>> decode_data(encode_data({"kind": "records", "cell": 1, "records": [{"rank": 0, "seq": 0, "step": 0}]}))
    {'kind': 'records', 'cell': 1, 'records': RecordBatch(1 records: rank, seq, step)}
    """
    if isinstance(message, dict) and message.get("kind") in COLUMNAR and isinstance(message.get("records"), list):
        from jdist.metrics.store import RecordBatch

        try:
            message = {**message, "records": RecordBatch.from_records(message["records"])}
        except (TypeError, ValueError, OverflowError):  # a field numpy cannot hold: as dicts
            pass
    return pickle.dumps(message, protocol=5)


def decode_data(payload: Any) -> Any:
    """The message :func:`encode_data` made (from the ranks of this cluster, which ipyparallel
    already trusts with pickles: its messages are signed)."""
    return pickle.loads(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else payload
