"""Speedup vs message size per link rate, as a standalone SVG (no
dependencies), from the JSON that ``cluster.py run --json`` writes.

    plot.py results.json [more.json ...] -o docs/cluster-speedup.svg \
        --variants equarx:b64-d2,equarx-pre:b64-d1

One line per (link rate, variant): the all-reduce workload's speedup over
the 2-byte baseline (the faster of ring-u16 and psum-f16) at each size.
"""

from __future__ import annotations

import argparse
import json
import math
from html import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
DASHES = ["", "6,4", "2,3", "8,3,2,3"]
NOTES = (
    "equarx:CFG — the JAX door (hook after XLA's fusion)",
    "equarx-pre:CFG — rewritten before XLA's fusion",
    "bN block size, dN pipeline depth;",
    "exact: xla_allow_excess_precision=false",
    "2-byte baseline: the faster of ring-u16, psum-f16",
)


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += json.load(f)["rows"]
    return rows


def series(rows, variants, metric):
    """{(rate, variant): [(MiB, speedup), ...]} for the all-reduce rows."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        if r["workload"] != "allreduce" or r["variant"] not in variants or metric not in r:
            continue
        out.setdefault((r["rate"], r["variant"]), []).append((r["bytes"] / (1 << 20), r[metric]))
    return {k: sorted(v) for k, v in out.items()}


def svg(data, title, ylabel, goal=None, notes=(), width=880, height=440):
    left, right, top, bottom = 64, 330, 40, 56
    pw, ph = width - left - right, height - top - bottom
    xs = sorted({x for pts in data.values() for x, _ in pts})
    ys = [y for pts in data.values() for _, y in pts] + [1.0] + ([goal] if goal else [])
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    y0 = 0.0
    y1 = math.ceil(max(ys) * 2 + 0.5) / 2

    def px(x):
        return left + (math.log2(x) - x0) / (x1 - x0) * pw

    def py(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
          f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
          f'<rect width="{width}" height="{height}" fill="white"/>',
          f'<text x="{left}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']
    step = 0.5 if y1 <= 4 else 1.0
    y = y0
    while y <= y1 + 1e-9:
        el.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#e5e5e5"/>')
        el.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}×</text>')
        y += step
    for x in xs:
        el.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" stroke="#f0f0f0"/>')
        lab = f"{x * 1024:g} KiB" if x < 1 else f"{x:g} MiB"
        el.append(f'<text x="{px(x):.1f}" y="{top + ph + 18}" text-anchor="middle">{lab}</text>')
    el.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    el.append(f'<text x="{left + pw / 2}" y="{height - 12}" text-anchor="middle">all-reduce payload '
              f'(bf16, per process)</text>')
    el.append(f'<text transform="translate(16,{top + ph / 2}) rotate(-90)" text-anchor="middle">'
              f'{escape(ylabel)}</text>')
    el.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(1):.1f}" y2="{py(1):.1f}" stroke="#444" '
              f'stroke-width="1"/>')
    if goal:
        el.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(goal):.1f}" y2="{py(goal):.1f}" '
                  f'stroke="#444" stroke-dasharray="3,3"/>')
        el.append(f'<text x="{left + pw - 4}" y="{py(goal) - 5:.1f}" text-anchor="end" fill="#444">'
                  f'goal {goal:g}×</text>')
    rates = list(dict.fromkeys(k[0] for k in data))
    variants = list(dict.fromkeys(k[1] for k in data))
    ly = top + 8
    for (rate, variant), pts in data.items():
        color = COLORS[rates.index(rate) % len(COLORS)]
        dash = DASHES[variants.index(variant) % len(DASHES)]
        d = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for i, (x, y) in enumerate(pts))
        dattr = f' stroke-dasharray="{dash}"' if dash else ""
        el.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2"{dattr}/>')
        for x, y in pts:
            el.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                      f'<title>{escape(rate)} {escape(variant)} {x:g} MiB: {y:.2f}×</title></circle>')
        lx = left + pw + 14
        el.append(f'<line x1="{lx}" x2="{lx + 28}" y1="{ly}" y2="{ly}" stroke="{color}" '
                  f'stroke-width="2"{dattr}/>')
        el.append(f'<text x="{lx + 34}" y="{ly + 4}">{escape(rate)} {escape(variant)}</text>')
        ly += 18
    for line in notes:
        ly += 16
        el.append(f'<text x="{left + pw + 14}" y="{ly}" fill="#555" font-size="11">{escape(line)}</text>')
    el.append("</svg>")
    return "\n".join(el) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--variants", default="equarx:b64-d2,equarx-pre:b64-d1")
    p.add_argument("--metric", default="speedup_vs_2byte", choices=("speedup_vs_2byte", "speedup_vs_psum"))
    p.add_argument("--title", default="equarx on 4 processes over shaped links: speedup vs the 2-byte baseline")
    p.add_argument("--goal", type=float, default=1.8)
    args = p.parse_args(argv)
    data = series(load(args.json), args.variants.split(","), args.metric)
    if not data:
        raise SystemExit("no all-reduce rows for those variants")
    ylabel = ("× vs the 2-byte baseline (median, slowest rank)" if args.metric == "speedup_vs_2byte"
              else "× vs psum as is (f32 on the wire)")
    with open(args.out, "w") as f:
        f.write(svg(data, args.title, ylabel, args.goal, NOTES))


if __name__ == "__main__":
    main()
