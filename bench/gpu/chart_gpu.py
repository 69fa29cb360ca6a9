#!/usr/bin/env python3
"""Draws riskkv-gpu-bench's results as an SVG: recovery time on the GPU per mode, one panel per
model and history length, each bar labelled with its milliseconds and the ratio of token replay
to it.

    chart_gpu.py ROWS.jsonl OUT.svg

ROWS.jsonl holds one JSON object per (model, history, mode): recovery_seconds, kv_bytes_sent,
rebuild_seconds, as riskkv-gpu-bench --jsonl writes them.
"""
import os
import sys
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../deploy"))
from chart_modes import panel, read_rows  # noqa: E402  (the demo's chart pieces)

MODES = ["token_replay", "full_kv", "reconstruct"]
PANEL_W, PANEL_H = 320, 260


def model_panel(x0, y0, title, rows):
    """Recovery per mode of one model and history, each bar with its ratio to token replay."""
    ordered = sorted((r for r in rows if r["mode"] in MODES), key=lambda r: MODES.index(r["mode"]))
    replay = next((r["recovery_seconds"] for r in ordered if r["mode"] == "token_replay"), None)

    def label(r):
        text = f"{r['recovery_seconds'] * 1e3:.2f} ms"
        if replay and r["mode"] != "token_replay":
            text += f" ({replay / r['recovery_seconds']:.1f}x)"
        return text

    return panel(x0, title, ordered, lambda r: r["recovery_seconds"], "milliseconds", label, y0)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    rows = read_rows(sys.argv[1])
    keys = []
    for r in rows:
        k = (r["model"], r["history"])
        if k not in keys:
            keys.append(k)
    cols = 2
    n_rows = (len(keys) + cols - 1) // cols
    width, height = cols * (PANEL_W + 20) + 20, n_rows * (PANEL_H + 20) + 50
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif">', f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">Recovery on the GPU '
           '(KV from host memory, rebuild, first decode step); ratio = token replay / mode</text>']
    for i, (model, history) in enumerate(keys):
        x0 = 20 + (i % cols) * (PANEL_W + 20)
        y0 = 50 + (i // cols) * (PANEL_H + 20)
        group = [r for r in rows if (r["model"], r["history"]) == (model, history)]
        svg += model_panel(x0, y0, f"{model}, {history} tokens", group)
    svg.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
