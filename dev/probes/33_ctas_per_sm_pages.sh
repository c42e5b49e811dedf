#!/usr/bin/env bash
# 33_ctas_per_sm_pages.sh OUT - where does the wave of all resident CTAs start to pay?  dev/probes/32_ctas_per_sm_d64.sh: at
# d = 64, 4 CTAs per SM make single requests 6-17% faster at page 1 and change nothing at page 16.  Here d = 64
# at pages 2, 4 and 8 (4 per SM forced against the default), the paper shape at page 4 (3 per SM), one round.
# OUT/summary.txt, OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/33_ctas_per_sm_pages.sh OUT}" pkv -DBUILD_TESTING=OFF
{
  dev_probe_header dev/probes/33_ctas_per_sm_pages.sh
  for p in 2 4 8; do
    dev_bench "c4_d64_p$p" "$a/pkv" -- --shape 32:8:64 --page-size $p --ctas-per-unit 4
    dev_bench "dflt_d64_p$p" "$a/pkv" -- --shape 32:8:64 --page-size $p
  done
  dev_bench "c3_paper_p4" "$a/pkv" -- --shape paper --page-size 4 --ctas-per-unit 3
  dev_bench "dflt_paper_p4" "$a/pkv" -- --shape paper --page-size 4
  for p in 2 4 8; do
    python3 "$dev_root/dev/lib/ab_table.py" "$r" "d = 64, page $p: 4 CTAs per SM forced / the planner's default" "c4_d64_p$p" "dflt_d64_p$p"
  done
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "paper, page 4: 3 CTAs per SM forced / the planner's default" c3_paper_p4 dflt_paper_p4
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
