#!/usr/bin/env python3
"""summarize.py OUT_DIR [trace JSON ...] - the short table of a GPU check: for each anchor step the
best route's kernel time next to FlashInfer's best (anchors.md), its fraction of the read ceiling
and its step efficiency; per trace family the per-route means.  Writes OUT_DIR/summary.md and
OUT_DIR/traces.json (the trace runs merged)."""
import json
import math
import os
import sys


def anchors_table(path):
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    steps = []
    for r in rows:
        if r["step"] not in steps:
            steps.append(r["step"])
    ceil = data["ceilings"]["read_gbps"]
    out = [f"commit {data['meta']['commit']}, {data['meta'].get('gpu', {}).get('name', data['meta']['device'])}, "
           f"read ceiling {ceil:.0f} GB/s, empty launch {data['ceilings']['empty_launch_us']:.2f} us",
           "",
           "| step | KV MB | best route | kernel us | FlashInfer us | FI / ours | of ceiling | floor us | pages floor us | its share of ceiling | "
           "step eff | single | split | bucketed | workqueue | fused | auto | rel err |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
           "| ---: |"]
    wins = 0
    effs = []
    long_rows = []  # (step, fraction of the read ceiling) of anchors whose every row has >= 32K tokens
    for s in steps:
        rs = [r for r in rows if r["step"] == s]
        fixed = [r for r in rs if r["route"] != "auto"]
        best = min(fixed, key=lambda r: r["kernel_us"])
        by = {r["route"]: r for r in rs}
        fi = best.get("flashinfer_best_us")
        ratio = fi / best["kernel_us"] if fi else None
        if ratio and ratio >= 1 / 1.10:
            wins += 1
        effs.append(best["step_efficiency"] or 0)
        if best.get("lens") and min(best["lens"]) >= 32768:
            long_rows.append((s, best["frac_read_ceiling"]))
        cell = lambda k: f"{by[k]['kernel_us']:.1f}" if k in by else "-"
        worst_err = max((r["rel_err"] or 0) for r in rs)
        pf = best.get("pages_floor_us")
        pf_s = f"{pf:.1f} | {best['kv_bytes'] / (pf * 1e3) / ceil:.2f}" if pf else "- | -"
        out.append(f"| {s} | {best['kv_bytes'] / 1e6:.1f} | {best['route']} | {best['kernel_us']:.1f} | "
                   f"{fi if fi else '-'} | {ratio:.2f} | {best['frac_read_ceiling']:.3f} | {best['floor_us']:.1f} | {pf_s} | "
                   f"{best['step_efficiency']:.2f} | {cell('single')} | {cell('split')} | {cell('bucketed')} | "
                   f"{cell('workqueue')} | {cell('fused')} | {cell('auto')} | {worst_err:.1e} |")
    out.append("")
    out.append(f"steps within 10% of FlashInfer or faster: {wins}/{len(steps)}; step efficiency of the best route: "
               f"min {min(effs):.2f}, median {sorted(effs)[len(effs) // 2]:.2f}, max {max(effs):.2f}")
    kernels = {}
    for r in rows:
        if r.get("decode_kernel"):
            kernels[r["decode_kernel"]] = kernels.get(r["decode_kernel"], 0) + 1
    if kernels:
        out.append("decode kernel (rows): " + ", ".join(f"{k} {n}" for k, n in sorted(kernels.items())))
    if long_rows:
        met = [f"{s} {f:.3f}" for s, f in long_rows if f >= 0.80]
        short = [f"{s} {f:.3f}" for s, f in long_rows if f < 0.80]
        out.append(f"anchors of >= 32K tokens per row at >= 0.80 of the read ceiling (best route): {len(met)}/{len(long_rows)}"
                   + (f" ({', '.join(met)})" if met else "") + (f"; below: {', '.join(short)}" if short else ""))
    return out


def traces_table(paths):
    merged = []
    out = ["", "| trace | route | steps | mean kernel us | mean wall us | tokens/s | launches/step | mean step eff | worst rel err |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        merged.append(d)
        routes = []
        for r in d["rows"]:
            if r["route"] not in routes:
                routes.append(r["route"])
        for rt in routes:
            rs = [r for r in d["rows"] if r["route"] == rt]
            n = len(rs)
            kt = sum(r["kernel_us"] for r in rs) / n
            wt = sum(r["wall_us"] for r in rs) / n
            tok = sum(r["batch"] for r in rs) / (sum(r["wall_us"] for r in rs) * 1e-6)
            la = sum(r["launches"] for r in rs) / n
            se = sum((r["step_efficiency"] or 0) for r in rs) / n
            we = max((r["rel_err"] or 0) for r in rs)
            out.append(f"| {d['meta']['workload']} | {rt} | {n} | {kt:.1f} | {wt:.1f} | {tok:.0f} | {la:.2f} | {se:.2f} | {we:.1e} |")
    return out, merged


def best_route_line(path, title):
    """One line for a run of the anchors in another shape or setting (Gemma-2's local layers; d = 64 on pages
    of 1 token): the best route's fraction of the ceiling and the worst error over every route."""
    doc = json.load(open(path))
    best = {}
    for r in doc["rows"]:
        if r.get("kernel_us") and (r["step"] not in best or r["kernel_us"] < best[r["step"]]["kernel_us"]):
            best[r["step"]] = r
    fr = sorted(r.get("frac_read_ceiling") or 0.0 for r in best.values())
    errs = [r["rel_err"] for r in doc["rows"] if r.get("rel_err") is not None]
    unwritten = sum(r.get("unwritten_outputs") or 0 for r in doc["rows"])
    if not fr:
        return ["", f"{title}: no rows"]
    return ["", f"{title}, {len(best)} anchors: best route's fraction "
                f"of the read ceiling min {fr[0]:.3f}, median {fr[len(fr) // 2]:.3f}, max {fr[-1]:.3f}; worst rel err "
                f"{max(errs) if errs else float('nan'):.1e} over {len(errs)} runs; unwritten outputs {unwritten}"]


def graph_stable_line(plain_path, graph_path):
    """Graph-stable plans against the plain work queue of the same check (kernel time, same tasks)."""
    plain = {r["step"]: r for r in json.load(open(plain_path))["rows"] if r["route"] == "workqueue"}
    rows = json.load(open(graph_path))["rows"]
    ratios = sorted(r["kernel_us"] / plain[r["step"]]["kernel_us"] for r in rows if r["step"] in plain)
    if not ratios:
        return []
    errs = [r["rel_err"] for r in rows if r.get("rel_err") is not None]
    gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    line = (f"graph-stable plans (CUDA-graph replay) vs the plain work queue, {len(ratios)} anchors: kernel time "
            f"geomean {gm:.3f}, min {ratios[0]:.3f}, max {ratios[-1]:.3f}; worst rel err "
            f"{max(errs) if errs else float('nan'):.1e}; unwritten outputs "
            f"{sum(r.get('unwritten_outputs', 0) or 0 for r in rows)}")
    # a step as a server runs it: plan + upload + one graph launch + sync, against plan + upload + the
    # kernel launches + sync of the plain work queue (host clock, medians)
    saved = sorted(plain[r["step"]]["wall_us"] - r["graph_replay_wall_us"] for r in rows
                   if r["step"] in plain and r.get("graph_replay_wall_us") is not None)
    if saved:
        line += (f"; step wall time replayed from a graph minus the plain eager step: median "
                 f"{-saved[len(saved) // 2]:+.1f} us ({-saved[-1]:+.1f} .. {-saved[0]:+.1f})")
    return ["", line]


def fp8_line(fp16_path, fp8_path, what="fp8 (e4m3) cache against fp16", note="half the bytes: 0.5 at best"):
    """The anchors of one run against the same anchors of another (best route's kernel time each): an fp8
    cache against fp16, or e5m2 against e4m3 (the same bytes; e5m2 widens by a byte permute, so a ratio
    below 1 is the e4m3 conversion's cost)."""
    def best(path):
        b = {}
        for r in json.load(open(path))["rows"]:
            if r.get("kernel_us") and (r["step"] not in b or r["kernel_us"] < b[r["step"]]):
                b[r["step"]] = r["kernel_us"]
        return b
    f16, f8 = best(fp16_path), best(fp8_path)
    ratios = sorted(f8[s] / f16[s] for s in f8 if s in f16)
    if not ratios:
        return []
    gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    return [f"{what}, {len(ratios)} anchors: best route's kernel time geomean {gm:.3f}, "
            f"min {ratios[0]:.3f}, max {ratios[-1]:.3f} ({note})"]


def main():
    out_dir = sys.argv[1]
    lines = []
    a = os.path.join(out_dir, "anchors.json")
    if os.path.exists(a):
        lines += anchors_table(a)
    g = os.path.join(out_dir, "anchors_gemma2_local.json")
    if os.path.exists(g):
        lines += best_route_line(g, "Gemma-2 local layers (d256, soft cap 50, window 4096)")
    d64 = os.path.join(out_dir, "anchors_d64_page1.json")
    if os.path.exists(d64):
        lines += best_route_line(d64, "d = 64 (32:8:64) on pages of 1 token")
    f8 = os.path.join(out_dir, "anchors_fp8.json")
    if os.path.exists(f8):
        lines += best_route_line(f8, "fp8 KV cache (e4m3, scale 0.05)")
        if os.path.exists(a):
            lines += fp8_line(a, f8)
        f8e5 = os.path.join(out_dir, "anchors_fp8_e5m2.json")
        if os.path.exists(f8e5):
            lines += fp8_line(f8, f8e5, "fp8 e5m2 cache against e4m3", "the same bytes: < 1 is e4m3's conversion")
    gs = os.path.join(out_dir, "anchors_graph_stable.json")
    if os.path.exists(a) and os.path.exists(gs):
        lines += graph_stable_line(a, gs)
    traces = [p for p in sys.argv[2:] if os.path.exists(p)]
    if traces:
        t, merged = traces_table(traces)
        lines += t
        with open(os.path.join(out_dir, "traces.json"), "w") as f:
            json.dump({"runs": merged}, f, indent=1)
    text = "\n".join(lines)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
