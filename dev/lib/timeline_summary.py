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


def tail():
    """Where the time after the decode goes (builds with the PKV_TL_MARK points): per file, relative to
    the last decode CTA's tile loop end (us): that CTA's arrival (fused) and end, and the merge CTAs'
    dependency-wait return, states combined and end (first..last)."""
    print()
    print("| timeline | last loop end | its arrival / end | latest decode end | merge wait return | merge combined | merge end |")
    print("| --- | ---: | --- | ---: | --- | --- | --- |")
    for path in sys.argv[1:]:
        rows = list(csv.DictReader(open(path)))
        if not rows or "mark0_ns" not in rows[0]:
            continue
        dec = [r for r in rows if r["kind"] == "decode" and int(r["mark0_ns"]) > 0]
        mer = [r for r in rows if r["kind"] == "merge"]
        if not dec:
            continue
        t0 = min(int(r["start_ns"]) for r in dec)
        last = max(dec, key=lambda r: int(r["mark0_ns"]))
        L = int(last["mark0_ns"])
        rel = lambda v: (int(v) - L) / 1e3
        arr = f"{rel(last['mark1_ns']):+.2f}" if int(last["mark1_ns"]) else "-"
        dec_end = max(int(r["end_ns"]) for r in dec)

        def span(key):
            v = [int(r[key]) for r in mer if int(r[key]) > 0]
            return f"{(min(v) - L) / 1e3:+.2f}..{(max(v) - L) / 1e3:+.2f}" if v else "-"
        print(f"| {os.path.basename(path)} | {(L - t0) / 1e3:.1f} | {arr} / {rel(last['end_ns']):+.2f} | "
              f"{(dec_end - L) / 1e3:+.2f} | {span('mark0_ns')} | {span('mark1_ns')} | {span('end_ns')} |")


if __name__ == "__main__":
    main()
    tail()
