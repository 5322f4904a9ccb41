"""Backends behind one interface (:class:`Backend`), found by name in a registry."""

from .base import Backend, CommTimer, RankContext, available_backends, get_backend, register_backend
from .ddp import DDPBackend

register_backend("ddp", DDPBackend)

__all__ = ["Backend", "CommTimer", "RankContext", "available_backends", "get_backend", "register_backend", "DDPBackend"]
