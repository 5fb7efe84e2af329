"""Turns the metrics file of examples/train_lm (--metrics=PATH, JSON lines with step, loss,
val_loss, tokens_per_s, ...; loss is null on the step-0 line) into an SVG loss curve with
labelled axes (no plotting library needed).

  python3 examples/plot_loss.py metrics.jsonl loss.svg ["title"]
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from svg_chart import line_chart  # noqa: E402


def main(src, dst, title="train_lm: loss"):
    rows = [json.loads(line) for line in open(src) if line.strip()]
    if not rows:
        sys.exit(f"{src}: no metrics")
    train = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    losses = [v for _, v in train + val]
    if not losses:
        sys.exit(f"{src}: no losses")
    lo, hi = math.floor(min(losses)), math.ceil(max(losses))
    steps = [s for s, _ in train + val]
    # A round tick spacing (1, 2 or 5 times a power of ten), about five ticks.
    raw = max(1, (max(steps) - min(steps)) / 5)
    power = 10 ** math.floor(math.log10(raw))
    step_tick = int(min((m * power for m in (1, 2, 5, 10) if m * power >= raw)))
    x_ticks = [(s, str(s)) for s in range(0, max(steps) + 1, step_tick)]
    y_ticks = [(v, str(v)) for v in range(lo, hi + 1)]
    series = ([("train loss", train)] if train else []) + \
        ([("validation loss", val)] if val else [])
    open(dst, "w").write(line_chart(title, series, x_ticks, y_ticks, x_label="optimizer step",
                                    y_label="cross-entropy loss (nats per token)",
                                    markers=False))


if __name__ == "__main__":
    main(*sys.argv[1:])
