#!/usr/bin/env python3
"""plot_compare.py - compare.json (bench/compare_flashinfer.py) -> compare.png.

One panel per workload: anchor steps, other model shapes, and traces (one bar per family and B,
the mean over held-out seeds and sampled steps, with the range as an error bar).  Bars: the ratio
FlashInfer best kernel time / PersistentKV best kernel time (> 1: PersistentKV is faster; green
above 1, red below), a black tick for PersistentKV auto.  Markers on the right axis: the fraction of
the measured read ceiling that each library reaches (KV bytes / kernel time / ceiling).  Rows of an fp8
cache (compare_flashinfer.py --kv-dtype) carry its type in their label (e4m3, e5m2).

Usage: python3 bench/plot_compare.py compare.json [--out compare.png]
"""

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def _num(x):
    return float("nan") if x is None else float(x)


def _kv(r):
    """ " e4m3" / " e5m2" for a row of an fp8 cache (compare_flashinfer.py --kv-dtype), else ""."""
    kv = r.get("kv_dtype")
    return f" {kv.replace('fp8_', '')}" if kv and kv != r.get("dtype") else ""


def _label(r):
    if r["group"] == "shape":
        return f"{r['shape']}:{r['dtype']} {r['name']}" + _kv(r)
    return r["name"] + _kv(r)


def panels(rows):
    """[(title, labels, ratio, lo, hi, ratio_auto, fi_frac, pkv_frac)] for the groups present."""
    out = []
    for group, title in (("anchor", "anchor steps (paper shape)"), ("shape", "other model shapes")):
        rs = [r for r in rows if r.get("group") == group]
        if rs:
            ratio = [_num(r.get("ratio")) for r in rs]
            out.append((title, [_label(r) for r in rs], ratio, ratio, ratio, [_num(r.get("ratio_auto")) for r in rs],
                        [_num(r.get("fi_frac_ceiling")) for r in rs], [_num(r.get("pkv_frac_ceiling")) for r in rs]))
    agg = {}
    for r in rows:
        if r.get("group") == "trace":
            agg.setdefault((r.get("family", "?"), r.get("batch", r.get("B")), _kv(r)), []).append(r)
    if agg:
        order = {"uniform": 0, "bimodal": 1, "zipf": 2, "bucketed": 3}
        keys = sorted(agg, key=lambda k: (order.get(k[0], 9), k[1], k[2]))

        def mean_of(rs, key):
            v = [r[key] for r in rs if r.get(key) is not None]
            return (statistics.mean(v), min(v), max(v)) if v else (math.nan,) * 3
        ratio = [mean_of(agg[k], "ratio") for k in keys]
        nseeds = max(len({r.get("seed") for r in v}) for v in agg.values())
        out.append((f"traces: mean over {nseeds} seed(s) and the sampled steps, range as error bar",
                    [f"{f} B{b}{kv}" for f, b, kv in keys], [x[0] for x in ratio], [x[1] for x in ratio],
                    [x[2] for x in ratio], [mean_of(agg[k], "ratio_auto")[0] for k in keys],
                    [mean_of(agg[k], "fi_frac_ceiling")[0] for k in keys],
                    [mean_of(agg[k], "pkv_frac_ceiling")[0] for k in keys]))
    return out


def plot(data, out_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    meta, rows = data.get("meta", {}), data.get("rows", [])
    ps = panels(rows)
    if not ps:
        raise SystemExit("plot_compare: no rows to plot")
    width = min(40.0, max(10.0, 3.0 + 0.36 * max(len(p[1]) for p in ps)))
    fig, axes = plt.subplots(len(ps), 1, figsize=(width, 4.6 * len(ps)), squeeze=False)
    for ax, (title, labels, ratio, lo, hi, rauto, ffi, fpk) in zip(axes[:, 0], ps):
        x = list(range(len(labels)))
        colors = ["tab:green" if (r == r and r >= 1) else "tab:red" for r in ratio]
        yerr = [[max(0.0, r - l) if r == r and l == l else 0.0 for r, l in zip(ratio, lo)],
                [max(0.0, h - r) if r == r and h == h else 0.0 for r, h in zip(ratio, hi)]]
        ax.bar(x, [r if r == r else 0.0 for r in ratio], color=colors, alpha=0.75, yerr=yerr, capsize=2,
               label="FlashInfer best / PersistentKV best (kernel time)")
        ax.scatter(x, rauto, marker="_", s=160, color="black", zorder=3, label="FlashInfer best / PersistentKV auto")
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        finite = [v for v in ratio + rauto + hi if v == v]
        ax.set_ylim(0, max(1.6, 1.1 * max(finite)) if finite else 2.0)
        ax.set_ylabel("speed ratio (> 1: PersistentKV faster)")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_xlim(-0.7, len(labels) - 0.3)
        ax.set_title(title, fontsize=10)
        ax2 = ax.twinx()
        ax2.plot(x, ffi, "o", color="tab:blue", ms=4, label="FlashInfer, fraction of read ceiling")
        ax2.plot(x, fpk, "s", color="tab:orange", ms=4, label="PersistentKV, fraction of read ceiling")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("fraction of read ceiling")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
    ce = meta.get("ceilings", {})
    gpu = meta.get("gpu", {}).get("name", "?")
    rg = ce.get("read_gbps")
    title = (f"FlashInfer {meta.get('flashinfer', '?')} vs PersistentKV {meta.get('commit', '?')} on {gpu}; "
             f"layout {meta.get('layout', '?')}; read ceiling {rg:.0f} GB/s" if rg else
             f"FlashInfer vs PersistentKV on {gpu}")
    if meta.get("dry_run"):
        title = "DRY RUN (made-up numbers) - " + title
    if meta.get("truncated"):
        title += " (stopped at the time limit)"
    fig.suptitle(title, fontsize=11)
    fig.legend(h1 + h2, l1 + l2, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.35 / (4.6 * len(ps))), ncol=4,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / (4.6 * len(ps))))
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", type=Path, help="compare.json")
    p.add_argument("--out", type=Path, help="PNG path (default: compare.png beside the JSON)")
    a = p.parse_args(argv)
    data = json.loads(a.json.read_text())
    out = a.out or a.json.with_name("compare.png")
    plot(data, out)
    print(f"[plot_compare] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
