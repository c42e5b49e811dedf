#!/usr/bin/env bash
# 32_ctas_per_sm_d64.sh OUT - dev/probes/31_ctas_per_sm_page1.sh found d = 64 single requests 6-14% faster at page 1 with 3 CTAs
# per SM forced (B1_N131072 76.1 against 88.7 us) where the planner fills 2 per SM (its wave counts the d = 128
# kernel's residency; the d = 64 kernels hold 4).  Here: 3 and 4 per SM against the default at d = 64 (32:8:64)
# at page 16 and page 1, and 3 against the default for the paper shape at page 16, two alternating rounds.
# Only B1 and the even batches of one wave compare like for like (a forced value turns the ragged rules off).
# OUT/summary.txt, OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/32_ctas_per_sm_d64.sh OUT}" pkv -DBUILD_TESTING=OFF
{
  dev_probe_header dev/probes/32_ctas_per_sm_d64.sh
  for k in 1 2; do
    for p in 16 1; do
      dev_bench "c3_d64_p${p}_$k" "$a/pkv" -- --shape 32:8:64 --page-size $p --ctas-per-unit 3
      dev_bench "c4_d64_p${p}_$k" "$a/pkv" -- --shape 32:8:64 --page-size $p --ctas-per-unit 4
      dev_bench "dflt_d64_p${p}_$k" "$a/pkv" -- --shape 32:8:64 --page-size $p
    done
    dev_bench "c3_paper_p16_$k" "$a/pkv" -- --shape paper --ctas-per-unit 3
    dev_bench "dflt_paper_p16_$k" "$a/pkv" -- --shape paper
  done
  for p in 16 1; do
    for c in 3 4; do
      python3 "$dev_root/dev/lib/ab_table.py" "$r" "d = 64, page $p: $c CTAs per SM forced / the planner's default" \
        "c${c}_d64_p${p}_1,c${c}_d64_p${p}_2" "dflt_d64_p${p}_1,dflt_d64_p${p}_2"
    done
  done
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "paper, page 16: 3 CTAs per SM forced / the planner's default" \
    "c3_paper_p16_1,c3_paper_p16_2" "dflt_paper_p16_1,dflt_paper_p16_2"
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
