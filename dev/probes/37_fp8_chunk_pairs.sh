#!/usr/bin/env bash
# 37_fp8_chunk_pairs.sh OUT - do 16-byte loads of fp8 chunk pairs lift the heads-in-N kernel's fp8 steps?
# The fp8 heads-in-N kernel reads each 8-element chunk by its own 8-byte load: per 16-token tile a thread issues
# 16 loads for 4 KB of fp8 K/V per warp, twice the load instructions per byte of the 16-bit kernel, and reads
# the long steps at 0.80-0.92 of the ceiling (fp8 bytes) against 0.96-1.04 in 16 bits (docs/kernel-notes.md,
# "fp8 caches, measured").  dev/variants/fp8_pairs/ loads two chunks per 16-byte load (K always, V at d >= 128),
# q and O^T's rows in the matching head-dim order, and sends fp8 pages of a stride of 8 mod 16 bytes to the
# heads-in-M kernel; a bf16 q over an fp8 cache computes in fp16 (q brought to fp16 once per task under a
# power-of-two scale folded into the K scale; the cache widens by one conversion per pair instead of four).
# The probe: the tree (A) and the variant (B) built side by side; B's test_cuda (every
# route, fp8 cases included, against the float64 reference) and pkv check; then the anchors, route auto, e4m3
# and e5m2 (scale 0.05) on A and B and fp16 on A (e4m3 in two alternating rounds, the others one); bf16 q over e4m3 on A and B, bf16 on A.  The e5m2 / e4m3 ratio on each build
# says what the e4m3 conversion costs (e5m2 widens by a byte permute).  OUT/summary.txt, OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
out=${1:?usage: dev/probes/37_fp8_chunk_pairs.sh OUT}
mkdir -p "$out"
r=$(mktemp -d)
a=$dev_root/build-gpu
b=$dev_root/build-variant
dev_build "$a" "$r/build.log" "pkv" -DBUILD_TESTING=OFF &
dev_build_overlay "$b" "$r/build_variant.log" "pkv test_cuda" fp8_pairs -DBUILD_TESTING=ON &
wait
for f in "$a/pkv" "$b/pkv" "$b/tests/test_cuda"; do [ -x "$f" ] || { tail -n 30 "$r"/build*.log; exit 1; }; done
grep -E "spill|warning" "$r/build_variant.log" | grep -v " 0 bytes spill" | head -n 10

one() { # NAME BIN ARGS...: the anchors, route auto, 50 CUDA-event runs each
  local name=$1 bin=$2
  shift 2
  timeout 150 "$bin" bench --backend cuda --anchor all --route auto --reps 50 --wall-reps 2 --no-check --quiet "$@" \
    --json "$r/$name.json" >/dev/null 2>>"$r/bench.log" || echo "$name: exit $?" >>"$r/bench.log"
}
{
  dev_probe_header dev/probes/37_fp8_chunk_pairs.sh
  echo "## the variant's correctness"
  PKV_TEST_CASES=20 timeout 200 "$b/tests/test_cuda" >"$r/test_cuda_variant.log" 2>&1
  echo "test_cuda (variant, 20 cases): exit $?, $(tail -n 1 "$r/test_cuda_variant.log")"
  grep -m 5 "CHECK failed" "$r/test_cuda_variant.log"
  timeout 120 "$b/pkv" check --backend cuda --count 30 >"$r/check_variant.log" 2>&1
  echo "pkv check (variant): exit $?, $(tail -n 1 "$r/check_variant.log")"
  for k in 1 2; do
    one "e4m3_A_$k" "$a/pkv" --kv-dtype fp8_e4m3 --kv-scale 0.05
    one "e4m3_B_$k" "$b/pkv" --kv-dtype fp8_e4m3 --kv-scale 0.05
  done
  one e5m2_A_1 "$a/pkv" --kv-dtype fp8_e5m2 --kv-scale 0.05
  one e5m2_B_1 "$b/pkv" --kv-dtype fp8_e5m2 --kv-scale 0.05
  one fp16_A_1 "$a/pkv"
  one bf16e4m3_A_1 "$a/pkv" --dtype bf16 --kv-dtype fp8_e4m3 --kv-scale 0.05
  one bf16e4m3_B_1 "$b/pkv" --dtype bf16 --kv-dtype fp8_e4m3 --kv-scale 0.05
  one bf16_A_1 "$a/pkv" --dtype bf16
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "e4m3, route auto: the tree (A) / chunk pairs (B)" e4m3_A_1,e4m3_A_2 e4m3_B_1,e4m3_B_2
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "e5m2, route auto: the tree (A) / chunk pairs (B)" e5m2_A_1 e5m2_B_1
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "the tree: e4m3 (A) / e5m2 (B), the cost of e4m3's conversion" e4m3_A_1,e4m3_A_2 e5m2_A_1
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "chunk pairs: e4m3 (A) / e5m2 (B)" e4m3_B_1,e4m3_B_2 e5m2_B_1
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "fp16 (A) / e4m3 with chunk pairs (B): the fp8 speedup" fp16_A_1 e4m3_B_1,e4m3_B_2
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "bf16 q, e4m3: the tree (A) / chunk pairs and fp16 math (B)" bf16e4m3_A_1 bf16e4m3_B_1
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "bf16 (A) / bf16 q over e4m3 with the variant (B): the fp8 speedup" bf16_A_1 bf16e4m3_B_1
  python3 - "$r" <<'EOF'
import json, statistics as st, sys
r = sys.argv[1]
def rows(n):
    try:
        return {x["step"]: x for x in json.load(open(f"{r}/{n}.json"))["rows"]}
    except (OSError, ValueError, KeyError):
        return {}
print("\n## step efficiency on fp8 bytes (e4m3, median of the two rounds; anchors of >= 8K tokens per row)")
print("| anchor | A | B |\n| --- | ---: | ---: |")
A = [rows("e4m3_A_1"), rows("e4m3_A_2")]
B = [rows("e4m3_B_1"), rows("e4m3_B_2")]
for s in A[0]:
    x = A[0][s]
    if x["total_tokens"] // x["batch"] < 8192 or not all(s in y for y in A + B):
        continue
    ea = st.median([y[s]["step_efficiency"] for y in A])
    eb = st.median([y[s]["step_efficiency"] for y in B])
    print(f"| {s} | {ea:.3f} | {eb:.3f} |")
EOF
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
