#!/usr/bin/env bash
# 03_two_tiles_in_flight.sh OUT - kernel v4 A/B in one run: the two-tiles-in-flight heads-in-N variant
# (PKV_DECODE_DEEP=1 always, 0 never, default: grids of <= 2 CTAs per SM) and the heads-in-N kernel
# at d = 256 (vs PKV_DECODE_KERNEL=m); correctness of each variant first (test_cuda, pkv check).
set -u -o pipefail
out=${1:?usage: dev/probes/03_two_tiles_in_flight.sh OUT}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build-gpu"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null &&
  cmake --build "$build" -j "$(nproc)" 2>&1 | grep -E "error|spill" | tee "$out/build.txt"
export PKV_COMMIT=${PKV_COMMIT:-unknown}
for deep in 1 0 default; do
  if [ $deep = default ]; then unset PKV_DECODE_DEEP; else export PKV_DECODE_DEEP=$deep; fi
  echo "== test_cuda, PKV_DECODE_DEEP=$deep"
  PKV_TEST_CASES=40 "$build/tests/test_cuda" 2>&1 | tail -n 2
  "$build/pkv" check --backend cuda --count 20 2>&1 | tail -n 1
done | tee "$out/correctness.txt"
unset PKV_DECODE_DEEP
PKV_TEST_SMALL=1 PKV_TEST_CASES=2 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/test_cuda" 2>&1 |
  grep -E "ERROR SUMMARY|passed," | tee -a "$out/correctness.txt"
"$build/tests/test_cost" | grep "decision" | tee "$out/decision.txt"
for v in default 0; do
  if [ $v = default ]; then unset PKV_DECODE_DEEP; else export PKV_DECODE_DEEP=$v; fi
  "$build/pkv" bench --backend cuda --anchor all --reps 50 --quiet --no-check --json "$out/anchors_deep_$v.json" \
    >"$out/anchors_deep_$v.md" 2>>"$out/bench.log"
done
unset PKV_DECODE_DEEP
for k in n m; do
  for sh in d256 g8 g7 d64; do
    if [ $k = m ]; then export PKV_DECODE_KERNEL=m; else unset PKV_DECODE_KERNEL; fi
    for a in B1_N8192 B1_N32768 B8_zipf B32_bimodal B64_uniform; do
      "$build/pkv" bench --backend cuda --shape $sh --anchor $a --route fused --reps 30 --quiet --no-check 2>/dev/null |
        awk -v k=$k -v s=$sh -F'|' 'NR>2 && NF>5 {print "kernel=" k " shape=" s " |" $0}' | head -n 1
    done
  done
done | tee "$out/shapes_ab.txt"
unset PKV_DECODE_KERNEL
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = {}
for v in ("default", "0"):
    for r in json.load(open(f"{out}/anchors_deep_{v}.json"))["rows"]:
        rows.setdefault((r["step"], r["route"]), {})[v] = r["kernel_us"]
print("| step | route | deep (default) us | one tile (DEEP=0) us | ratio |")
for (s, rt), d in rows.items():
    if rt in ("split", "fused", "workqueue", "auto") and "0" in d:
        print(f"| {s} | {rt} | {d['default']:.1f} | {d['0']:.1f} | {d['0'] / d['default']:.3f} |")
PY
