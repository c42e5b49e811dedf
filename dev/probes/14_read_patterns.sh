#!/usr/bin/env bash
# 14_read_patterns.sh OUT - builds and runs dev/cuda/read_patterns.cu (how fast the KV bytes of a step
# come off scattered NHD pages, by access pattern, no attention math); OUT/read_patterns.txt.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/14_read_patterns.sh OUT}
. "$root/dev/lib/build.sh"
b=$(mktemp -d)
dev_build_read_probe "$b/probe" "$b/build.log" || exit 1
timeout 120 "$b/probe" | tee "$out/read_patterns.txt"
