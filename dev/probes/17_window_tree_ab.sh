#!/usr/bin/env bash
# 17_window_tree_ab.sh OUT OLD_TREE [ROUNDS] - a planner + kernel change under sliding windows, A/B on the GPU in
# one call: builds the working tree (build-gpu) and a whole older source tree OLD_TREE (e.g. `git archive`
# of the previous commit, build-old), checks the new build (test_cuda, memcheck, racecheck on a reduced
# set), then times both builds alternating for ROUNDS rounds on every anchor and route: the d256 shape
# with Gemma-2's cap 50 and 4096-token window, the paper shape under a 4000-token window (window starts
# off page boundaries on every row), and the paper shape without a window (the unwindowed path must not
# move).  OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/17_window_tree_ab.sh OUT OLD_TREE [ROUNDS]}
old=$(cd "${2:?old source tree}" && pwd)
rounds=${3:-2}
mkdir -p "$out"
r=$(mktemp -d)
a=$root/build-gpu; b=$root/build-old
j=$(( $(nproc) / 2 ))
{ cmake -S "$root" -B "$a" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null &&
  cmake --build "$a" -j "$j" --target pkv test_cuda; } >"$r/build_new.log" 2>&1 &
{ cmake -S "$old" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null &&
  cmake --build "$b" -j "$j" --target pkv; } >"$r/build_old.log" 2>&1 &
wait
S="$r/summary.txt"
{
  [ -x "$a/pkv" ] && [ -x "$b/pkv" ] || { tail -n 20 "$r"/build_*.log; echo "build failed"; }
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
  PKV_TEST_CASES=40 timeout 200 "$a/tests/test_cuda" >"$r/test_cuda.log" 2>&1
  rc=$?
  echo "new test_cuda (rc $rc): $(tail -n 1 "$r/test_cuda.log")"
  [ $rc -eq 0 ] || { grep -m 20 -i "fail\|mismatch" "$r/test_cuda.log"; rounds=0; }
  PKV_TEST_SMALL=1 PKV_TEST_CASES=4 timeout 150 compute-sanitizer --tool memcheck "$a/tests/test_cuda" >"$r/memcheck.log" 2>&1
  echo "new memcheck: $(grep -E "ERROR SUMMARY" "$r/memcheck.log")"
  for k in $(seq 1 "$rounds"); do
    for v in new old; do
      bin=$a/pkv; [ $v = old ] && bin=$b/pkv
      timeout 120 "$bin" bench --backend cuda --shape d256 --soft-cap 50 --window 4096 --anchor all --route all --reps 50 \
        --wall-reps 2 --no-check --quiet --json "$r/gemma_${v}_$k.json" >/dev/null 2>>"$r/bench.log"
      timeout 120 "$bin" bench --backend cuda --window 4000 --anchor all --route all --reps 50 \
        --wall-reps 2 --no-check --quiet --json "$r/w4000_${v}_$k.json" >/dev/null 2>>"$r/bench.log"
      [ $k = 1 ] && timeout 150 "$bin" bench --backend cuda --anchor all --route all --reps 50 \
        --wall-reps 2 --no-check --quiet --json "$r/plain_${v}_$k.json" >/dev/null 2>>"$r/bench.log"
    done
  done
  PKV_TEST_SMALL=1 PKV_TEST_CASES=1 timeout 120 compute-sanitizer --tool racecheck "$a/tests/test_cuda" >"$r/racecheck.log" 2>&1
  echo "new racecheck: $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$r/racecheck.log" | tail -n 1)"
  python3 - "$r" "$rounds" <<'PY'
import json, math, sys, statistics as st
r, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    try:
        return {(x["step"], x["route"]): x for x in json.load(open(f"{r}/{name}.json"))["rows"]}
    except Exception:
        return {}
for case, n in (("gemma", rounds), ("w4000", rounds), ("plain", min(rounds, 1))):
    new = [load(f"{case}_new_{k}") for k in range(1, n + 1)]
    old = [load(f"{case}_old_{k}") for k in range(1, n + 1)]
    if not new or not new[0]: continue
    keys = [k for k in new[0] if all(k in d for d in new + old)]
    print(f"\n## {case}: new / old kernel time (median of {n} rounds, each a median of 50 runs)")
    print("| anchor | route | new us | old us | new / old | tasks new/old |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    per = {}
    for key in keys:
        a = st.median(d[key]["kernel_us"] for d in new); b = st.median(d[key]["kernel_us"] for d in old)
        per.setdefault(key[1], []).append(a / b)
        print(f"| {key[0]} | {key[1]} | {a:.1f} | {b:.1f} | {a / b:.3f} | {new[0][key]['tasks']}/{old[0][key]['tasks']} |")
    for rt, v in per.items():
        print(f"{case} geomean new/old {rt}: {math.exp(sum(map(math.log, v)) / len(v)):.4f} ({len(v)} anchors)")
PY
} 2>&1 | tee "$S"
cp "$S" "$out/"
tar czf "$out/probe.tgz" -C "$r" .
