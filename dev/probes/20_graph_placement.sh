#!/usr/bin/env bash
# 20_graph_placement.sh OUT - where a graph-stable plan's tasks land: per-CTA SM and times (a PKV_TIMELINE
# build) of the work queue, plain and graph-stable (one resident wave, then four), the tasks in the first
# CTAs (default) or spread over the grid (PKV_GRAPH_SPREAD=1), on steps whose tasks fill less than the
# grid; then the 26 anchors, plain against both graph-stable orders (kernel time, medians of 50 runs).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/20_graph_placement.sh OUT}
r=$(mktemp -d)
b=$root/build-gpu; tl=$root/build-tl
. "$root/dev/lib/build.sh"
dev_build "$b" "$r/build.log" "pkv test_cuda" &
dev_build "$tl" "$r/build_tl.log" pkv -DPKV_TIMELINE=ON -DBUILD_TESTING=OFF &
wait
[ -x "$b/pkv" ] && [ -x "$tl/pkv" ] || { tail -n 40 "$r/build.log" "$r/build_tl.log"; exit 1; }
PKV_GRAPH_SPREAD=1 PKV_TEST_CASES=30 timeout 200 "$b/tests/test_cuda" >"$r/test_spread.log" 2>&1 &
for st in B4_homo32K B1_N65536 B16_homo8K; do
  for v in plain g1 g4 g1s g4s; do
    extra=""; envs=""
    case $v in g1*) extra="--graph-max-batch pow2";; g4*) extra="--graph-max-batch pow2 --graph-tasks 1584";; esac
    case $v in *s) envs="PKV_GRAPH_SPREAD=1";; *) envs="PKV_GRAPH_SPREAD=0";; esac
    env $envs PKV_TIMELINE_OUT="$r/tl_${st}_$v.csv" "$tl/pkv" bench --backend cuda --anchor $st --route workqueue \
      --reps 5 --warmup 1 --wall-reps 1 --no-check --quiet $extra >/dev/null 2>>"$r/tl.log"
  done
done
python3 - "$r" <<'PY' | tee "$r/placement.txt"
import csv, glob, os, sys, collections
for f in sorted(glob.glob(os.path.join(sys.argv[1], "tl_*.csv"))):
    rows = [x for x in csv.DictReader(open(f)) if x["kind"] == "decode"]
    if not rows: print(os.path.basename(f), "empty"); continue
    t0 = min(int(x["start_ns"]) for x in rows)
    run = {int(x["cta"]): (int(x["end_ns"]) - int(x["start_ns"])) / 1e3 for x in rows}
    sm = {int(x["cta"]): int(x["sm"]) for x in rows}
    real = [c for c in run if run[c] > 3.0]
    per = collections.Counter(sm[c] for c in real)
    hist = collections.Counter(per.get(s, 0) for s in range(132))
    end = max((int(x["end_ns"]) - t0) / 1e3 for x in rows)
    first = [sm[c] for c in sorted(sm)[:12]]
    print(f"{os.path.basename(f)}: {len(rows)} CTAs, {len(real)} real; real per SM {dict(sorted(hist.items()))}; "
          f"last end {end:.1f} us; SM of CTAs 0..11: {first}")
PY
wait
echo "test_cuda (PKV_GRAPH_SPREAD=1): $(tail -n 1 "$r/test_spread.log")" | tee -a "$r/placement.txt"
for k in 1; do
  for v in plain g1 g1s g4 g4s; do
    extra=""; envs=""
    case $v in g1*) extra="--graph-max-batch pow2";; g4*) extra="--graph-max-batch pow2 --graph-tasks 1584";; esac
    case $v in *s) envs="PKV_GRAPH_SPREAD=1";; *) envs="PKV_GRAPH_SPREAD=0";; esac
    env $envs "$b/pkv" bench --backend cuda --anchor all --route workqueue --reps 50 --warmup 5 --wall-reps 5 --no-check \
      $extra --json "$r/a_$v.json" --quiet >/dev/null 2>>"$r/bench.log"
  done
done
python3 - "$r" <<'PY' | tee -a "$r/placement.txt"
import json, os, sys
r = sys.argv[1]
names = ["plain", "g1", "g1s", "g4", "g4s"]
d = {n: {x["step"]: x["kernel_us"] for x in json.load(open(os.path.join(r, f"a_{n}.json")))["rows"]} for n in names
     if os.path.exists(os.path.join(r, f"a_{n}.json"))}
print("| step | " + " | ".join(d) + " | " + " | ".join(f"{n}/plain" for n in d if n != "plain") + " |")
g = {n: [] for n in d if n != "plain"}
for s in d["plain"]:
    row = [f"{d[n][s]:.1f}" for n in d]
    for n in g: g[n].append(d[n][s] / d["plain"][s])
    print(f"| {s} | " + " | ".join(row) + " | " + " | ".join(f"{d[n][s] / d['plain'][s]:.3f}" for n in g) + " |")
import math
for n, v in g.items(): print(f"{n}/plain geomean {math.exp(sum(map(math.log, v)) / len(v)):.4f} min {min(v):.3f} max {max(v):.3f}")
PY
cp "$r/placement.txt" "$out/"
tar czf "$out/probe.tgz" -C "$r" --exclude='*.o' .
