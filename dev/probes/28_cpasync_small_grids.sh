#!/usr/bin/env bash
# 28_cpasync_small_grids.sh OUT - v16's cp.async fill into the whole-tile boxes on small grids at d = 64/128
# (kernel-notes v16: the grid rule - registers on grids of up to 2 CTAs per SM - was measured on v15's
# token-major rows only): builds pkv (sm_90a); then every anchor and route, alternating over two rounds,
# with cp.async on every grid (PKV_DECODE_CPASYNC=all) against the default (the same kernels on larger
# grids, the register kernels on small ones), at page sizes 1 and 4 of the paper shape and page 1 of d = 64
# (32:8:64).  Only the rows whose grid is small differ.  OUT/summary.txt, OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/28_cpasync_small_grids.sh OUT}" pkv -DBUILD_TESTING=OFF
{
  dev_probe_header dev/probes/28_cpasync_small_grids.sh
  for k in 1 2; do
    dev_bench all_p1_$k "$a/pkv" PKV_DECODE_CPASYNC=all -- --page-size 1
    dev_bench dflt_p1_$k "$a/pkv" PKV_DECODE_CPASYNC=default -- --page-size 1
    dev_bench all_p4_$k "$a/pkv" PKV_DECODE_CPASYNC=all -- --page-size 4
    dev_bench dflt_p4_$k "$a/pkv" PKV_DECODE_CPASYNC=default -- --page-size 4
    dev_bench all_d64_$k "$a/pkv" PKV_DECODE_CPASYNC=all -- --shape 32:8:64 --page-size 1
    dev_bench dflt_d64_$k "$a/pkv" PKV_DECODE_CPASYNC=default -- --shape 32:8:64 --page-size 1
  done
  ab="$dev_root/dev/lib/ab_table.py"
  python3 "$ab" "$r" "paper, page 1: cp.async on every grid / default (registers on small grids)" all_p1_1,all_p1_2 dflt_p1_1,dflt_p1_2
  python3 "$ab" "$r" "paper, page 4: cp.async on every grid / default" all_p4_1,all_p4_2 dflt_p4_1,dflt_p4_2
  python3 "$ab" "$r" "d = 64 (32:8:64), page 1: cp.async on every grid / default" all_d64_1,all_d64_2 dflt_d64_1,dflt_d64_2
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
