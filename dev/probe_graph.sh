#!/usr/bin/env bash
# probe_graph.sh OUT - graph-stable plans (pkv_plan_options.graph_max_batch) on the GPU in one device call:
# test_cuda (its graph-stable cases capture a CUDA graph once and replay it for steps of other lengths
# and batch sizes) with compute-sanitizer memcheck and racecheck on the reduced set beside it, then the
# 26 anchor steps on the work queue, plain against graph-stable plans (capacity: the step's batch rounded
# up to a power of two, as servers capture per batch bucket) at grids of one resident wave (the default),
# two and four, alternating for up to ROUNDS rounds (default 2).  OUT/summary.txt: per anchor the kernel
# time of each variant and its ratio to the plain work queue; OUT/probe.tgz: JSON and logs.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_graph.sh OUT [ROUNDS]}
rounds=${2:-2}
mkdir -p "$out"
r=$(mktemp -d)
a=$root/build-gpu
. "$root/dev/build.sh"
t0=$(date +%s)
dev_build "$a" "$r/build.log" "pkv test_cuda" || { tail -n 40 "$r/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
PKV_TEST_CASES=60 timeout 300 "$a/tests/test_cuda" >"$r/test_cuda.log" 2>&1 &
tpid=$!
{ PKV_TEST_SMALL=1 PKV_TEST_CASES=6 timeout 400 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$a/tests/test_cuda" >"$r/memcheck.log" 2>&1; echo "memcheck rc=$?" >>"$r/memcheck.log"; } &
mpid=$!
{ PKV_TEST_SMALL=1 PKV_TEST_CASES=6 timeout 400 compute-sanitizer --tool racecheck --error-exitcode 3 \
    "$a/tests/test_cuda" >"$r/racecheck.log" 2>&1; echo "racecheck rc=$?" >>"$r/racecheck.log"; } &
rpid=$!
wait $tpid
echo "test_cuda: $(tail -n 1 "$r/test_cuda.log")"
grep -E "graph-stable|FAIL" "$r/test_cuda.log" | head -n 20
# cap: the largest resident wave the planner sees (d 128, G 4); 0 = default
variants="plain:0 graph1:0 graph2:792 graph4:1584"
for k in $(seq 1 "$rounds"); do
  [ $(( $(date +%s) - t0 )) -lt 330 ] || { echo "round $k skipped (time)"; break; }
  for v in $variants; do
    name=${v%%:*}; tasks=${v#*:}
    extra=""
    [ "$name" = plain ] || extra="--graph-max-batch pow2 --graph-tasks $tasks"
    check="--no-check"; [ "$k" = 1 ] && [ "$name" != plain ] && check=""
    "$a/pkv" bench --backend cuda --anchor all --route workqueue --reps 50 --warmup 5 --wall-reps 5 $check $extra \
      --json "$r/${name}_$k.json" --quiet >"$r/${name}_$k.log" 2>&1 || echo "$name round $k: rc=$?"
  done
  echo "round $k done: $(( $(date +%s) - t0 )) s"
done
wait $mpid $rpid
tail -n 3 "$r/memcheck.log" "$r/racecheck.log"
python3 - "$r" <<'EOF' | tee "$r/summary.txt"
import json, glob, os, statistics, sys
r = sys.argv[1]
names = ["plain", "graph1", "graph2", "graph4"]
t, ctas, err = {}, {}, {}
for n in names:
    for f in sorted(glob.glob(os.path.join(r, f"{n}_*.json"))):
        d = json.load(open(f))
        for row in d["rows"]:
            t.setdefault((row["step"], n), []).append(row["kernel_us"])
            ctas[(row["step"], n)] = row.get("grid_ctas", row.get("tasks"))
            if row.get("rel_err") is not None: err[(row["step"], n)] = row["rel_err"]
steps = []
for (s, n) in t:
    if s not in steps: steps.append(s)
print("| step | " + " | ".join(f"{n} us (CTAs)" for n in names) + " | " + " | ".join(f"{n}/plain" for n in names[1:]) + " | worst rel err |")
print("| --- |" + " ---: |" * (2 * len(names)))
ratios = {n: [] for n in names[1:]}
for s in steps:
    med = {n: statistics.median(t[(s, n)]) for n in names if (s, n) in t}
    cells = [f"{med[n]:.1f} ({ctas.get((s, n))})" if n in med else "-" for n in names]
    rs = []
    for n in names[1:]:
        if n in med and "plain" in med:
            ratios[n].append(med[n] / med["plain"]); rs.append(f"{med[n] / med['plain']:.3f}")
        else:
            rs.append("-")
    e = max([err[(s, n)] for n in names if (s, n) in err] or [float("nan")])
    print(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(rs) + f" | {e:.1e} |")
for n, v in ratios.items():
    if v:
        g = 1.0
        for x in v: g *= x
        print(f"{n}/plain: geomean {g ** (1 / len(v)):.4f}, min {min(v):.3f}, max {max(v):.3f} over {len(v)} steps")
EOF
cp "$r/summary.txt" "$out/" 2>/dev/null
tar czf "$out/probe.tgz" -C "$r" .
