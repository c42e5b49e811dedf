#!/usr/bin/env bash
# 02_short_steps_ncu.sh BUILD OUT - why short single-request steps lose: Nsight Compute sections of the fused
# kernel on B1_N8192 at 1, 2 and 3 tasks per SM, and kernel time against tasks per SM for B1 steps.
set -u
build=${1:?build dir}; out=${2:?out dir}
for cpu in ${PKV_PROBE_CPUS:-1 2 3}; do
  ncu --clock-control none --graph-profiling node -k regex:decode_kernel --launch-skip 12 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section LaunchStats \
    "$build/pkv" bench --backend cuda --anchor B1_N8192 --route fused --reps 4 --warmup 2 --wall-reps 1 --no-check --quiet \
    --ctas-per-unit $cpu >"$out/ncu_b1_8k_cpu$cpu.txt" 2>&1
done
for cpu in 1 2; do
  for a in B1_N2048 B1_N8192 B1_N32768 B1_N65536 B1_N131072 B4_zipf B4_bimodal B4_homo8K; do
    "$build/pkv" bench --backend cuda --anchor $a --route fused --reps 50 --quiet --no-check --ctas-per-unit $cpu \
      2>/dev/null | awk -v c=$cpu -F'|' 'NR>2 && NF>5 {print "cpu=" c " |" $0}' | head -n 1
  done
done | tee "$out/sweep_b1.txt"
