#!/usr/bin/env bash
# probe_cluster.sh OUT [ROUNDS] - the cluster merge (rectangular phases of 2..16 splits merged inside the
# decode launch, kernel v11) on the GPU in one call: builds the working tree (build-gpu, sm_90a), checks it
# (test_cuda with clusters and with PKV_CLUSTER_MERGE=0, pkv check, memcheck and racecheck on a reduced
# set), then times every anchor and route with clusters on and off, alternating for ROUNDS rounds, and
# single requests of 2K..64K tokens on the split route with the chunk forced so that a row has 8, 16 or
# more splits (--min-chunk), on and off.  OUT/summary.txt; OUT/probe.tgz (JSON, logs).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_cluster.sh OUT [ROUNDS]}
rounds=${2:-2}
mkdir -p "$out"
r=$(mktemp -d)
b=$root/build-gpu
S="$r/summary.txt"
{
  if ! { cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real &&
         cmake --build "$b" -j "$(nproc)"; } >"$r/build.log" 2>&1; then
    tail -n 30 "$r/build.log"; echo "build failed"; cp -r "$r" "$out/"; exit 1
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
  PKV_TEST_CASES=40 timeout 240 "$b/tests/test_cuda" >"$r/test_cuda.log" 2>&1
  rc=$?
  echo "test_cuda, clusters (rc $rc): $(tail -n 1 "$r/test_cuda.log")"
  [ $rc -eq 0 ] || { grep -m 20 -i "fail\|error\|mismatch" "$r/test_cuda.log"; tail -n 5 "$r/test_cuda.log"; }
  echo "test_cuda, PKV_CLUSTER_MERGE=0: $(PKV_CLUSTER_MERGE=0 PKV_TEST_CASES=20 timeout 200 "$b/tests/test_cuda" 2>&1 | tail -n 1)"
  echo "test_cuda, PKV_TMA_STAGES=3: $(PKV_TMA_STAGES=3 PKV_TEST_CASES=20 timeout 200 "$b/tests/test_cuda" 2>&1 | tail -n 1)"
  echo "pkv check: $(timeout 200 "$b/pkv" check --backend cuda --count 30 2>&1 | tail -n 1)"
  if command -v compute-sanitizer >/dev/null; then
    PKV_TEST_SMALL=1 PKV_TEST_CASES=4 timeout 200 compute-sanitizer --tool memcheck "$b/tests/test_cuda" >"$r/memcheck.log" 2>&1
    echo "memcheck: $(grep -E "ERROR SUMMARY" "$r/memcheck.log")"
    PKV_TEST_SMALL=1 PKV_TEST_CASES=1 timeout 200 compute-sanitizer --tool racecheck "$b/tests/test_cuda" >"$r/racecheck.log" 2>&1
    echo "racecheck: $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$r/racecheck.log" | tail -n 1)"
  fi
  [ $rc -eq 0 ] || rounds=0
  for k in $(seq 1 "$rounds"); do
    for v in on off; do
      cl=1; [ $v = off ] && cl=0
      PKV_CLUSTER_MERGE=$cl timeout 300 "$b/pkv" bench --backend cuda --anchor all --route all --reps 100 --wall-reps 3 \
        --no-check --quiet --json "$r/anchors_${v}_$k.json" >/dev/null 2>>"$r/bench.log"
      for n in 2048 8192 32768 65536; do
        for mc in 128 256 512 1024 2048 4096; do
          [ $((n / mc)) -ge 4 ] && [ $((n / mc)) -le 32 ] || continue
          PKV_CLUSTER_MERGE=$cl timeout 60 "$b/pkv" bench --backend cuda --lens $n --route split --min-chunk $mc \
            --reps 100 --wall-reps 3 --no-check --quiet --json "$r/b1_${v}_${k}_${n}_${mc}.json" >/dev/null 2>>"$r/bench.log"
        done
      done
    done
  done
  [ "$rounds" -gt 0 ] || exit 0
  python3 - "$r" "$rounds" <<'PY'
import glob, json, re, sys, statistics as st
r, rounds = sys.argv[1], int(sys.argv[2])
def rows(path):
    try:
        return json.load(open(path))["rows"]
    except Exception:
        return []
def med(v, k):
    return st.median(v) if v else float("nan")
an = {}
for v in ("on", "off"):
    for k in range(1, rounds + 1):
        for x in rows(f"{r}/anchors_{v}_{k}.json"):
            an.setdefault((x["step"], x["route"]), {}).setdefault(v, []).append(x["kernel_us"])
            an[(x["step"], x["route"])].setdefault(v + "_l", x.get("launches"))
print("| anchor | route | launches on/off | on us | off us | on / off |")
print("| --- | --- | --- | ---: | ---: | ---: |")
lg = {}
for (s, rt), d in an.items():
    if "on" not in d or "off" not in d: continue
    a, b = med(d["on"], 0), med(d["off"], 0)
    lg.setdefault(rt, []).append(a / b)
    print(f"| {s} | {rt} | {d.get('on_l')}/{d.get('off_l')} | {a:.1f} | {b:.1f} | {a / b:.3f} |")
import math
for rt, v in lg.items():
    print(f"geomean on/off {rt}: {math.exp(sum(map(math.log, v)) / len(v)):.4f} over {len(v)} anchors")
print()
print("| tokens | min chunk | splits | on us | off us | on / off |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
b1 = {}
for f in glob.glob(f"{r}/b1_*.json"):
    m = re.match(r".*/b1_(on|off)_(\d+)_(\d+)_(\d+)\.json", f)
    v, k, n, mc = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    for x in rows(f):
        e = b1.setdefault((n, mc), {"tasks": x.get("tasks")})
        e.setdefault(v, []).append(x["kernel_us"])
for (n, mc) in sorted(b1):
    d = b1[(n, mc)]
    if "on" not in d or "off" not in d: continue
    a, b = med(d["on"], 0), med(d["off"], 0)
    print(f"| {n} | {mc} | {(d['tasks'] or 0) // 8} | {a:.1f} | {b:.1f} | {a / b:.3f} |")
PY
} 2>&1 | tee "$S"
cp "$S" "$out/"
tar czf "$out/probe.tgz" -C "$r" .
