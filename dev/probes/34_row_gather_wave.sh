#!/usr/bin/env bash
# 34_row_gather_wave.sh OUT - the planner's full wave for pages gathered row by row (kernel v18's planner rule:
# planner.c resolve_params) against the wave before it (PKV_ROW_GATHER_WAVE=0), two alternating rounds: d = 64 at
# pages 1, 4 and 16 (G 4) and page 1 at G 16 (32:2:64); test_cuda first (the rule changes the plans it checks).
# OUT/summary.txt, OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/34_row_gather_wave.sh OUT}" "pkv test_cuda" -DBUILD_TESTING=ON
{
  dev_probe_header dev/probes/34_row_gather_wave.sh
  PKV_TEST_CASES=40 timeout 200 "$a/tests/test_cuda" 2>&1 | tail -n 3
  for k in 1 2; do
    for c in "32:8:64 1" "32:8:64 4" "32:8:64 16" "32:2:64 1"; do
      set -- $c
      n="${1//:/_}_p$2"
      dev_bench "new_${n}_$k" "$a/pkv" -- --shape "$1" --page-size "$2"
      dev_bench "old_${n}_$k" "$a/pkv" PKV_ROW_GATHER_WAVE=0 -- --shape "$1" --page-size "$2"
    done
  done
  for n in 32_8_64_p1 32_8_64_p4 32_8_64_p16 32_2_64_p1; do
    python3 "$dev_root/dev/lib/ab_table.py" "$r" "$n: the full wave for row-gathered pages / PKV_ROW_GATHER_WAVE=0" \
      "new_${n}_1,new_${n}_2" "old_${n}_1,old_${n}_2"
  done
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
