"""The kernel-free dashboard: every panel (:func:`jdist.metrics.panels.panels`) drawn as one SVG
image, which replaces the live view at the end of a cell so that a saved notebook shows the
results without a kernel (JupyterLab, GitHub, nbviewer, VS Code all render ``image/svg+xml``).

Plain string building, no plotting library: the whole image takes a few milliseconds, so the
end of a cell costs the kernel next to nothing. Lines longer than
:data:`~jdist.metrics.panels.MAX_POINTS` are thinned as in the live views (a bucket's mean, its
band's min and max). The drawing follows ``labextension/src/charts.ts`` (the browser's charts).
Each chart is a ``<g class="panel" data-panel="<key>">``; each line (one per series)
``data-series`` its name and ``data-points`` its number of points, each bar ``data-value`` its
value (tests read them).

Example:
    >>> from jdist.metrics import Run
    >>> svg = render_svg(Run("x", 1, records=[]))
    >>> svg.startswith("<svg") and svg.count('class="panel"')
    5
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from html import escape
from typing import Any

from jdist.metrics import Run
from jdist.metrics.panels import panels, thin_panel
from jdist.metrics.stats import is_number as _ok
from jdist.protocol import BarPanel, HeatmapPanel, LinePanel, LineSeries, Panel, TablePanel

#: Size of one panel, in SVG pixels; two panels per row.
PANEL_W, PANEL_H = 500, 280
#: A heatmap of at most this many rows (on one host) names each row (a pipeline's stages); a larger one
#: names its first and last.
ROW_LABELS = 12
_MARGIN = {"left": 58, "right": 14, "top": 30, "bottom": 34}
_HEADER = 28
_FONT = 'font-family="sans-serif"'


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [lo, hi] (as ``niceTicks`` in charts.ts).

    >>> nice_ticks(0, 1)
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    """
    if not hi > lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), 10 * mag)
    ticks, v = [], math.ceil(lo / step - 1e-9) * step
    while v <= hi + step * 1e-9:
        ticks.append(0.0 if abs(v) < step * 1e-9 else float(f"{v:.12g}"))
        v += step
    return ticks


def fmt(value: float | None, digits: int = 3) -> str:
    """Short numbers for labels (as ``fmt`` in dom.ts).

    >>> fmt(0.000123), fmt(1234), fmt(0.5)
    ('1.23e-4', '1234', '0.5')
    """
    if value is None or not math.isfinite(value):
        return "–"
    a = abs(value)
    if a != 0 and (a >= 1e5 or a < 1e-3):
        mant, exp = f"{value:.{digits - 1}e}".split("e")
        return f"{mant}e{int(exp)}"
    if float(value).is_integer():
        return str(int(value))
    return f"{float(f'{value:.{digits}g}')}"


def _text(x: float, y: float, s: str, cls: str, anchor: str = "start", size: int = 10, fill: str = "#555",
          weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" fill="{fill}" '
            f'font-weight="{weight}" class="{cls}">{escape(s)}</text>')


class _Frame:
    """One panel's box: title, legend, plot area, y axis."""

    def __init__(self, x0: float, y0: float, title: str, legend: list[tuple[str, str]]) -> None:
        self.parts: list[str] = [_text(x0 + 4, y0 + 16, title, "title", size=12, fill="#222", weight="600")]
        # the legend right of the title, or on its own line when both do not fit (as frame() in charts.ts)
        own_line = len(title) * 7.2 + sum(len(name) * 6.2 + 22 for name, _ in legend) + 16 > PANEL_W
        ly = y0 + (32 if own_line else 16)
        lx = x0 + PANEL_W - _MARGIN["right"]
        for name, color in reversed(legend):
            self.parts.append(_text(lx, ly, name, "legend", anchor="end"))
            lx -= len(name) * 6.2 + 4
            self.parts.append(f'<rect x="{lx - 10:.1f}" y="{ly - 9}" width="10" height="10" fill="{color}"/>')
            lx -= 18
        extra = 16 if own_line else 0
        self.left, self.top = x0 + _MARGIN["left"], y0 + _MARGIN["top"] + extra
        self.width = PANEL_W - _MARGIN["left"] - _MARGIN["right"]
        self.height = PANEL_H - _MARGIN["top"] - _MARGIN["bottom"] - extra

    def y_axis(self, lo: float, hi: float) -> Any:
        ticks = nice_ticks(lo, hi, max(2, int(self.height // 35)))
        y0, y1 = min(lo, ticks[0]), max(hi, ticks[-1])

        def sy(y: float) -> float:
            return self.top + self.height - (y - y0) / ((y1 - y0) or 1) * self.height

        for t in ticks:
            y = sy(t)
            self.parts.append(f'<line x1="{self.left}" x2="{self.left + self.width}" y1="{y:.1f}" y2="{y:.1f}" '
                              'stroke="#e0e0e0"/>')
            self.parts.append(_text(self.left - 6, y + 4, fmt(t), "tick", anchor="end"))
        return sy

    def no_data(self) -> None:
        self.parts.append(_text(self.left + self.width / 2, self.top + self.height / 2, "no data", "nodata",
                                anchor="middle", size=12, fill="#999"))


def _legend(series: list[LineSeries]) -> list[tuple[str, str]]:
    """Each series' name, and "min–max" for a band (as ``lineChart`` in charts.ts)."""
    out = []
    for s in series:
        out.append((s["name"], s["color"]))
        if s["low"] is not None:
            out.append(("min–max", s["color"] + "4d"))
    return out


def _line_panel(p: LinePanel, x0: float, y0: float) -> list[str]:
    series = p["series"]
    f = _Frame(x0, y0, p["title"], _legend(series))
    xs_all = [x for s in series for x in s["x"]]
    values = [v for s in series for v in (s["y"] + (s["low"] or []) + (s["high"] or [])) if _ok(v)]
    if not xs_all or not values:
        f.no_data()
        return f.parts
    sy = f.y_axis(min(values), max(values))
    lo_x, hi_x = min(xs_all), max(xs_all)

    def sx(x: float) -> float:
        return f.left + (x - lo_x) / ((hi_x - lo_x) or 1) * f.width

    for t in nice_ticks(lo_x, hi_x if hi_x != lo_x else lo_x + 1, max(2, int(f.width // 70))):
        if lo_x <= t <= hi_x:
            f.parts.append(_text(sx(t), f.top + f.height + 14, fmt(t, 4), "tick", anchor="middle"))
    f.parts.append(_text(f.left + f.width, f.top + f.height + 28, p["x_title"], "axis", anchor="end"))
    for s in series:
        f.parts += _series(s, sx, sy)
    return f.parts


def _series(s: LineSeries, sx: Any, sy: Any) -> list[str]:
    """One series: its band (runs of points where both ends exist), then its line."""
    parts: list[str] = []
    xs = s["x"]
    if s["low"] is not None and s["high"] is not None:
        run: list[int] = []
        for i in range(len(xs) + 1):
            if i < len(xs) and _ok(s["low"][i]) and _ok(s["high"][i]):
                run.append(i)
                continue
            if run:
                up = [f"{sx(xs[j]):.1f},{sy(s['high'][j]):.1f}" for j in run]
                down = [f"{sx(xs[j]):.1f},{sy(s['low'][j]):.1f}" for j in reversed(run)]
                parts.append(f'<path d="M{"L".join(up)}L{"L".join(down)}Z" fill="{s["color"]}" '
                             'fill-opacity="0.25" stroke="none" class="band"/>')
            run = []
    d, pen = [], False
    for x, y in zip(xs, s["y"]):
        if not _ok(y):
            pen = False
            continue
        d.append(f"{'L' if pen else 'M'}{sx(x):.1f},{sy(y):.1f}")
        pen = True
    points = sum(1 for y in s["y"] if _ok(y))
    parts.append(f'<path d="{"".join(d)}" fill="none" stroke="{s["color"]}" stroke-width="1.8" class="line" '
                 f'data-series="{escape(s["name"])}" data-points="{points}"/>')
    return parts


def label_every(categories: list[str], width: float) -> int:
    """Label every k-th bar so the labels do not overlap (as ``labelEvery`` in charts.ts).

    >>> label_every(["rank 1"] * 4, 400), label_every(["node00"] * 64, 400)
    (1, 8)
    """
    longest = max((len(c) for c in categories), default=0) * 6.2 + 8
    return max(1, math.ceil(len(categories) * longest / max(width, 1)))


def _bar_panel(p: BarPanel, x0: float, y0: float) -> list[str]:
    f = _Frame(x0, y0, p["title"], [(s["name"], s["color"]) for s in p["series"]])
    cats, series = p["categories"], p["series"]

    def val(s: Any, i: int) -> float:
        v = s["values"][i]
        return v if _ok(v) else 0.0

    totals = [sum(val(s, i) for s in series) if p["stacked"] else max([val(s, i) for s in series] or [0.0])
              for i in range(len(cats))]
    top = max(totals or [0.0])
    if not cats or not top > 0:
        f.no_data()
        return f.parts
    sy = f.y_axis(0, top * 1.08)
    band = f.width / len(cats)
    bar_w = min(60, band * 0.7)
    every = label_every(cats, f.width)
    for i, cat in enumerate(cats):
        cx = f.left + band * (i + 0.5)
        if i % every == 0:
            f.parts.append(_text(cx, f.top + f.height + 14, cat, "tick", anchor="middle"))
        base = 0.0
        for j, s in enumerate(series):
            v = s["values"][i]
            if not _ok(v):
                continue
            w = bar_w if p["stacked"] else bar_w / len(series)
            left = cx - bar_w / 2 + (0 if p["stacked"] else j * w)
            y_from = base if p["stacked"] else 0.0
            bar_width = max(1.0, w - (0 if p["stacked"] else 2))
            f.parts.append(f'<rect x="{left:.1f}" y="{sy(y_from + v):.1f}" width="{bar_width:.1f}" '
                           f'height="{max(0.0, sy(y_from) - sy(y_from + v)):.1f}" fill="{s["color"]}" class="bar" '
                           f'data-series="{escape(s["name"])}" data-category="{escape(cat)}" data-value="{v:.6g}"/>')
            if s["labels"]:
                label = f"{v * 1024:.1f} KiB" if p["unit"] == "MiB" and v < 1 else f"{v:.1f}"
                f.parts.append(_text(left + w / 2, sy(y_from + v) - 3, label, "barlabel", anchor="middle",
                                     fill=s["color"]))
            if p["stacked"]:
                base += v
    return f.parts


def palette(colors: list[str]) -> list[bytes]:
    """A heatmap's 256 colours (RGB): byte 0..254 along ``colors`` (evenly spaced stops), 255 light grey."""
    stops = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in colors]
    table = []
    for b in range(255):
        at = b / 254 * (len(stops) - 1)
        i = min(int(at), len(stops) - 2)
        t = at - i
        table.append(bytes(round(stops[i][k] + (stops[i + 1][k] - stops[i][k]) * t) for k in range(3)))
    return table + [b"\xee\xee\xee"]


def pool_rows(cells: bytes, rows: int, cols: int, most: int) -> tuple[int, bytes]:
    """At most ``most`` rows of a heatmap's cells (a row per rank), for an image not that many pixels
    high: each pooled cell is the one of its rows farthest from the median of all cells, so a rank
    that stands out (slower, or communicating less) still shows. As ``poolRows`` in charts.ts.

    >>> pool_rows(bytes([10, 10, 200, 10, 10, 10]), 6, 1, 3)
    (3, b'\\n\\xc8\\n')
    """
    if rows <= most:
        return rows, cells
    per = math.ceil(rows / most)
    valid = sorted(b for b in cells if b != 255)
    median = valid[len(valid) // 2] if valid else 0
    out = bytearray()
    for first in range(0, rows, per):
        for c in range(cols):
            pool = [cells[r * cols + c] for r in range(first, min(first + per, rows))]
            pool = [b for b in pool if b != 255]
            out.append(max(pool, key=lambda b: abs(b - median)) if pool else 255)
    return math.ceil(rows / per), bytes(out)


def heat_rgb(panel: HeatmapPanel, most_rows: int = 10**9) -> tuple[int, int, bytes]:
    """The heatmap's cells as RGB pixels, a row per rank (pooled to ``most_rows``): ``(width, height, bytes)``."""
    table = palette(panel["colors"])
    width = len(panel["x"])
    height, cells = pool_rows(base64.b64decode(panel["cells"]), len(panel["rows"]), width, most_rows)
    return width, height, b"".join(table[c] for c in cells)


def png(width: int, height: int, rgb: bytes) -> bytes:
    """A PNG image of ``rgb`` pixels (3 bytes each, row by row): the standard library only.

    >>> png(1, 1, b"\\x00\\x00\\x00")[:8]
    b'\\x89PNG\\r\\n\\x1a\\n'
    """
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + rgb[y * width * 3:(y + 1) * width * 3] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _heat_panel(p: HeatmapPanel, x0: float, y0: float) -> list[str]:
    """The heatmap as one pixelated image (a pixel per rank and column), host groups on the left (or, up to
    :data:`ROW_LABELS` rows on one host, each row's name); the colour scale on the right, or the legend of
    its categories (``legend``: the pipeline's actions)."""
    legend = [tuple(item) for item in p.get("legend") or []]
    f = _Frame(x0, y0, p["title"], legend)  # type: ignore[arg-type]
    if not p["x"] or not p["rows"] or p["low"] is None:
        f.no_data()
        return f.parts
    width, height, rgb = heat_rgb(p, int(f.height))
    data = base64.b64encode(png(width, height, rgb)).decode()
    left, plot_w = f.left + 20, f.width - 70
    rows = len(p["rows"])
    f.parts.append(f'<image x="{left:.1f}" y="{f.top:.1f}" width="{plot_w:.1f}" height="{f.height:.1f}" '
                   f'preserveAspectRatio="none" style="image-rendering:pixelated" class="heat" '
                   f'data-rows="{rows}" data-columns="{width}" href="data:image/png;base64,{data}"/>')
    row_h = f.height / rows
    groups = p["groups"] or ([(name, i, 1) for i, name in enumerate(p["rows"])] if rows <= ROW_LABELS else
                             [(f"r{p['rows'][0][1:]}–{p['rows'][-1][1:]}", 0, rows)])
    last_label = -math.inf
    for host, first, count in groups:
        y_mid = f.top + (first + count / 2) * row_h
        label = host
        if y_mid - last_label >= 11:  # labels that would overlap are left out
            f.parts.append(_text(left - 4, y_mid + 3, label, "tick", anchor="end", size=9))
            last_label = y_mid
        if first and count * row_h >= 3:
            f.parts.append(f'<line x1="{left:.1f}" x2="{left + plot_w:.1f}" y1="{f.top + first * row_h:.1f}" '
                           f'y2="{f.top + first * row_h:.1f}" stroke="white"/>')
    xs = p["x"]
    for i in sorted({0, len(xs) // 2, len(xs) - 1}):
        f.parts.append(_text(left + (i + 0.5) / len(xs) * plot_w, f.top + f.height + 14, fmt(xs[i], 4), "tick",
                             anchor="middle"))
    f.parts.append(_text(left + plot_w, f.top + f.height + 28, p["x_title"], "axis", anchor="end"))
    if legend:
        return f.parts
    # the colour scale, low at the bottom
    sx = left + plot_w + 8
    steps = 20
    table = palette(p["colors"])
    for k in range(steps):
        color = "#" + table[round(k / (steps - 1) * 254)].hex()
        f.parts.append(f'<rect x="{sx:.1f}" y="{f.top + f.height * (1 - (k + 1) / steps):.1f}" width="10" '
                       f'height="{f.height / steps + 0.5:.1f}" fill="{color}"/>')
    unit = (lambda v: f"{v * 1e3:.3g} ms") if p["unit"] == "s" else (lambda v: f"{v:.0%}" if not p["unit"] else fmt(v))
    f.parts.append(_text(sx + 12, f.top + 8, unit(p["high"]), "tick", size=9))
    f.parts.append(_text(sx + 12, f.top + f.height, unit(p["low"]), "tick", size=9))
    return f.parts


def _table_panel(p: TablePanel, x0: float, y0: float) -> list[str]:
    """Rows of text under the column titles, the note below."""
    f = _Frame(x0, y0, p["title"], [])
    if not p["rows"]:
        f.no_data()
        return f.parts
    left = x0 + 10
    col_w = (PANEL_W - 20) / len(p["columns"])
    y = f.top + 4
    for j, title in enumerate(p["columns"]):
        f.parts.append(_text(left + j * col_w, y, title, "colhead", weight="600", fill="#222"))
    for row in p["rows"]:
        y += 20
        f.parts.append(f'<g class="row" data-rank="{escape(row[0])}">')
        for j, cell in enumerate(row):
            f.parts.append(_text(left + j * col_w, y, cell, "cell", size=11, fill="#222"))
        f.parts.append("</g>")
    if p["note"]:
        f.parts.append(_text(left, y0 + PANEL_H - 12, p["note"], "note", size=10))
    return f.parts


def render_svg(run: Run, drawn: list[Panel] | None = None) -> str:
    """Every panel of ``run`` (or the ``drawn`` panels) in one SVG image, two per row."""
    drawn = panels(run) if drawn is None else drawn
    rows = max(1, math.ceil(len(drawn) / 2))
    width, height = 2 * PANEL_W, _HEADER + rows * PANEL_H
    title = f"jdist run {run.run_id}: {run.status}, {run.world_size} ranks"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" {_FONT} role="img" aria-label="{escape(title)}">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             _text(width / 2, 18, title, "suptitle", anchor="middle", size=13, fill="#222", weight="600")]
    for i, panel in enumerate(drawn):
        x0, y0 = (i % 2) * PANEL_W, _HEADER + (i // 2) * PANEL_H
        kind = panel["kind"]
        body = (_line_panel(thin_panel(panel), x0, y0) if kind == "line" else  # type: ignore[arg-type]
                _heat_panel(panel, x0, y0) if kind == "heatmap" else  # type: ignore[arg-type]
                _table_panel(panel, x0, y0) if kind == "table" else _bar_panel(panel, x0, y0))  # type: ignore[arg-type]
        parts.append(f'<g class="panel" data-panel="{escape(panel["key"])}" data-title="{escape(panel["title"])}">')
        parts += body
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def static_bundle(run: Run) -> dict[str, Any]:
    """The kernel-free figure of ``run``: ``image/svg+xml`` with ``text/plain`` (the summary) as fallback.

    Frontends show the image; the dashboard prints the summary text below it, so the saved
    notebook holds the image once and the text once.

    >>> sorted(static_bundle(Run("x", 1, records=[])))
    ['image/svg+xml', 'text/plain']
    """
    return {"text/plain": run.summary(), "image/svg+xml": render_svg(run)}
