"""Draws the linear cross-entropy's time-against-workspace curve as an SVG (no plotting
library needed): one line per shape, time as a multiple of the shape's three-GEMM time,
budget on a log2 axis.

  python3 bench/plot_workspace_curve.py lce.json bench/plots/lce_workspace_curve.svg

lce.json is what `bench/linear_cross_entropy --json=PATH` writes (one JSON object a shape).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from svg_chart import line_chart  # noqa: E402


def main(src, dst):
    shapes = [json.loads(line) for line in open(src) if line.strip()]
    budgets = sorted({point["budget_bytes"] for s in shapes for point in s["curve"]})
    ratios = [p["ms"] / s["gemms_3_ms"] for s in shapes for p in s["curve"]]
    top = math.ceil(max(ratios) * 2) / 2
    x_ticks = [(b, f"{b / 2**30:g} GiB" if b >= 2**30 else f"{b / 2**20:g} MiB") for b in budgets]
    y_ticks = [(1.0 + 0.5 * i, f"{1.0 + 0.5 * i:.1f}x") for i in range(int((top - 1.0) / 0.5) + 1)]
    series = [(f'{s["N"]}x{s["H"]}x{s["V"]}',
               [(p["budget_bytes"], p["ms"] / s["gemms_3_ms"]) for p in s["curve"]]) for s in shapes]
    svg = line_chart(f"Fused linear cross-entropy on {shapes[0]['device']}: time / three-GEMM time",
                     series, x_ticks, y_ticks, x_label="max_workspace_bytes", log_x=True)
    open(dst, "w").write(svg)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
