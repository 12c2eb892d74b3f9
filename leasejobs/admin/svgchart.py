"""Draw a ``charts.Chart`` as an inline SVG line chart, server-side, with a table fallback.

No script and nothing fetched: the page stays a plain admin page. The SVG
has a ``<title>`` and ``<desc>`` (role ``img``), labelled axes (times on the
database clock shown in the current time zone, values with their unit) and a
legend; the same numbers follow in a ``<table>`` inside ``<details>`` for
screen readers and for copying.
"""

import math
from datetime import datetime

from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from leasejobs.admin.charts import Chart

WIDTH, HEIGHT = 640, 210
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 26, 44
#: Series colours, in order (readable on the light and the dark admin theme).
COLOURS = ("#2f7ed8", "#d9534f", "#5cb85c", "#f0ad4e", "#8e44ad", "#16a085", "#7f8c8d", "#c0392b")


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= ``value`` (1 for nothing)."""
    if value <= 0 or math.isnan(value):
        return 1.0
    power = float(10 ** math.floor(math.log10(value)))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2g}" if abs(value) < 1 else f"{value:.1f}"


def _clock(t: datetime) -> str:
    return timezone.localtime(t).strftime("%H:%M")


def render(chart: Chart) -> SafeString:
    """The chart's ``<figure>``: SVG, legend and data table."""
    n = len(chart.times)
    values = [v for s in chart.series for v in s.values if v is not None]
    top = nice_ceiling(max(values, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w * i / max(1, n - 1))

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    ident = f"leasejobs-chart-{chart.key}"
    parts = [
        format_html(
            '<svg class="leasejobs-chart" viewBox="0 0 {} {}" role="img" aria-labelledby="{}-title {}-desc">',
            WIDTH,
            HEIGHT,
            ident,
            ident,
        ),
        format_html('<title id="{}-title">{}</title>', ident, chart.title),
        format_html('<desc id="{}-desc">{}</desc>', ident, _summary(chart)),
    ]
    # Horizontal grid and y labels: 0, half, top.
    for v in (0, top / 2, top):
        parts.append(
            format_html(
                '<line class="leasejobs-grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="leasejobs-ylabel" x="{}" y="{}" text-anchor="end">{}</text>',
                LEFT,
                WIDTH - RIGHT,
                round(y(v), 1),
                round(y(v), 1),
                LEFT - 6,
                round(y(v) + 4, 1),
                _number(v),
            )
        )
    # X labels: about six, on bucket starts.
    every = max(1, math.ceil(n / 6))
    for i in range(0, n, every):
        parts.append(
            format_html(
                '<line class="leasejobs-tick" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="leasejobs-xlabel" x="{}" y="{}" text-anchor="middle">{}</text>',
                round(x(i), 1),
                round(x(i), 1),
                round(TOP + plot_h, 1),
                round(TOP + plot_h + 4, 1),
                round(x(i), 1),
                round(TOP + plot_h + 16, 1),
                _clock(chart.times[i]),
            )
        )
    parts.append(
        format_html(
            '<line class="leasejobs-axis" x1="{}" x2="{}" y1="{}" y2="{}"/>'
            '<line class="leasejobs-axis" x1="{}" x2="{}" y1="{}" y2="{}"/>',
            LEFT,
            WIDTH - RIGHT,
            round(TOP + plot_h, 1),
            round(TOP + plot_h, 1),
            LEFT,
            LEFT,
            TOP,
            round(TOP + plot_h, 1),
        )
    )
    parts.append(
        format_html(
            '<text class="leasejobs-axis-title" x="{}" y="{}" text-anchor="middle">time ({})</text>'
            '<text class="leasejobs-axis-title" x="12" y="{}" text-anchor="middle" '
            'transform="rotate(-90 12 {})">{}</text>',
            round(LEFT + plot_w / 2, 1),
            HEIGHT - 6,
            timezone.get_current_timezone_name(),
            round(TOP + plot_h / 2, 1),
            round(TOP + plot_h / 2, 1),
            chart.unit,
        )
    )
    legend_x = LEFT + 4
    for k, s in enumerate(chart.series):
        colour = COLOURS[k % len(COLOURS)]
        for run in _runs(s.values):
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            if len(run) == 1:
                i, v = run[0]
                dot = '<circle cx="{}" cy="{}" r="2" fill="{}"/>'
                parts.append(format_html(dot, round(x(i), 1), round(y(v), 1), colour))
            else:
                parts.append(
                    format_html(
                        '<polyline class="leasejobs-series" points="{}" fill="none" stroke="{}" '
                        'stroke-width="1.6"/>',
                        points,
                        colour,
                    )
                )
        parts.append(
            format_html(
                '<rect x="{}" y="8" width="10" height="10" fill="{}"/>'
                '<text class="leasejobs-legend" x="{}" y="17">{}</text>',
                legend_x,
                colour,
                legend_x + 14,
                s.label,
            )
        )
        legend_x += 24 + 7 * len(s.label)
    parts.append(mark_safe("</svg>"))
    return format_html(
        '<figure class="leasejobs-figure" id="{}"><figcaption>{} <span>({})</span></figcaption>{}{}</figure>',
        ident,
        chart.title,
        chart.unit,
        mark_safe("".join(parts)),
        _table(chart),
    )


def _runs(values: list[float | None]) -> list[list[tuple[int, float]]]:
    """Consecutive non-empty points: a bucket with no value breaks the line."""
    runs: list[list[tuple[int, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((i, float(v)))
    return [r for r in runs if r]


def _summary(chart: Chart) -> str:
    parts = []
    for s in chart.series:
        present = [v for v in s.values if v is not None]
        if present:
            parts.append(f"{s.label}: highest {_number(max(present))}, latest {_number(present[-1])}")
        else:
            parts.append(f"{s.label}: no data")
    span = f"{_clock(chart.times[0])} to {_clock(chart.times[-1])}" if chart.times else "no buckets"
    return f"{chart.title} in {chart.unit}, {span}. " + "; ".join(parts) + "."


def _table(chart: Chart) -> SafeString:
    head = "".join(f"<th scope='col'>{escape(s.label)}</th>" for s in chart.series)
    rows = []
    for i, t in enumerate(chart.times):
        cells = "".join(
            "<td>{}</td>".format("" if (v := s.values[i]) is None else escape(_number(v)))
            for s in chart.series
        )
        rows.append(f"<tr><th scope='row'>{escape(_clock(t))}</th>{cells}</tr>")
    return mark_safe(
        f"<details class='leasejobs-chart-table'><summary>{escape(chart.title)}: data table</summary>"
        f"<table><thead><tr><th scope='col'>time</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody>"
        "</table></details>"
    )
