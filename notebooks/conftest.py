"""nbval runs these notebooks in make test (each in its own kernel). notebooks/12-ray-train.ipynb
follows tests/test_ray.py, which leaves its local Ray up for it (``RAY_ADDRESS``): stopped here
after the notebook's last cell."""

from __future__ import annotations

import os
import sys

import pytest

RAY_NOTEBOOK = "12-ray-train.ipynb"


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if RAY_NOTEBOOK not in item.nodeid or (nextitem is not None and RAY_NOTEBOOK in nextitem.nodeid):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # the Ray tests/test_ray.py started in this process
        address = ray.get_runtime_context().gcs_address
        ray.shutdown()
        if os.environ.get("RAY_ADDRESS") == address:
            del os.environ["RAY_ADDRESS"]
