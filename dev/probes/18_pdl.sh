#!/usr/bin/env bash
# 18_pdl.sh OUT - programmatic dependent launch of a run's kernels (pkv_context_config.pdl): correctness
# and what it saves.
#  1. builds pkv and test_cuda (build-gpu); test_cuda (every route right behind a late producer of q,
#     PDL on and off, besides the random cases) and memcheck/racecheck on a small set;
#  2. every anchor, auto, with PDL on and off: kernel time as the anchors are timed (events around the
#     run) and behind a kernel that writes q (events around the producer alone and the pair, with a
#     producer that does not and one that does trigger its dependents).
# Everything lands in OUT (summary.txt, the JSON and Markdown of each pass, logs).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/18_pdl.sh OUT}
mkdir -p "$out"
b=$root/build-gpu
. "$root/dev/lib/build.sh"
dev_build "$b" "$out/build.log" "pkv test_cuda" || { tail -n 40 "$out/build.log"; exit 1; }
S="$out/summary.txt"
{
echo "== correctness"
PKV_TEST_CASES=20 "$b/tests/test_cuda" >"$out/test_cuda.log" 2>&1
echo "test_cuda: $(tail -n 1 "$out/test_cuda.log")"
grep -E "FAIL|behind" "$out/test_cuda.log" | head -n 20
PKV_TEST_SMALL=1 PKV_TEST_CASES=2 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$b/tests/test_cuda" >"$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -n 1)"
PKV_TEST_SMALL=1 PKV_TEST_CASES=1 timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 "$b/tests/test_cuda" >"$out/racecheck.log" 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' "$out/racecheck.log" | tail -n 1)"
} 2>&1 | tee "$S"
for pdl in 1 0 1; do
  n=$([ -e "$out/pdl${pdl}.json" ] && echo ${pdl}b || echo $pdl)
  "$b/pkv" bench --backend cuda --anchor all --route auto --reps 50 --wall-reps 5 --no-check --behind-producer \
    --pdl $pdl --json "$out/pdl$n.json" >"$out/pdl$n.md" 2>>"$out/bench.log"
done
python3 - "$out" <<'PY' | tee -a "$S"
import json, sys
o = sys.argv[1]
def load(n):
    return {r["step"]: r for r in json.load(open(f"{o}/pdl{n}.json"))["rows"]}
on, off, on2 = load("1"), load("0"), load("1b")
print("\n== auto, PDL on (two passes) vs off; us, medians; step behind = (producer + step) - producer alone")
print("| step | kernel on | on (2nd) | off | behind, plain producer: on | off | saved | behind, triggering producer: on | off | saved |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
sv, st = [], []
for k in on:
    a, b, c = on[k], off[k], on2[k]
    pa = (a["producer_step_us"] - a["producer_us"] + c["producer_step_us"] - c["producer_us"]) / 2
    pb = b["producer_step_us"] - b["producer_us"]
    ta = (a["producer_trigger_step_us"] - a["producer_trigger_us"] + c["producer_trigger_step_us"] - c["producer_trigger_us"]) / 2
    tb = b["producer_trigger_step_us"] - b["producer_trigger_us"]
    sv.append(pb - pa); st.append(tb - ta)
    print(f"| {k} | {a['kernel_us']:.1f} | {c['kernel_us']:.1f} | {b['kernel_us']:.1f} | {pa:.1f} | {pb:.1f} | {pb - pa:.2f} | {ta:.1f} | {tb:.1f} | {tb - ta:.2f} |")
sv.sort(); st.sort()
print(f"saved per step behind a plain producer: median {sv[len(sv)//2]:.2f} us (min {sv[0]:.2f}, max {sv[-1]:.2f}); "
      f"behind a triggering one: median {st[len(st)//2]:.2f} us (min {st[0]:.2f}, max {st[-1]:.2f})")
PY
