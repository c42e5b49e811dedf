#!/usr/bin/env bash
# probe_read_patterns.sh OUT - builds and runs dev/probe_read_patterns.cu (how fast the KV bytes of a step
# come off scattered NHD pages, by access pattern, no attention math); OUT/read_patterns.txt.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_read_patterns.sh OUT}
b=$(mktemp -d)
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$root/include" -I"$root/src/core" -I"$root/src/cuda" \
  "$root/dev/probe_read_patterns.cu" -o "$b/probe" || exit 1
timeout 120 "$b/probe" | tee "$out/read_patterns.txt"
