#!/usr/bin/env python3
"""Draws the migration scenario's result as an SVG: recovery time and KV bytes sent per mode.

    chart_modes.py ROWS.jsonl OUT.svg TITLE

ROWS.jsonl holds one JSON object per migration (mode, wire_form, kv_bytes_sent, bytes_share,
recovery_seconds, rebuild_seconds, delta_nll), as deploy/scenario.sh writes them; a row in a
quantized wire form is labelled with it (rows without the field read as plain).
"""
import json
import sys
from xml.sax.saxutils import escape

COLORS = {"full_kv": "#4e79a7", "token_replay": "#f28e2b", "reconstruct": "#59a14f"}


def panel_width(rows):
    """Wide enough that each bar's slot holds its mode's name ("reconstruct") in the labels' size."""
    return max(300, 64 * len(rows) + 30)


def panel(x0, title, rows, value, unit, label, y0=52):
    """One bar per row (coloured by its mode), labelled with label(row), under `title` at y0."""
    width, height = panel_width(rows), 190
    gap = 24 if len(rows) <= 4 else 18
    bar = min(46, (width - 30) // len(rows) - gap)
    top = max(value(r) for r in rows) or 1.0
    base = y0 + 18 + height
    out = [f'<text x="{x0 + width / 2}" y="{y0}" text-anchor="middle" font-size="13">'
           f'{escape(title)}</text>']
    for i, r in enumerate(rows):
        h = height * value(r) / top
        x = x0 + 20 + i * (bar + gap)
        y = base - h
        mode = r["mode"].split(":")[-1]
        out.append(f'<rect x="{x}" y="{y:.1f}" width="{bar}" height="{h:.1f}" '
                   f'fill="{COLORS.get(mode, "#999")}"/>')
        out.append(f'<text x="{x + bar / 2}" y="{y - 4:.1f}" text-anchor="middle" '
                   f'font-size="11">{escape(label(r))}</text>')
        # "auto:reconstruct" on two lines, then the wire form when it is not plain.
        *prefixes, name = r["mode"].split(":")
        lines = [p + ":" for p in prefixes] + [name]
        wire = r.get("wire_form", "plain")
        if wire not in ("plain", "-"):
            lines.append(wire)
        for k, line in enumerate(lines):
            out.append(f'<text x="{x + bar / 2}" y="{base + 14 + 11 * k}" text-anchor="middle" '
                       f'font-size="10">{escape(line)}</text>')
    out.append(f'<line x1="{x0 + 10}" y1="{base}" x2="{x0 + width - 10}" '
               f'y2="{base}" stroke="#333"/>')
    out.append(f'<text x="{x0 + 10}" y="{base + 52}" font-size="10" fill="#555">'
               f'{escape(unit)}</text>')
    return out


def read_rows(path):
    """The JSON objects of a JSONL file, one per non-empty line; exits naming an empty file."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no rows")
    return rows


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    rows = read_rows(sys.argv[1])
    pw = panel_width(rows)
    total = 2 * pw + 60
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="340" '
           'font-family="sans-serif">',
           f'<rect width="{total}" height="340" fill="white"/>',
           f'<text x="{total / 2}" y="24" text-anchor="middle" font-size="15">'
           f'{escape(sys.argv[3])}</text>']
    svg += panel(10, "recovery (first byte to first token on the target)", rows,
                 lambda r: r["recovery_seconds"], "seconds",
                 lambda r: f"{r['recovery_seconds']:.2f} s")
    svg += panel(pw + 40, "KV bytes sent", rows, lambda r: r["kv_bytes_sent"] / 1e6,
                 "MB (token_replay sends token ids only)",
                 lambda r: f"{r['kv_bytes_sent'] / 1e6:.1f}")
    svg.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
