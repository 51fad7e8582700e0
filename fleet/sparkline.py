"""Sparklines: a series drawn as a small inline SVG, one ``<path>``, no script,
served with the page (the console takes nothing from other origins). The rack
page draws each node's last hour of temperature and power with it.

Pure: points in, markup out. The x axis is time, the hour up to the last point,
so a node that stopped reporting shows its line ending early; the y axis spans
the series' own range (a flat line sits in the middle). A missing value breaks
the line."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, PAD = 96, 22, 2.0
SPAN_S = 3600.0


def sparkline(
    points: Sequence[Sequence[float | None]],
    column: int,
    *,
    label: str,
    unit: str,
    span_s: float = SPAN_S,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """An ``<svg>`` of ``points[i][column]`` against ``points[i][0]`` (epoch
    seconds), with a ``<title>`` naming ``label`` and its range in ``unit``;
    '' when no point has a value."""
    values = [(float(p[0]), float(v)) for p in points if (v := p[column]) is not None and p[0] is not None]
    if not values:
        return ""
    end = values[-1][0]
    start = end - span_s
    low, high = min(v for _, v in values), max(v for _, v in values)

    def xy(at: float, v: float) -> str:
        x = PAD + (width - 2 * PAD) * max(0.0, at - start) / span_s
        y = height / 2 if high == low else PAD + (height - 2 * PAD) * (high - v) / (high - low)
        return f"{x:.1f},{y:.1f}"

    # One path; a point without a value starts a new piece of it.
    parts, pen_down = [], False
    for p in points:
        v = p[column]
        if v is None or p[0] is None or float(p[0]) < start:
            pen_down = False
            continue
        parts.append(("L" if pen_down else "M") + xy(float(p[0]), float(v)))
        pen_down = True
    last_x, last_y = xy(*values[-1]).split(",")
    title = f"{label}, last hour: {low:g} to {high:g} {unit}, now {values[-1][1]:g} {unit}"
    return (
        f'<svg class="sparkline" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{escape(title)}" data-testid="sparkline" data-points="{len(values)}">'
        f"<title>{escape(title)}</title>"
        f'<path d="{" ".join(parts)}"/>'
        f'<circle cx="{last_x}" cy="{last_y}" r="1.8"/></svg>'
    )
