#!/usr/bin/env bash
# 15_tma_settings.sh OUT OLD_SOURCE [ROUNDS] - the tensor-copy (TMA) decode kernel's settings against the register
# kernel in one device call: builds the working tree (build-gpu) and OLD_SOURCE (build-variant, e.g.
# dev/decode_v7.cu from `git show 6976e0f:src/cuda/decode.cu`), runs test_cuda with the tensor-copy
# kernel (default), 3 stages and the register kernels (PKV_DECODE_TMA=0), times every anchor (route
# auto) under each setting below and the old build,
# alternating for ROUNDS rounds (stops starting rounds after ~7 minutes), and profiles the decode kernel
# of B16_homo8K and B1_N65536 with Nsight Compute in both builds.  (The committed results of this probe,
# bench/results/probes/h200_probe_tma_*.txt, also compared copy layouts and L2 promotions that were
# environment settings of the draft kernel; v8 keeps one of each.)
# OUT/summary.txt, OUT/probe.tgz (JSON, logs, ncu reports as text).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/15_tma_settings.sh OUT OLD_SOURCE [ROUNDS]}
variant=${2:?old decode source, relative to the repository root}
rounds=${3:-2}
. "$root/dev/lib/build.sh"
t0=$(date +%s)
dev_ab_setup "$variant"
# name:binary:ctas-per-unit (0: default):environment; TMA_CONFIGS replaces the list (@A: the new build's
# directory, @B: the old one's); TMA_NCU=0 skips the profiles
configs=${TMA_CONFIGS:-"old:$b/pkv:0: new:$a/pkv:0: s3cpu2:$a/pkv:2:PKV_TMA_STAGES=3 newcpu2:$a/pkv:2:
oldcpu2:$b/pkv:2: reg:$a/pkv:0:PKV_DECODE_TMA=0"}
configs=${configs//@A/$a}; configs=${configs//@B/$b}
S="$r/summary.txt"
{
  echo "# dev/probes/15_tma_settings.sh: working tree vs $variant; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  for setting in PKV_DECODE_TMA=1 PKV_TMA_STAGES=3 PKV_DECODE_TMA=0; do
    echo "test_cuda $setting: $(env $setting PKV_TEST_CASES=24 timeout 200 "$a/tests/test_cuda" 2>&1 | tail -n 1)"
  done
  if [ -n "${TMA_SANITIZE:-}" ]; then
    PKV_TEST_SMALL=1 PKV_TEST_CASES=4 timeout 200 compute-sanitizer --tool memcheck "$a/tests/test_cuda" >"$r/memcheck.log" 2>&1
    echo "memcheck: $(grep -E "ERROR SUMMARY" "$r/memcheck.log")"
    PKV_TEST_SMALL=1 PKV_TEST_CASES=2 timeout 200 compute-sanitizer --tool racecheck "$a/tests/test_cuda" >"$r/racecheck.log" 2>&1
    echo "racecheck: $(grep -E "RACECHECK SUMMARY" "$r/racecheck.log" | tail -n 1)"
  fi
  for k in $(seq 1 "$rounds"); do
    [ $(( $(date +%s) - t0 )) -lt 420 ] || { echo "round $k skipped (time)"; break; }
    for c in $configs; do
      IFS=: read -r name bin cpu envs <<<"$c"
      opt=""; [ "$cpu" != 0 ] && opt="--ctas-per-unit $cpu"
      env $envs timeout 200 "$bin" bench --backend cuda --anchor all --route auto --reps 100 --wall-reps 3 --no-check \
        --quiet $opt --json "$r/${name}_${k}.json" >/dev/null 2>>"$r/bench.log"
    done
  done
  python3 - "$r" "$configs" <<'PY'
import glob, json, sys, statistics as st
r, configs = sys.argv[1], sys.argv[2].split()
names = [c.split(":")[0] for c in configs]
t = {}
for n in names:
    for f in sorted(glob.glob(f"{r}/{n}_*.json")):
        try:
            for x in json.load(open(f))["rows"]:
                t.setdefault((x["step"], n), []).append(x["kernel_us"])
        except Exception:
            pass
steps = []
for (s, n) in t:
    if s not in steps: steps.append(s)
print("| anchor (auto, kernel us) | " + " | ".join(names) + " |")
print("| --- |" + " ---: |" * len(names))
rat = {n: [] for n in names}
for s in steps:
    old = st.median(t[(s, "old")]) if (s, "old") in t else None
    cells = []
    for n in names:
        if (s, n) in t:
            m = st.median(t[(s, n)])
            cells.append(f"{m:.2f}" + (f" ({m / old:.3f})" if old and n != "old" else ""))
            if old: rat[n].append(m / old)
        else:
            cells.append("-")
    print(f"| {s} | " + " | ".join(cells) + " |")
for n in names:
    v = rat[n]
    if v:
        g = 1.0
        for x in v: g *= x
        print(f"geomean {n} / old: {g ** (1 / len(v)):.4f} over {len(v)}")
PY
  [ "${TMA_NCU:-1}" = 0 ] || for st in B16_homo8K B1_N65536; do
    for v in new old; do
      bin=$a/pkv; [ $v = old ] && bin=$b/pkv
      timeout 120 ncu --clock-control none -k regex:decode_kernel --launch-skip 4 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --metrics dram__bytes_read.sum,lts__t_sectors_op_read.sum,lts__t_sector_op_read_hit_rate.pct,smsp__inst_executed.sum \
        "$bin" bench --backend cuda --anchor $st --route auto --reps 4 --warmup 2 --wall-reps 1 --no-check --quiet \
        >"$r/ncu_${st}_$v.txt" 2>&1
      echo "ncu $st $v: $(grep -E "^ +(Duration|DRAM Throughput|dram__bytes_read.sum|lts__t_sectors_op_read.sum|lts__t_sector_op_read_hit_rate.pct|smsp__inst_executed.sum|Achieved Occupancy|Memory Throughput) " "$r/ncu_${st}_$v.txt" | awk '{$1=$1; print}' | tr '\n' ';')"
    done
  done
} 2>&1 | tee "$S.all"
mv "$S.all" "$S"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
