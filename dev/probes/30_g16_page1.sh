#!/usr/bin/env bash
# 30_g16_page1.sh OUT - kernel v17 (cp.async into the whole-tile boxes on every grid) at G = 16, d = 128
# (g16: Hq 128, Hkv 8, bf16), page 1: the default against the register kernels there (PKV_DECODE_CPASYNC=0),
# every anchor and route, one round each (the side-by-side compare at 8d406f7 had g16 B8_bimodal at 0.96
# of FlashInfer's time; v17's small-grid probe covered G = 4 only).  OUT/summary.txt, OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/30_g16_page1.sh OUT}" pkv -DBUILD_TESTING=OFF
{
  dev_probe_header dev/probes/30_g16_page1.sh
  dev_bench dflt "$a/pkv" PKV_DECODE_CPASYNC=default -- --shape g16 --dtype bf16 --page-size 1
  dev_bench regs "$a/pkv" PKV_DECODE_CPASYNC=0 -- --shape g16 --dtype bf16 --page-size 1
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "g16 bf16, page 1: default (cp.async into tiles) / register kernels" \
    dflt regs
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
