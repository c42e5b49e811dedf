#!/usr/bin/env bash
# 26_ncu_page_sizes.sh OUT - why pages of 1 and 8 tokens trail page 16 on long batches, and why cp.async
# trails the register kernels on small grids (kernel-notes v15 "Left"): builds pkv (sm_90a) and profiles one
# decode launch each with ncu (--clock-control none: the GPU's own clocks): B16_homo32K (work queue) at page
# 16 (whole-tile tensor copies), 8 (chunked copies), 1 (cp.async on every grid) and 1 (register kernels);
# B1_N8192 (split) at page 1 with cp.async and with the register kernels.  Sections: speed of light, memory
# workload, warp states, scheduler.  OUT/ncu_*.txt and OUT/summary.txt (the headline metrics side by side).
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/26_ncu_page_sizes.sh OUT}" pkv -DBUILD_TESTING=OFF
prof() { # NAME ANCHOR ROUTE PAGE ENV...
  local name=$1 anchor=$2 route=$3 page=$4; shift 4
  env "$@" timeout 150 ncu --clock-control none -k regex:decode_kernel --launch-skip 6 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    "$a/pkv" bench --backend cuda --anchor "$anchor" --route "$route" --page-size "$page" --reps 4 --warmup 2 \
    --wall-reps 1 --no-check --quiet >"$out/ncu_$name.txt" 2>&1
}
prof b16_p16 B16_homo32K workqueue 16
prof b16_p8 B16_homo32K workqueue 8
prof b16_p1_cpasync B16_homo32K workqueue 1 PKV_DECODE_CPASYNC=all
prof b16_p1_registers B16_homo32K workqueue 1 PKV_DECODE_CPASYNC=0
prof b1_p1_cpasync B1_N8192 split 1 PKV_DECODE_CPASYNC=all
prof b1_p1_registers B1_N8192 split 1 PKV_DECODE_CPASYNC=0
{
  dev_probe_header dev/probes/26_ncu_page_sizes.sh
  for f in "$out"/ncu_*.txt; do
    echo "== $(basename "$f" .txt): $(grep -m 1 -oE "decode_kernel[A-Za-z0-9_]*" "$f")"
    grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Mem Busy|Max Bandwidth)" "$f" |
      sed -E 's/ +/ /g'
  done
} | tee "$out/summary.txt"
