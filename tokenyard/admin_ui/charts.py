"""Stacked bar charts drawn on the server as inline SVG: no JavaScript, no fonts or libraries to
fetch, readable with no network. One bar per day, one colour per series."""

import math
from datetime import date

from markupsafe import Markup, escape

# Okabe-Ito-like palette: distinguishable, also for most colour-blind readers
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#999999")

WIDTH, HEIGHT = 960, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 10, 12, 30


def fmt(v: float, metric: str) -> str:
    if metric == "cost":
        return f"${v:,.2f}" if v >= 1 or v == 0 else f"${v:.4f}"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.0f}"


def nice_ceiling(v: float) -> float:
    """The smallest 1, 2, 4, 6 or 8 × 10^k at or above v: an axis maximum whose quarters (the
    gridlines) are round numbers too."""
    if v <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(v))
    return next(m * power for m in (1, 2, 4, 6, 8, 10) if m * power >= v)


def colours(names: list[str]) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def stacked_bars(
    days: list[date], series: dict[str, dict[date, float]], metric: str, label: str
) -> Markup:
    """Bars of `days`, each stacked by series in the given order (the first at the bottom)."""
    colour = colours(list(series))
    top = nice_ceiling(max((sum(s.get(d, 0.0) for s in series.values()) for d in days), default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(days), 1)
    bar = max(slot * 0.8, 1.0)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i in range(5):  # gridlines and y labels at 0, ¼, ½, ¾, 1 of the axis
        y = TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line class="gridline" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="ylabel" x="{LEFT - 6}" y="{y + 4:.1f}">{fmt(top * i / 4, metric)}</text>'
        )
    every = math.ceil(len(days) / 12)  # at most about a dozen date labels
    for i, day in enumerate(days):
        x = LEFT + i * slot + (slot - bar) / 2
        y = TOP + plot_h
        for name, values in series.items():
            v = values.get(day, 0.0)
            if v <= 0:
                continue
            h = plot_h * v / top
            y -= h
            tip = f"{day.isoformat()} · {name}: {fmt(v, metric)}"
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colour[name]}"><title>{escape(tip)}</title></rect>'
            )
        if i % every == 0:
            parts.append(
                f'<text class="xlabel" x="{x + bar / 2:.1f}" y="{HEIGHT - 10}">'
                f"{day.strftime('%m-%d')}</text>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))
