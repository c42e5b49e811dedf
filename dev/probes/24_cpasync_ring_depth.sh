#!/usr/bin/env bash
# 24_cpasync_ring_depth.sh OUT - does a deeper ring make v15's cp.async fill win on small grids too?  Builds
# pkv (sm_90a) and benches every anchor and route at page size 1, alternating over two rounds: cp.async on
# every grid with the default ring (2 stages per warp at d = 128: 3 CTAs per SM), with 3 stages
# (PKV_TMA_STAGES=3: 2 CTAs per SM, the most a grid of up to 2 per SM uses), and the register kernels.
# OUT/summary.txt, OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/24_cpasync_ring_depth.sh OUT}" pkv -DBUILD_TESTING=OFF
{
  dev_probe_header dev/probes/24_cpasync_ring_depth.sh
  for k in 1 2; do
    dev_bench c2_$k "$a/pkv" PKV_DECODE_CPASYNC=all -- --page-size 1
    dev_bench c3_$k "$a/pkv" PKV_DECODE_CPASYNC=all PKV_TMA_STAGES=3 -- --page-size 1
    dev_bench r_$k "$a/pkv" PKV_DECODE_CPASYNC=0 -- --page-size 1
  done
  ab="$dev_root/dev/lib/ab_table.py"
  python3 "$ab" "$r" "page 1: cp.async, 2 stages per warp / register kernels" c2_1,c2_2 r_1,r_2
  python3 "$ab" "$r" "page 1: cp.async, 3 stages per warp / register kernels" c3_1,c3_2 r_1,r_2
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
