"""The notebook dashboard: the live widget while a cell runs, drawn by the browser
(:mod:`~jdist.kernel.dashboard.widget`), and the static SVG that replaces it
(:mod:`~jdist.kernel.dashboard.static`), both drawing the panels of :mod:`jdist.metrics.panels`."""

from .static import render_svg, static_bundle
from .widget import Dashboard, charts_lib, preload

__all__ = ["Dashboard", "charts_lib", "preload", "render_svg", "static_bundle"]
