#!/usr/bin/env bash
# 04_layout_and_d256.sh OUT - (1) single long requests in the NHD and HND layouts (does the access
# pattern, 256-byte head vectors 2 KiB apart in NHD, cost the B1 steps their last 20%?); (2) d = 256
# on the heads-in-N kernel vs the heads-in-M kernel (PKV_DECODE_KERNEL=m), fused route.
set -u -o pipefail
out=${1:?usage: dev/probes/04_layout_and_d256.sh OUT}
build=${PKV_BUILD:-build-gpu}
for lay in nhd hnd; do
  for a in B1_N8192 B1_N32768 B1_N65536 B4_homo8K; do
    for r in split fused; do
      "$build/pkv" bench --backend cuda --layout $lay --anchor $a --route $r --reps 50 --quiet --no-check 2>/dev/null |
        awk -v l=$lay -F'|' 'NR>2 && NF>5 {print "layout=" l " |" $0}' | head -n 1
    done
  done
done
for k in n m; do
  if [ $k = m ]; then export PKV_DECODE_KERNEL=m; else unset PKV_DECODE_KERNEL; fi
  for a in B1_N8192 B1_N32768 B4_zipf B8_zipf B16_uniform B32_bimodal B64_uniform; do
    "$build/pkv" bench --backend cuda --shape d256 --anchor $a --route fused --reps 30 --quiet --no-check 2>/dev/null |
      awk -v k=$k -F'|' 'NR>2 && NF>5 {print "d256 kernel=" k " |" $0}' | head -n 1
  done
done
