#!/usr/bin/env bash
# probe_balance.sh OUT - balanced work-queue spans (pkv_plan_options.balance, `pkv bench --balance`) on the
# GPU: correctness, then the work queue and fused routes with and without balance, alternating, on every
# anchor and on ragged trace steps (paper shape, seed 20260623: uniform, bimodal, zipf at B 8 and 16, 8 steps).
# Everything lands in OUT (summary.txt, JSON and Markdown per pass, logs).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_balance.sh OUT}
mkdir -p "$out"
b=$root/build-gpu
. "$root/dev/build.sh"
dev_build "$b" "$out/build.log" "pkv test_cuda" || { tail -n 40 "$out/build.log"; exit 1; }
S="$out/summary.txt"
{
echo "== correctness (test_cuda runs the work queue and fused routes balanced too)"
PKV_TEST_CASES=${PKV_PROBE_CASES:-20} "$b/tests/test_cuda" >"$out/test_cuda.log" 2>&1
echo "test_cuda: $(tail -n 1 "$out/test_cuda.log")"
grep -E "FAIL" "$out/test_cuda.log" | head -n 10
PKV_TEST_SMALL=1 PKV_TEST_CASES=2 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$b/tests/test_cuda" >"$out/memcheck.log" 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -n 1)"
PKV_TEST_SMALL=1 PKV_TEST_CASES=1 timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 "$b/tests/test_cuda" >"$out/racecheck.log" 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' "$out/racecheck.log" | tail -n 1)"
} 2>&1 | tee "$S"
for round in 1; do
  for bal in "" "--balance"; do
    tag=$([ -n "$bal" ] && echo bal || echo plain)
    for r in workqueue fused; do
      "$b/pkv" bench --backend cuda --anchor all --route $r $bal --reps 50 --wall-reps 3 --no-check \
        --json "$out/anchors_${r}_${tag}_$round.json" >"$out/anchors_${r}_${tag}_$round.md" 2>>"$out/bench.log"
    done
  done
done
for fam in uniform bimodal zipf; do
  for B in 8 16; do
    for bal in "" "--balance"; do
      tag=$([ -n "$bal" ] && echo bal || echo plain)
      for r in workqueue fused; do
        "$b/pkv" bench --backend cuda --trace $fam --seed 20260623 --batch $B --requests $((3 * B)) --steps 8 --route $r \
          $bal --reps 30 --wall-reps 3 --no-check --per-step --json "$out/trace_${fam}_B${B}_${r}_${tag}.json" \
          >"$out/trace_${fam}_B${B}_${r}_${tag}.md" 2>>"$out/bench.log"
      done
    done
  done
done
python3 - "$out" <<'PY' | tee -a "$S"
import json, sys, glob, math
o = sys.argv[1]
def rows(f):
    return {(r["step"], r.get("trace", "")): r for r in json.load(open(f))["rows"]}
print("\n== anchors: kernel us, plain vs balanced (one pass each, alternating), per route")
print("| anchor | wq plain | wq bal | bal/plain | fused plain | fused bal | bal/plain | tasks (wq plain / bal) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
g = {"workqueue": [], "fused": []}
A = {}
for r in ("workqueue", "fused"):
    for tag in ("plain", "bal"):
        runs = [rows(f"{o}/anchors_{r}_{tag}_1.json")]
        A[(r, tag)] = {k: (runs[0][k]["kernel_us"], runs[0][k]) for k in runs[0]}
for k in A[("workqueue", "plain")]:
    line = f"| {k[0]} "
    for r in ("workqueue", "fused"):
        a, b = A[(r, "plain")][k][0], A[(r, "bal")][k][0]
        g[r].append(b / a)
        line += f"| {a:.1f} | {b:.1f} | {b / a:.3f} "
    line += f"| {A[('workqueue', 'plain')][k][1]['tasks']} / {A[('workqueue', 'bal')][k][1]['tasks']} |"
    print(line)
for r in g:
    v = g[r]
    print(f"{r}: geomean bal/plain {math.exp(sum(map(math.log, v)) / len(v)):.4f}, min {min(v):.3f}, max {max(v):.3f}")
print("\n== trace steps (seed 20260623, 8 steps each): geomean bal/plain per family and B")
for r in ("workqueue", "fused"):
    allv = []
    for fam in ("uniform", "bimodal", "zipf"):
        for B in (8, 16):
            a = rows(f"{o}/trace_{fam}_B{B}_{r}_plain.json")
            b = rows(f"{o}/trace_{fam}_B{B}_{r}_bal.json")
            v = [b[k]["kernel_us"] / a[k]["kernel_us"] for k in a if k in b and a[k]["kernel_us"] > 0]
            allv += v
            gm = math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")
            print(f"{r} {fam} B{B}: {len(v)} steps, geomean {gm:.4f}, min {min(v):.3f}, max {max(v):.3f}")
    print(f"{r} all: geomean {math.exp(sum(map(math.log, allv)) / len(allv)):.4f} over {len(allv)} steps")
PY
