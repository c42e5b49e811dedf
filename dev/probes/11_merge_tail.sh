#!/usr/bin/env bash
# 11_merge_tail.sh OUT - where the time after a single request's tile loops goes: per-CTA timelines
# with the PKV_TL_MARK points (decode: tile loop done, fused arrival; merge: dependency wait
# returned, states combined) for the split, fused and work-queue routes on the B1 anchors, and the
# per-merge kernel (PKV_MERGE_KERNEL=row) on the split route.  OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/11_merge_tail.sh OUT}
r=$(mktemp -d)
tl=$root/build-tl
. "$root/dev/lib/build.sh"
dev_build "$tl" "$r/build_tl.log" pkv -DBUILD_TESTING=OFF -DPKV_TIMELINE=ON
[ -x "$tl/pkv" ] || { tail -n 40 "$r/build_tl.log"; exit 1; }
for a in B1_N2048 B1_N8192 B1_N32768 B1_N65536; do
  for rt in split fused workqueue; do
    PKV_TIMELINE_OUT="$r/tl_${a}_$rt.csv" "$tl/pkv" bench --backend cuda --anchor $a --route $rt --reps 5 --warmup 2 \
      --wall-reps 1 --no-check --quiet >"$r/tl_${a}_$rt.md" 2>>"$r/bench.log"
  done
  PKV_MERGE_KERNEL=row PKV_TIMELINE_OUT="$r/tl_${a}_split_rowmerge.csv" "$tl/pkv" bench --backend cuda --anchor $a \
    --route split --reps 5 --warmup 2 --wall-reps 1 --no-check --quiet >"$r/tl_${a}_split_rowmerge.md" 2>>"$r/bench.log"
done
python3 "$root/dev/lib/timeline_summary.py" "$r"/tl_*.csv | tee "$r/summary.txt"
cp "$r/summary.txt" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
