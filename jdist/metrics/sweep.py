"""A sweep's view as plain HTML and SVG: the slot timeline, the trials' curves, the best value so far and
parallel coordinates. Pure functions of the trials (no widget, no JavaScript), so the view the kernel
redraws during ``jdist.tune`` is also what the saved notebook keeps.

>>> spans = [(0, 0, 0.0, 1.0, "COMPLETE"), (1, 1, 0.0, 0.6, "PRUNED"), (1, 2, 0.7, None, "RUNNING")]
>>> "<svg" in timeline_svg(spans, slots=2, now=1.2)
True
"""

from __future__ import annotations

import html
import math
from typing import Any, Sequence

#: Trial state -> colour, in every panel.
COLOURS = {"COMPLETE": "#2e7d32", "PRUNED": "#ef6c00", "FAIL": "#c62828", "RUNNING": "#1565c0",
           "QUEUED": "#9e9e9e", "INTERRUPTED": "#6d4c41", "WAITING": "#9e9e9e"}
FONT = "font-family='sans-serif' font-size='10'"

#: (slot, trial, start, end or None while running, state)
Span = tuple[int, int, float, "float | None", str]


def timeline_svg(spans: Sequence[Span], slots: int, now: float, width: int = 640, row: int = 16) -> str:
    """Which slot ran which trial when: one row per slot, one bar per trial (its state's colour); the
    gaps between bars are the slots' idle time."""
    if not spans:
        return ""
    t0 = min(s[2] for s in spans)
    t1 = max([now, *(s[3] for s in spans if s[3] is not None)])
    left, span = 44, max(t1 - t0, 1e-9)
    scale = (width - left - 8) / span
    height = slots * row + 18
    parts = [f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"]
    for slot in range(slots):
        y = slot * row
        parts.append(f"<text x='2' y='{y + row - 4}' {FONT}>slot {slot}</text>")
    for slot, trial, start, end, state in spans:
        x = left + (start - t0) * scale
        w = max(((end if end is not None else now) - start) * scale, 1.0)
        parts.append(f"<rect x='{x:.1f}' y='{slot * row + 2}' width='{w:.1f}' height='{row - 4}' "
                     f"fill='{COLOURS.get(state, '#757575')}'><title>trial {trial}: {state.lower()}, "
                     f"{(end if end is not None else now) - start:.2f} s</title></rect>")
    parts.append(f"<text x='{left}' y='{height - 4}' {FONT}>0 s</text>"
                 f"<text x='{width - 8}' y='{height - 4}' text-anchor='end' {FONT}>{span:.1f} s</text></svg>")
    return "".join(parts)


def _scale(values: Sequence[float], lo_px: float, hi_px: float) -> tuple[float, float, Any]:
    finite = [v for v in values if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi, lambda v: hi_px - (v - lo) / (hi - lo) * (hi_px - lo_px)


def curves_svg(curves: dict[int, tuple[str, Sequence[tuple[float, float]]]], metric: str, width: int = 320,
               height: int = 170) -> str:
    """Each trial's reported values by step (trial -> (state, [(step, value)])), in its state's colour;
    the running trials drawn last, thicker."""
    points = [p for _, pts in curves.values() for p in pts]
    if not points:
        return ""
    x_lo, x_hi = min(p[0] for p in points), max(p[0] for p in points)
    x_span = max(x_hi - x_lo, 1e-9)
    y_lo, y_hi, y = _scale([p[1] for p in points], 14, height - 16)
    left, right = 40, width - 6
    parts = [f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>",
             f"<text x='{left}' y='10' {FONT}>{html.escape(metric)} by step</text>",
             f"<text x='2' y='18' {FONT}>{y_hi:.3g}</text><text x='2' y='{height - 16}' {FONT}>{y_lo:.3g}</text>",
             f"<text x='{left}' y='{height - 3}' {FONT}>{x_lo:g}</text>"
             f"<text x='{right}' y='{height - 3}' text-anchor='end' {FONT}>{x_hi:g}</text>"]
    order = sorted(curves.items(), key=lambda kv: kv[1][0] == "RUNNING")
    for trial, (state, pts) in order:
        xy = " ".join(f"{left + (s - x_lo) / x_span * (right - left):.1f},{y(v):.1f}"
                      for s, v in sorted(pts) if math.isfinite(v))
        stroke = 2.0 if state == "RUNNING" else 1.0
        parts.append(f"<polyline points='{xy}' fill='none' stroke='{COLOURS.get(state, '#757575')}' "
                     f"stroke-width='{stroke}' opacity='0.8'><title>trial {trial} ({state.lower()})</title></polyline>")
    parts.append("</svg>")
    return "".join(parts)


def best_svg(values: Sequence[tuple[int, float]], direction: str, width: int = 320, height: int = 170) -> str:
    """The completed trials' values by trial number (dots) and the best so far (a step line)."""
    values = [(n, v) for n, v in values if math.isfinite(v)]
    if not values:
        return ""
    n_lo, n_hi = min(n for n, _ in values), max(n for n, _ in values)
    n_span = max(n_hi - n_lo, 1)
    y_lo, y_hi, y = _scale([v for _, v in values], 14, height - 16)
    left, right = 40, width - 6
    x = lambda n: left + (n - n_lo) / n_span * (right - left)  # noqa: E731
    better = min if direction == "minimize" else max
    best, line = None, []
    for n, v in sorted(values):
        best = v if best is None else better(best, v)
        line.append(f"{x(n):.1f},{y(best):.1f}")
    parts = [f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>",
             f"<text x='{left}' y='10' {FONT}>value by trial, best so far ({direction})</text>",
             f"<text x='2' y='18' {FONT}>{y_hi:.3g}</text><text x='2' y='{height - 16}' {FONT}>{y_lo:.3g}</text>",
             f"<polyline points='{' '.join(line)}' fill='none' stroke='{COLOURS['COMPLETE']}' stroke-width='2'/>"]
    parts += [f"<circle cx='{x(n):.1f}' cy='{y(v):.1f}' r='2.5' fill='#555'><title>trial {n}: {v:.6g}</title></circle>"
              for n, v in values]
    parts.append("</svg>")
    return "".join(parts)


def parallel_svg(rows: Sequence[tuple[dict[str, Any], float]], direction: str, width: int = 640,
                 height: int = 190) -> str:
    """Parallel coordinates of the completed trials: one axis per parameter and one for the value; each
    trial a line, darker the better its value. Categorical parameters get evenly spaced ticks."""
    rows = [(p, v) for p, v in rows if math.isfinite(v)]
    names = sorted({k for p, _ in rows for k in p})
    if not rows or not names:
        return ""
    axes = [*names, "value"]
    top, bottom = 22, height - 22
    xs = [30 + i * (width - 60) / max(len(axes) - 1, 1) for i in range(len(axes))]
    scales = {}
    for name in axes:
        raw = [v for _, v in rows] if name == "value" else [p.get(name) for p, _ in rows]
        if all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in raw if r is not None):
            nums = [float(r) for r in raw if r is not None]
            log = name != "value" and min(nums) > 0 and max(nums) / min(nums) > 100
            f = (lambda r: math.log10(r)) if log else float
            lo, hi, y = _scale([f(r) for r in nums], top, bottom)
            scales[name] = (lambda r, f=f, y=y: y(f(r)), f"{lo if not log else 10 ** lo:.3g}",
                            f"{hi if not log else 10 ** hi:.3g}")
        else:
            cats = sorted({str(r) for r in raw if r is not None})
            pos = {c: top + (i + 0.5) * (bottom - top) / len(cats) for i, c in enumerate(cats)}
            scales[name] = (lambda r, pos=pos: pos[str(r)], cats[-1], cats[0])  # cats[0] at the top
    values = [v for _, v in rows]
    lo, hi = min(values), max(values)
    parts = [f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"]
    for params, value in sorted(rows, key=lambda r: r[1], reverse=direction == "minimize"):
        good = 0.5 if hi == lo else (value - lo) / (hi - lo)
        good = 1 - good if direction == "minimize" else good
        pts = [f"{x:.1f},{scales[n][0](value if n == 'value' else params[n]):.1f}"
               for x, n in zip(xs, axes) if n == "value" or params.get(n) is not None]
        parts.append(f"<polyline points='{' '.join(pts)}' fill='none' stroke='rgb({int(200 - 180 * good)},"
                     f"{int(200 - 120 * good)},{int(230 - 30 * good)})' stroke-width='{1 + good:.1f}'/>")
    for x, name in zip(xs, axes):
        fn, lo_label, hi_label = scales[name]
        parts.append(f"<line x1='{x:.1f}' y1='{top}' x2='{x:.1f}' y2='{bottom}' stroke='#333'/>"
                     f"<text x='{x:.1f}' y='12' text-anchor='middle' {FONT}>{html.escape(name)}</text>"
                     f"<text x='{x:.1f}' y='{height - 10}' text-anchor='middle' {FONT}>{html.escape(lo_label)}</text>"
                     f"<text x='{x:.1f}' y='{top - 2}' text-anchor='middle' {FONT}>{html.escape(hi_label)}</text>")
    parts.append("</svg>")
    return "".join(parts)
