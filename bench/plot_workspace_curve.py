"""Draws the linear cross-entropy's time-against-workspace curve as an SVG (no plotting
library needed): one line per shape, time as a multiple of the shape's three-GEMM time,
budget on a log2 axis.

  python3 bench/plot_workspace_curve.py lce.json bench/plots/lce_workspace_curve.svg

lce.json is what `bench/linear_cross_entropy --json=PATH` writes (one JSON object a shape).
"""
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def main(src, dst):
    shapes = [json.loads(line) for line in open(src) if line.strip()]
    width, height, left, right, top, bottom = 640, 400, 60, 190, 30, 50
    budgets = sorted({point["budget_bytes"] for s in shapes for point in s["curve"]})
    ratios = [p["ms"] / s["gemms_3_ms"] for s in shapes for p in s["curve"]]
    x_lo, x_hi = math.log2(budgets[0]), math.log2(budgets[-1])
    y_lo, y_hi = 1.0, math.ceil(max(ratios) * 2) / 2

    def x(budget):
        return left + (math.log2(budget) - x_lo) / (x_hi - x_lo) * (width - left - right)

    def y(ratio):
        return height - bottom - (ratio - y_lo) / (y_hi - y_lo) * (height - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="13">Fused linear cross-entropy on {shapes[0]["device"]}: time / three-GEMM time</text>']
    for budget in budgets:
        out.append(f'<line x1="{x(budget):.1f}" y1="{top}" x2="{x(budget):.1f}" y2="{height - bottom}" stroke="#ddd"/>')
        label = f"{budget / 2**30:g} GiB" if budget >= 2**30 else f"{budget / 2**20:g} MiB"
        out.append(f'<text x="{x(budget):.1f}" y="{height - bottom + 15}" text-anchor="middle">{label}</text>')
    ratio = y_lo
    while ratio <= y_hi + 1e-9:
        out.append(f'<line x1="{left}" y1="{y(ratio):.1f}" x2="{width - right}" y2="{y(ratio):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(ratio) + 4:.1f}" text-anchor="end">{ratio:.1f}x</text>')
        ratio += 0.5
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 12}" text-anchor="middle">max_workspace_bytes</text>')
    for i, shape in enumerate(shapes):
        color = COLORS[i % len(COLORS)]
        points = " ".join(f"{x(p['budget_bytes']):.1f},{y(p['ms'] / shape['gemms_3_ms']):.1f}" for p in shape["curve"])
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        for p in shape["curve"]:
            out.append(f'<circle cx="{x(p["budget_bytes"]):.1f}" cy="{y(p["ms"] / shape["gemms_3_ms"]):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{width - right + 10}" y="{top + 16 * i + 10}" fill="{color}">{shape["N"]}x{shape["H"]}x{shape["V"]}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
