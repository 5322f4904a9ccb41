"""Launchers: how the ranks are started, watched and ended (:class:`RankLauncher`)."""

from .api import RankDeath, RankLauncher

__all__ = ["RankDeath", "RankLauncher"]
