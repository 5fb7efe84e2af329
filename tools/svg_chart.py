"""A minimal SVG line chart (no plotting library needed), shared by the repository's plotting
scripts: bench/plot_workspace_curve.py and examples/plot_loss.py.

  svg = line_chart("Loss", [("train", [(1, 4.2), (2, 3.9)])], x_ticks=[(1, "1"), (2, "2")],
                   y_ticks=[(3.5, "3.5"), (4.5, "4.5")], x_label="step", y_label="loss")
"""
import math

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def line_chart(title, series, x_ticks, y_ticks, x_label="", log_x=False, markers=True,
               width=640, height=400, y_label=""):
    """series: [(label, [(x, y), ...])]; ticks: [(value, text)] (their range sets the axes);
    x_label under the x axis, y_label up the left side."""
    left, right, top, bottom = 60, 190, 30, 50
    xs = [value for value, _ in x_ticks] + [p[0] for _, points in series for p in points]
    ys = [value for value, _ in y_ticks] + [p[1] for _, points in series for p in points]
    fx = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    x_lo, x_hi = fx(min(xs)), fx(max(xs))
    y_lo, y_hi = min(ys), max(ys)
    x_span = (x_hi - x_lo) or 1.0
    y_span = (y_hi - y_lo) or 1.0

    def x(v):
        return left + (fx(v) - x_lo) / x_span * (width - left - right)

    def y(v):
        return height - bottom - (v - y_lo) / y_span * (height - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="13">{title}</text>']
    for value, text in x_ticks:
        out.append(f'<line x1="{x(value):.1f}" y1="{top}" x2="{x(value):.1f}" '
                   f'y2="{height - bottom}" stroke="#ddd"/>')
        out.append(f'<text x="{x(value):.1f}" y="{height - bottom + 15}" '
                   f'text-anchor="middle">{text}</text>')
    for value, text in y_ticks:
        out.append(f'<line x1="{left}" y1="{y(value):.1f}" x2="{width - right}" '
                   f'y2="{y(value):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{text}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 12}" '
               f'text-anchor="middle">{x_label}</text>')
    if y_label:
        # Rotated a quarter turn about its anchor, left of the tick labels.
        y_mid = (top + height - bottom) / 2
        out.append(f'<text x="14" y="{y_mid}" text-anchor="middle" '
                   f'transform="rotate(-90 14 {y_mid})">{y_label}</text>')
    for i, (label, points) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        if markers:
            for px, py in points:
                out.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{width - right + 10}" y="{top + 16 * i + 10}" '
                   f'fill="{color}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
