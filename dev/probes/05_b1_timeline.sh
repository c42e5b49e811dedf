#!/usr/bin/env bash
# 05_b1_timeline.sh OUT - where the fixed ~11 us of single-request steps goes, and the merge kernel A/B.
#  1. builds the library (build-gpu) and a timeline build (build-tl, -DPKV_TIMELINE=ON);
#  2. correctness: test_cuda and pkv check with the per-head merge kernel (default) and the earlier
#     per-row one (PKV_MERGE_KERNEL=row), memcheck and racecheck on a small set;
#  3. A/B of the two merge kernels: every anchor and route, and B1 steps of the few-KV-head shapes;
#  4. per-CTA start/end times (%globaltimer) of the decode and merge kernels on B1 and B4/B64 steps,
#     summarised by dev/lib/timeline_summary.py;
#  5. tasks per SM against kernel time for the B1 anchors (split and workqueue routes).
# Everything lands in OUT/probe.tgz (and OUT/summary.txt).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/05_b1_timeline.sh OUT}
r=$(mktemp -d)
b=$root/build-gpu; tl=$root/build-tl
. "$root/dev/lib/build.sh"
dev_build "$b" "$r/build.log" "" &
dev_build "$tl" "$r/build_tl.log" pkv -DPKV_TIMELINE=ON &
wait
[ -x "$b/pkv" ] && [ -x "$tl/pkv" ] || { tail -n 40 "$r/build.log" "$r/build_tl.log"; exit 1; }
S="$r/summary.txt"
{
echo "== correctness"
for mk in head row; do
  echo "merge=$mk test_cuda: $(PKV_MERGE_KERNEL=$mk PKV_TEST_CASES=30 "$b/tests/test_cuda" 2>&1 | tail -n 1)"
  echo "merge=$mk pkv check: $(PKV_MERGE_KERNEL=$mk "$b/pkv" check --backend cuda --count 20 2>&1 | tail -n 1)"
done
PKV_TEST_SMALL=1 PKV_TEST_CASES=2 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$b/tests/test_cuda" >"$r/memcheck.log" 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$r/memcheck.log" | tail -n 1)"
PKV_TEST_SMALL=1 PKV_TEST_CASES=1 timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$b/tests/test_cuda" >"$r/racecheck.log" 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' "$r/racecheck.log" | tail -n 1)"
} 2>&1 | tee "$S"

echo "== merge A/B (kernel us; head = per (merge, query head), row = per merge)" | tee -a "$S"
for mk in head row; do
  PKV_MERGE_KERNEL=$mk "$b/pkv" bench --backend cuda --anchor all --reps 50 --wall-reps 5 --no-check --quiet \
    --json "$r/anchors_$mk.json" >"$r/anchors_$mk.md" 2>>"$r/bench.log"
  for sh in g7 d64 g8 mha d256; do
    for n in 2048 32768; do
      PKV_MERGE_KERNEL=$mk "$b/pkv" bench --backend cuda --shape $sh --lens $n --reps 50 --wall-reps 5 --no-check --quiet \
        2>>"$r/bench.log" | awk -v m=$mk -v s=$sh -F'|' 'NR>2 && NF>5 {print "merge=" m " shape=" s " |" $0}'
    done
  done >"$r/shapes_$mk.md"
done
python3 - "$r" <<'PY' | tee -a "$S"
import json, sys, re
r = sys.argv[1]
def load(mk):
    d = json.load(open(f"{r}/anchors_{mk}.json"))
    return {(x["step"], x["route"]): x for x in d["rows"]}
h, w = load("head"), load("row")
print("| anchor | route | head us | row us | row/head |")
for k in sorted(h):
    if k in w and h[k]["route"] in ("split", "workqueue", "auto"):
        a, b = h[k]["kernel_us"], w[k]["kernel_us"]
        print(f"| {k[0]} | {k[1]} | {a:.1f} | {b:.1f} | {b/a:.3f} |")
def shapes(mk):
    res = {}
    for line in open(f"{r}/shapes_{mk}.md"):
        f = [x.strip() for x in line.split("|")]
        m = re.match(r"merge=(\w+) shape=(\w+)", f[0])
        res[(m.group(2), f[1], f[4])] = float(f[5])
    return res
hs, ws = shapes("head"), shapes("row")
print("| shape | step | route | head us | row us | row/head |")
for k in sorted(hs):
    if k in ws: print(f"| {k[0]} | {k[1]} | {k[2]} | {hs[k]:.1f} | {ws[k]:.1f} | {ws[k]/hs[k]:.3f} |")
PY

echo "== timelines" | tee -a "$S"
tlrun() { # name, args...
  local n=$1; shift
  PKV_TIMELINE_OUT="$r/tl_$n.csv" "$tl/pkv" bench --backend cuda --reps 5 --warmup 2 --wall-reps 1 --no-check --quiet "$@" \
    >"$r/tl_$n.md" 2>>"$r/bench.log"
}
tlrun b1_32k_split --anchor B1_N32768 --route split
tlrun b1_32k_wq --anchor B1_N32768 --route workqueue
tlrun b1_32k_wq_cpu4 --anchor B1_N32768 --route workqueue --ctas-per-unit 4
tlrun b1_2k_split --anchor B1_N2048 --route split
tlrun b1_8k_split --anchor B1_N8192 --route split
tlrun b1_128k_split --anchor B1_N131072 --route split
tlrun b4_homo32k_auto --anchor B4_homo32K --route auto
tlrun b64_homo32k_auto --anchor B64_homo32K --route auto
python3 "$root/dev/lib/timeline_summary.py" "$r"/tl_*.csv | tee -a "$S"

echo "== tasks per SM sweep (new merge)" | tee -a "$S"
for route in split workqueue; do
  for cpu in 1 2 3 4 6; do
    for a in B1_N2048 B1_N8192 B1_N32768 B1_N131072 B4_homo32K; do
      "$b/pkv" bench --backend cuda --anchor $a --route $route --reps 50 --wall-reps 5 --quiet --no-check --ctas-per-unit $cpu \
        2>/dev/null | awk -v c=$cpu -F'|' 'NR>2 && NF>5 {print "cpu=" c " |" $0}' | head -n 1
    done
  done
done | tee -a "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >>"$S" 2>&1
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
