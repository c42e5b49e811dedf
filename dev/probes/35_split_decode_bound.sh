#!/usr/bin/env bash
# 35_split_decode_bound.sh OUT - how fast a split decode of B1_N32768 could be at all: dev/cuda/read_patterns.cu's
# bound section (a read of the step's K and V with no attention math - contiguous, the pages floor's warp per
# page, the decode's own mapping - alone and followed by the cheapest dependent merge, timed as pkv bench
# times a step), next to pkv bench's B1_N32768 (every route, its pages floor) in the same process order:
# bound, bench, bound, bench.  OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/35_split_decode_bound.sh OUT}
. "$root/dev/lib/build.sh"
dev_probe_start "$out" pkv -DBUILD_TESTING=OFF
dev_build_read_probe "$r/probe" "$r/probe_build.log" || exit 1
{
  dev_probe_header dev/probes/35_split_decode_bound.sh
  for k in 1 2; do
    echo "== bound, pass $k"
    timeout 120 "$r/probe" bound
    echo "== pkv bench B1_N32768, pass $k"
    timeout 120 "$a/pkv" bench --backend cuda --anchor B1_N32768 --route all --reps 200 --wall-reps 5 \
      --json "$r/bench_$k.json" 2>>"$r/bench.log"
  done
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
