#!/usr/bin/env python3
"""Draws riskkv-gpu-bench's results as an SVG: recovery time on the GPU per mode, one panel per
model and history length, each bar labelled with its milliseconds and the ratio of token replay
to it.

    chart_gpu.py ROWS.jsonl OUT.svg

ROWS.jsonl holds one JSON object per (model, history, mode): recovery_seconds, kv_bytes_sent,
rebuild_seconds, as riskkv-gpu-bench --jsonl writes them.
"""
import json
import sys
from xml.sax.saxutils import escape

COLORS = {"token_replay": "#f28e2b", "full_kv": "#4e79a7", "reconstruct": "#59a14f"}
MODES = ["token_replay", "full_kv", "reconstruct"]
PANEL_W, PANEL_H, BAR = 300, 200, 56


def panel(x0, y0, title, rows):
    by_mode = {r["mode"]: r for r in rows}
    top = max(r["recovery_seconds"] for r in rows) or 1.0
    replay = by_mode.get("token_replay", {}).get("recovery_seconds")
    out = [f'<text x="{x0 + PANEL_W / 2}" y="{y0}" text-anchor="middle" font-size="13">'
           f'{escape(title)}</text>']
    base = y0 + 24 + PANEL_H
    for i, mode in enumerate(m for m in MODES if m in by_mode):
        v = by_mode[mode]["recovery_seconds"]
        h = PANEL_H * v / top
        x = x0 + 24 + i * (BAR + 36)
        label = f"{v * 1e3:.2f} ms"
        if replay and mode != "token_replay":
            label += f" ({replay / v:.1f}x)"
        out.append(f'<rect x="{x}" y="{base - h:.1f}" width="{BAR}" height="{h:.1f}" '
                   f'fill="{COLORS[mode]}"/>')
        out.append(f'<text x="{x + BAR / 2}" y="{base - h - 4:.1f}" text-anchor="middle" '
                   f'font-size="10">{escape(label)}</text>')
        out.append(f'<text x="{x + BAR / 2}" y="{base + 14}" text-anchor="middle" '
                   f'font-size="10">{mode}</text>')
    out.append(f'<line x1="{x0 + 10}" y1="{base}" x2="{x0 + PANEL_W - 10}" y2="{base}" '
               f'stroke="#333"/>')
    return out


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise SystemExit(f"{sys.argv[1]}: no rows")
    keys = []
    for r in rows:
        k = (r["model"], r["history"])
        if k not in keys:
            keys.append(k)
    cols = 2
    n_rows = (len(keys) + cols - 1) // cols
    width, height = cols * (PANEL_W + 20) + 20, n_rows * (PANEL_H + 80) + 50
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif">', f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">Recovery on the GPU '
           '(KV from host memory, rebuild, first decode step); ratio = token replay / mode</text>']
    for i, (model, history) in enumerate(keys):
        x0 = 20 + (i % cols) * (PANEL_W + 20)
        y0 = 50 + (i // cols) * (PANEL_H + 80)
        group = [r for r in rows if (r["model"], r["history"]) == (model, history)]
        svg += panel(x0, y0, f"{model}, {history} tokens", group)
    svg.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
