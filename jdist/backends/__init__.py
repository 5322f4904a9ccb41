"""Backends behind one interface (:class:`Backend`), found by name in a registry."""

from .base import Backend, CommTimer, RankContext, available_backends, get_backend, register_backend
from .ddp import DDPBackend
from .fsdp import FSDPBackend
from .horovod import HorovodBackend

register_backend("ddp", DDPBackend)
register_backend("fsdp", FSDPBackend)
register_backend("horovod", HorovodBackend)

__all__ = [
    "Backend",
    "CommTimer",
    "RankContext",
    "available_backends",
    "get_backend",
    "register_backend",
    "DDPBackend",
    "FSDPBackend",
    "HorovodBackend",
]
