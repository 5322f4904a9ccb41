"""The notebook dashboard: the live widget while a cell runs (:mod:`~jdist.kernel.dashboard.widget`)
and the static PNG that replaces it (:mod:`~jdist.kernel.dashboard.static`), both drawing the
panels of :mod:`jdist.metrics.panels`."""

from .static import render_png, static_bundle, static_figure
from .widget import Dashboard, live_figure, preload

__all__ = ["Dashboard", "live_figure", "preload", "render_png", "static_bundle", "static_figure"]
