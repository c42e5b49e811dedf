#!/usr/bin/env python3
"""timeline_summary.py TL.csv... - summarises per-CTA timelines written by a PKV_TIMELINE build
(kind,cta,sm,start_ns,end_ns): when the decode CTAs start, how long they run, when the last one ends,
and when the merge kernel runs, all relative to the first decode CTA's start (us)."""
import csv
import os
import sys


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def main():
    print("| timeline | CTAs | SMs | start p50/p99/max | run min/p50/max | end p10/p50/max | merge CTAs | merge start..end |")
    print("| --- | ---: | ---: | --- | --- | --- | ---: | --- |")
    for path in sys.argv[1:]:
        rows = list(csv.DictReader(open(path)))
        dec = [r for r in rows if r["kind"] == "decode"]
        mer = [r for r in rows if r["kind"] == "merge"]
        if not dec:
            print(f"| {os.path.basename(path)} | 0 | | | | | | |")
            continue
        t0 = min(int(r["start_ns"]) for r in dec)
        st = [(int(r["start_ns"]) - t0) / 1e3 for r in dec]
        en = [(int(r["end_ns"]) - t0) / 1e3 for r in dec]
        run = [e - s for s, e in zip(st, en)]
        sms = len({r["sm"] for r in dec})
        ms = "-"
        if mer:
            m0 = min(int(r["start_ns"]) for r in mer)
            m1 = max(int(r["end_ns"]) for r in mer)
            ms = f"{(m0 - t0) / 1e3:.1f}..{(m1 - t0) / 1e3:.1f}"
        print(f"| {os.path.basename(path)} | {len(dec)} | {sms} | {pct(st, .5):.2f}/{pct(st, .99):.2f}/{max(st):.2f} | "
              f"{min(run):.1f}/{pct(run, .5):.1f}/{max(run):.1f} | {pct(en, .1):.1f}/{pct(en, .5):.1f}/{max(en):.1f} | "
              f"{len(mer)} | {ms} |")


if __name__ == "__main__":
    main()
