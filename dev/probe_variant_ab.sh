#!/usr/bin/env bash
# probe_variant_ab.sh OUT VARIANT_SOURCE [ROUNDS] - a kernel change A/B on the GPU in one call: builds the
# working tree (build-gpu) and the decode source VARIANT_SOURCE (build-variant, e.g. a copy of the previous
# src/cuda/decode.cu under dev/), checks the working tree's kernels (test_cuda with each merge kernel,
# pkv check, memcheck on a reduced set), then times both builds on every anchor and route, alternating
# the builds for ROUNDS rounds (each a median of 100 CUDA-event runs).  OUT/summary.txt (per anchor and
# route: each round's time for both builds, the medians, the ratio), OUT/probe.tgz (the JSON and logs).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_variant_ab.sh OUT VARIANT_SOURCE [ROUNDS]}
variant=${2:?variant decode source, relative to the repository root}
rounds=${3:-2}
r=$(mktemp -d)
a=$root/build-gpu; b=$root/build-variant
. "$root/dev/build.sh"
dev_build "$a" "$r/build.log" "pkv test_cuda" &
dev_build "$b" "$r/build_variant.log" pkv -DBUILD_TESTING=OFF -DPKV_DECODE_SOURCE="$variant" &
wait
[ -x "$a/pkv" ] && [ -x "$a/tests/test_cuda" ] || { tail -n 40 "$r/build.log"; exit 1; }
[ -x "$b/pkv" ] || { tail -n 40 "$r/build_variant.log"; exit 1; }
S="$r/summary.txt"
{
  echo "# dev/probe_variant_ab.sh: working tree (new) vs $variant (old); every anchor and route; $rounds rounds"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
  echo "new test_cuda: $(PKV_TEST_CASES=40 "$a/tests/test_cuda" 2>&1 | tail -n 1)"
  for mk in head row; do
    echo "new test_cuda, PKV_MERGE_KERNEL=$mk: $(PKV_MERGE_KERNEL=$mk PKV_TEST_CASES=20 "$a/tests/test_cuda" 2>&1 | tail -n 1)"
  done
  echo "new pkv check: $("$a/pkv" check --backend cuda --count 30 2>&1 | tail -n 1)"
  if command -v compute-sanitizer >/dev/null; then
    PKV_TEST_SMALL=1 PKV_TEST_CASES=4 timeout 200 compute-sanitizer --tool memcheck "$a/tests/test_cuda" >"$r/memcheck.log" 2>&1
    echo "new memcheck: $(grep -E "ERROR SUMMARY" "$r/memcheck.log")"
  fi
  for k in $(seq 1 "$rounds"); do
    for v in new old; do
      bin=$a/pkv; [ $v = old ] && bin=$b/pkv
      "$bin" bench --backend cuda --anchor all --route all --reps 100 --wall-reps 3 --no-check --quiet \
        --json "$r/${v}_${k}.json" >/dev/null 2>>"$r/bench.log"
    done
  done
  python3 - "$r" "$rounds" <<'PY'
import json, sys, statistics as st
r, rounds = sys.argv[1], int(sys.argv[2])
def load(v, k):
    try:
        return {(x["step"], x["route"]): x["kernel_us"] for x in json.load(open(f"{r}/{v}_{k}.json"))["rows"]}
    except Exception:
        return {}
new = [load("new", k) for k in range(1, rounds + 1)]
old = [load("old", k) for k in range(1, rounds + 1)]
keys = [k for k in new[0] if all(k in d for d in new + old)]
print("| anchor | route | new us (rounds) | old us (rounds) | new median | old median | new / old |")
print("| --- | --- | --- | --- | ---: | ---: | ---: |")
ratios = {}
for key in keys:
    n, o = [d[key] for d in new], [d[key] for d in old]
    mn, mo = st.median(n), st.median(o)
    ratios[key] = mn / mo
    print(f"| {key[0]} | {key[1]} | {' '.join(f'{x:.1f}' for x in n)} | {' '.join(f'{x:.1f}' for x in o)} | {mn:.2f} | {mo:.2f} | {mn / mo:.4f} |")
def gm(v):
    g = 1.0
    for x in v: g *= x
    return g ** (1 / len(v)) if v else float("nan")
for rt in sorted({k[1] for k in keys}):
    v = [x for k, x in ratios.items() if k[1] == rt]
    b1 = [x for k, x in ratios.items() if k[1] == rt and k[0].startswith("B1_")]
    print(f"geomean new / old, route {rt}: {gm(v):.4f} over {len(v)} anchors (B1 anchors {gm(b1):.4f})")
PY
} 2>&1 | tee "$S.all"
mv "$S.all" "$S"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
