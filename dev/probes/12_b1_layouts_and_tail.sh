#!/usr/bin/env bash
# 12_b1_layouts_and_tail.sh OUT - single long requests (B1 32K-128K): NHD against HND pages, and per-CTA
# timelines of the split and fused routes at 64K (where the merge tail goes since kernel v7).
# Everything lands in OUT/probe.tgz and OUT/summary.txt.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/12_b1_layouts_and_tail.sh OUT}
r=$(mktemp -d)
b=$root/build-gpu; tl=$root/build-tl
. "$root/dev/lib/build.sh"
dev_build "$b" "$r/build.log" pkv -DBUILD_TESTING=OFF &
dev_build "$tl" "$r/build_tl.log" pkv -DBUILD_TESTING=OFF -DPKV_TIMELINE=ON &
wait
[ -x "$b/pkv" ] && [ -x "$tl/pkv" ] || { tail -n 40 "$r/build.log" "$r/build_tl.log"; exit 1; }
S="$r/summary.txt"
echo "== layouts (kernel us, 200 reps; pages floor per layout)" | tee "$S"
for lay in nhd hnd; do
  for a in B1_N32768 B1_N65536 B1_N131072 B4_homo32K; do
    for rt in split fused auto; do
      "$b/pkv" bench --backend cuda --anchor $a --route $rt --layout $lay --reps 200 --wall-reps 5 --quiet \
        --json "$r/lay_${lay}_${a}_$rt.json" 2>>"$r/bench.log" | awk -v l=$lay -F'|' 'NR>2 && NF>5 {print "layout=" l " |" $0}'
    done
  done
done | tee -a "$S"
echo "== timelines (nhd)" | tee -a "$S"
for a in B1_N32768 B1_N65536; do
  for rt in split fused; do
    PKV_TIMELINE_OUT="$r/tl_${a}_$rt.csv" "$tl/pkv" bench --backend cuda --anchor $a --route $rt --reps 5 --warmup 2 \
      --wall-reps 1 --no-check --quiet >"$r/tl_${a}_$rt.md" 2>>"$r/bench.log"
  done
done
python3 "$root/dev/lib/timeline_summary.py" "$r"/tl_*.csv | tee -a "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >>"$S" 2>&1
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
