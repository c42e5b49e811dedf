#!/usr/bin/env bash
# 21_nc_stale_loads.sh OUT - builds and runs dev/cuda/nc_stale.cu (can a non-coherent load return data that a
# copy overwrote between two kernels?  kernel-notes v13c); OUT/nc_stale.txt.  ~20 s on an H200.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/21_nc_stale_loads.sh OUT}
mkdir -p "$out"
b=$(mktemp -d)
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a "$root/dev/cuda/nc_stale.cu" -o "$b/probe" || exit 1
timeout 120 "$b/probe" | tee "$out/nc_stale.txt"
