#!/usr/bin/env bash
# 13_decode_source_ab.sh OUT VARIANT_SOURCE [ROUNDS] - a kernel change A/B on the GPU in one call: builds the
# working tree (build-gpu) and the decode source VARIANT_SOURCE (build-variant, e.g. a copy of the previous
# src/cuda/decode.cu under dev/), checks the working tree's kernels (test_cuda with each merge kernel,
# pkv check, memcheck on a reduced set), then times both builds on every anchor and route, alternating
# the builds for ROUNDS rounds (each a median of 100 CUDA-event runs).  The variant source must define
# pkv_cuda_decode_init_attributes as src/cuda/pkv_cuda.h declares it now (per head dim and group range
# stage tables and the sm90_code flag since 536d5d7); an older decode.cu needs that function adapted
# (filling the tables as its tma_setup did; v7 and older: zeros).
# OUT/summary.txt (per anchor and
# route: each round's time for both builds, the medians, the ratio), OUT/probe.tgz (the JSON and logs).
# AB_EXTRA="name:SETTING,SETTING ..." also times the new build under each set of settings, as columns
# beside new: an environment variable (e.g. "s2:PKV_TMA_STAGES=2") or a pkv bench option with "=" for its
# space (e.g. "pack3:--pack=1,--ctas-per-unit=3").  A new kernel that fails or hangs its first test stops
# the probe before the timings (every test run has a time limit).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/13_decode_source_ab.sh OUT VARIANT_SOURCE [ROUNDS]}
mkdir -p "$out"
variant=${2:?variant decode source, relative to the repository root}
rounds=${3:-2}
. "$root/dev/lib/build.sh"
dev_ab_setup "$variant"
S="$r/summary.txt"
{
  echo "# dev/probes/13_decode_source_ab.sh: working tree (new) vs $variant (old); every anchor and route; $rounds rounds"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
  PKV_TEST_CASES=40 timeout 240 "$a/tests/test_cuda" >"$r/test_cuda.log" 2>&1
  rc=$?
  echo "new test_cuda (rc $rc): $(tail -n 1 "$r/test_cuda.log")"
  if [ $rc -ne 0 ]; then grep -m 20 -i "fail\|error\|mismatch" "$r/test_cuda.log"; tail -n 20 "$r/test_cuda.log"; fi
  for mk in head row; do
    echo "new test_cuda, PKV_MERGE_KERNEL=$mk: $(PKV_MERGE_KERNEL=$mk PKV_TEST_CASES=20 timeout 200 "$a/tests/test_cuda" 2>&1 | tail -n 1)"
  done
  echo "new pkv check: $(timeout 200 "$a/pkv" check --backend cuda --count 30 2>&1 | tail -n 1)"
  if command -v compute-sanitizer >/dev/null; then
    PKV_TEST_SMALL=1 PKV_TEST_CASES=4 timeout 200 compute-sanitizer --tool memcheck "$a/tests/test_cuda" >"$r/memcheck.log" 2>&1
    echo "new memcheck: $(grep -E "ERROR SUMMARY" "$r/memcheck.log")"
    if [ -n "${AB_RACECHECK:-}" ]; then
      PKV_TEST_SMALL=1 PKV_TEST_CASES=2 timeout 200 compute-sanitizer --tool racecheck "$a/tests/test_cuda" >"$r/racecheck.log" 2>&1
      echo "new racecheck: $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$r/racecheck.log" | tail -n 1)"
    fi
  fi
  variants="new old"
  for x in ${AB_EXTRA:-}; do variants="$variants ${x%%:*}"; done
  [ $rc -eq 0 ] || rounds=0
  for k in $(seq 1 "$rounds"); do
    for v in $variants; do
      bin=$a/pkv; envs=""; args=""
      [ $v = old ] && bin=$b/pkv
      for x in ${AB_EXTRA:-}; do
        [ "${x%%:*}" = $v ] || continue
        for s in $(echo "${x#*:}" | tr , ' '); do
          case $s in --*) args="$args ${s/=/ }" ;; *) envs="$envs $s" ;; esac
        done
      done
      env $envs timeout 300 "$bin" bench --backend cuda --anchor all --route all --reps 100 --wall-reps 3 --no-check --quiet \
        $args --json "$r/${v}_${k}.json" >/dev/null 2>>"$r/bench.log"
    done
  done
  [ "$rounds" -gt 0 ] || exit 0
  AB_VARIANTS="$variants" python3 - "$r" "$rounds" <<'PY'
import json, os, sys, statistics as st
r, rounds = sys.argv[1], int(sys.argv[2])
extra = [v for v in os.environ["AB_VARIANTS"].split() if v not in ("new", "old")]
def load(v, k):
    try:
        return {(x["step"], x["route"]): x["kernel_us"] for x in json.load(open(f"{r}/{v}_{k}.json"))["rows"]}
    except Exception:
        return {}
new = [load("new", k) for k in range(1, rounds + 1)]
old = [load("old", k) for k in range(1, rounds + 1)]
ext = {v: [load(v, k) for k in range(1, rounds + 1)] for v in extra}
keys = [k for k in new[0] if all(k in d for d in new + old + sum(ext.values(), []))]
print("| anchor | route | new us (rounds) | old us (rounds) | new median | old median | new / old |"
      + "".join(f" {v} median | {v} / old |" for v in extra))
print("| --- | --- | --- | --- | ---: | ---: | ---: |" + " ---: | ---: |" * len(extra))
ratios = {}
eratios = {v: {} for v in extra}
for key in keys:
    n, o = [d[key] for d in new], [d[key] for d in old]
    mn, mo = st.median(n), st.median(o)
    ratios[key] = mn / mo
    cols = ""
    for v in extra:
        me = st.median([d[key] for d in ext[v]])
        eratios[v][key] = me / mo
        cols += f" {me:.2f} | {me / mo:.4f} |"
    print(f"| {key[0]} | {key[1]} | {' '.join(f'{x:.1f}' for x in n)} | {' '.join(f'{x:.1f}' for x in o)} | {mn:.2f} | {mo:.2f} | {mn / mo:.4f} |" + cols)
def gm(v):
    g = 1.0
    for x in v: g *= x
    return g ** (1 / len(v)) if v else float("nan")
for rt in sorted({k[1] for k in keys}):
    v = [x for k, x in ratios.items() if k[1] == rt]
    b1 = [x for k, x in ratios.items() if k[1] == rt and k[0].startswith("B1_")]
    print(f"geomean new / old, route {rt}: {gm(v):.4f} over {len(v)} anchors (B1 anchors {gm(b1):.4f})")
    for x in extra:
        v = [y for k, y in eratios[x].items() if k[1] == rt]
        print(f"geomean {x} / old, route {rt}: {gm(v):.4f}")
PY
} 2>&1 | tee "$S.all"
mv "$S.all" "$S"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
