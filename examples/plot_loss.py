"""Turns the metrics file of examples/train_lm (--metrics=PATH, JSON lines with step, loss,
val_loss, val_accuracy, tokens_per_s, ...; loss is null on the step-0 line) into an SVG loss
curve with labelled axes (no plotting library needed), and below it, when the file has
validation accuracies, a second panel with the validation accuracy over the same steps.

  python3 examples/plot_loss.py metrics.jsonl loss.svg ["title"]
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from svg_chart import line_chart  # noqa: E402

PANEL_HEIGHT = 400  # line_chart's default height


def step_ticks(steps):
    # A round tick spacing (1, 2 or 5 times a power of ten), about five ticks.
    raw = max(1, (max(steps) - min(steps)) / 5)
    power = 10 ** math.floor(math.log10(raw))
    step_tick = int(min((m * power for m in (1, 2, 5, 10) if m * power >= raw)))
    return [(s, str(s)) for s in range(0, max(steps) + 1, step_tick)]


def main(src, dst, title="train_lm: loss"):
    rows = [json.loads(line) for line in open(src) if line.strip()]
    if not rows:
        sys.exit(f"{src}: no metrics")
    train = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    # Older metrics files have no val_accuracy: the loss panel alone.
    accuracy = [(r["step"], 100 * r["val_accuracy"]) for r in rows
                if r.get("val_accuracy") is not None]
    losses = [v for _, v in train + val]
    if not losses:
        sys.exit(f"{src}: no losses")
    lo, hi = math.floor(min(losses)), math.ceil(max(losses))
    # Both panels share the steps' axis.
    x_ticks = step_ticks([s for s, _ in train + val + accuracy])
    y_ticks = [(v, str(v)) for v in range(lo, hi + 1)]
    series = ([("train loss", train)] if train else []) + \
        ([("validation loss", val)] if val else [])
    loss_panel = line_chart(title, series, x_ticks, y_ticks, x_label="optimizer step",
                            y_label="cross-entropy loss (nats per token)", markers=False)
    if not accuracy:
        open(dst, "w").write(loss_panel)
        return
    # Percent ticks every 10 points around the values.
    a_lo = 10 * math.floor(min(v for _, v in accuracy) / 10)
    a_hi = min(100, 10 * math.ceil(max(v for _, v in accuracy) / 10))
    a_hi = max(a_hi, a_lo + 10)
    a_ticks = [(v, f"{v}%") for v in range(a_lo, a_hi + 1, 10)]
    accuracy_panel = line_chart("validation next-token accuracy",
                                [("validation accuracy", accuracy)],
                                x_ticks, a_ticks, x_label="optimizer step",
                                y_label="accuracy (% of tokens)", markers=True)
    # Two panels stacked in one SVG: each chart is a nested <svg>, the second moved down.
    header = '<svg xmlns="http://www.w3.org/2000/svg" '
    assert loss_panel.startswith(header) and accuracy_panel.startswith(header)
    width = loss_panel.split('width="', 1)[1].split('"', 1)[0]
    accuracy_panel = accuracy_panel.replace(header, f'<svg y="{PANEL_HEIGHT}" ', 1)
    open(dst, "w").write(
        f'{header}width="{width}" height="{2 * PANEL_HEIGHT}">\n' + loss_panel +
        accuracy_panel + "</svg>\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
