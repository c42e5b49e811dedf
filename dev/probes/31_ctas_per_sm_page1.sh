#!/usr/bin/env bash
# 31_ctas_per_sm_page1.sh OUT - kernel v17's one loss on small grids (B1_N8192 at page 1: cp.async into tiles
# 2-3% behind the register kernels, ncu 39% of DRAM peak against 47%; kernel-notes v17) and g16's B8_bimodal
# at page 1 (0.96 of FlashInfer): does a wave of 3 CTAs per SM (the tensor-copy kernel at d <= 128 fits 3)
# hide the ring's per-tile wait where each CTA has few tiles?  Every anchor and route with the planner's
# CTAs per unit forced to 3 against the default (which plans 2 per SM, and 4 waves for ragged batches: a
# forced value turns that rule off, so only the B1 rows and even batches compare like for like), at page 1
# of the paper shape, d = 64 (32:8:64) and g16 (bf16).  OUT/summary.txt, OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/31_ctas_per_sm_page1.sh OUT}" pkv -DBUILD_TESTING=OFF
{
  dev_probe_header dev/probes/31_ctas_per_sm_page1.sh
  for s in paper 32:8:64 g16; do
    n=${s//:/_}
    dev_bench "c3_$n" "$a/pkv" PKV_DECODE_CPASYNC=default -- --shape "$s" --page-size 1 --ctas-per-unit 3
    dev_bench "dflt_$n" "$a/pkv" PKV_DECODE_CPASYNC=default -- --shape "$s" --page-size 1
  done
  for s in paper 32_8_64 g16; do
    python3 "$dev_root/dev/lib/ab_table.py" "$r" "$s, page 1: 3 CTAs per SM forced / the planner's default" "c3_$s" "dflt_$s"
  done
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
