"""How a rank's data messages travel in ipyparallel's ``data_pub``: one pickle each.

The message types are in :mod:`jdist.protocol`; this is their encoding.
"""

from __future__ import annotations

import pickle
from typing import Any


def encode_data(message: Any) -> bytes:
    """A rank's message as it travels in ``data_pub``: one pickle (ipyparallel would otherwise
    walk every record's every value on the rank and again in the kernel).

    >>> decode_data(encode_data({"kind": "progress", "cell": 1}))
    {'kind': 'progress', 'cell': 1}
    """
    return pickle.dumps(message, protocol=5)


def decode_data(payload: Any) -> Any:
    """The message :func:`encode_data` made (from the ranks of this cluster, which ipyparallel
    already trusts with pickles: its messages are signed)."""
    return pickle.loads(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else payload
