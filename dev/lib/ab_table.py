#!/usr/bin/env python3
"""ab_table.py DIR TITLE A_RUNS B_RUNS - the A/B table of the kernel probes: the `pkv bench --json` runs
DIR/<name>.json named in A_RUNS and B_RUNS (comma-separated; several runs of one side are alternating
rounds, combined by their median), every (anchor, route) both sides have: A and B kernel time, A / B, A's
fraction of the read ceiling and A's decode kernel; then the geomean of A / B per route and over the
best route of each anchor.  Prints Markdown."""
import json
import statistics as st
import sys


def load(d, name):
    try:
        with open(f"{d}/{name}.json") as f:
            return {(x["step"], x["route"]): x for x in json.load(f)["rows"]}
    except (OSError, ValueError, KeyError):
        return {}


def geomean(v):
    g = 1.0
    for x in v:
        g *= x
    return g ** (1 / len(v)) if v else float("nan")


def main():
    d, title, a_names, b_names = sys.argv[1:5]
    a = [load(d, n) for n in a_names.split(",")]
    b = [load(d, n) for n in b_names.split(",")]
    if not all(a + b):
        print(f"\n## {title}: missing runs")
        return
    keys = [k for k in a[0] if all(k in x for x in a + b)]
    print(f"\n## {title}\n| anchor | route | A us | B us | A / B | A of ceiling | A kernel |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | --- |")
    ratios, best = {}, {}
    for k in keys:
        ma = st.median([x[k]["kernel_us"] for x in a])
        mb = st.median([x[k]["kernel_us"] for x in b])
        ratios[k] = ma / mb
        print(f"| {k[0]} | {k[1]} | {ma:.1f} | {mb:.1f} | {ma / mb:.3f} | {a[0][k]['frac_read_ceiling']:.3f} | "
              f"{a[0][k].get('decode_kernel') or ''} |")
        s = best.setdefault(k[0], [1e30, 1e30])
        s[0], s[1] = min(s[0], ma), min(s[1], mb)
    for rt in sorted({k[1] for k in keys}):
        print(f"geomean A / B, route {rt}: {geomean([x for k, x in ratios.items() if k[1] == rt]):.4f}")
    print(f"geomean A / B, best route of each: {geomean([v[0] / v[1] for v in best.values()]):.4f}; "
          + ", ".join(f"{s} {v[0]:.1f}/{v[1]:.1f}" for s, v in best.items()))


if __name__ == "__main__":
    main()
