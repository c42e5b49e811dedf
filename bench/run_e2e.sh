#!/usr/bin/env bash
# bench/run_e2e.sh OUT_DIR [more options for bench/e2e_flashinfer.py]
#
# On the GPU machine: installs the carried FlashInfer wheels (.whl, see bench/FLASHINFER.md), builds
# libpersistentkv and its lab library with CUDA for sm_90a while FlashInfer's JIT modules for the chosen paths
# compile in parallel, then runs bench/e2e_flashinfer.py (the end-to-end decode loop, ours and FlashInfer's
# attention side by side) inside the time limit.
#
# Device call (repo root, carry [".whl"]):
#   PKV_COMMIT=<commit> bash bench/run_e2e.sh $OUT
#   PKV_COMMIT=<commit> bash bench/run_e2e.sh $OUT --layers 8 --families long --batches 1,8,32
# Files written to OUT_DIR: e2e.json, e2e.md, e2e.png (when matplotlib imports), run_e2e.log and, with
# PKV_SAVE_FI_CACHE=1, fi-cache.tgz (FlashInfer's compiled modules, when under 16 MiB).
#
# Environment:
#   PKV_TIME_LIMIT_S   seconds the whole script may take (default 570: the device tool stops a command at
#                      600 s); the benchmark gets what is left after install, build and JIT as --max-minutes,
#                      starts no cell that would end after it and still writes its outputs
#   PKV_COMMIT         commit recorded in e2e.json (the copy on the GPU machine has no .git)
#   PKV_FLASHINFER_CACHE, PKV_FLASHINFER_CACHE_TGZ   as in bench/install_wheelhouse.sh
#                      (default cache: build-gpu/fi-cache, kept while the machine stays warm)
#   PKV_SAVE_FI_CACHE=1  tar the JIT cache into OUT_DIR/fi-cache.tgz at the end
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: bench/run_e2e.sh OUT_DIR [e2e_flashinfer.py options]" >&2
  exit 2
fi
T0=$(date +%s)
OUT=$1
shift
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$REPO/bench/gpu_bench_lib.sh"
gpu_bench_init e2e
say() { echo "[run_e2e +$(elapsed)s] $*"; }

run() {
  cd "$REPO" || return 1
  say "repo $REPO, out $OUT, limit ${LIMIT}s, options: $*"
  # 1. the machine, FlashInfer from the carried wheels, nvcc
  gpu_bench_setup || return 1

  # 2. FlashInfer's JIT modules for the chosen paths (and its append), compiled while the library builds
  python3 bench/e2e_flashinfer.py --jit-warmup-only "$@" &
  local jit_pid=$!

  # 3. the library and the lab library (traces, page manager helpers) with CUDA, for sm_90a
  gpu_bench_build "$jit_pid" run_e2e || return 1

  # 4. the decode loops, inside what is left of the time limit
  local maxmin
  maxmin=$(gpu_bench_minutes_left 25)
  say "running the decode loops (--max-minutes $maxmin)"
  python3 bench/e2e_flashinfer.py --out "$OUT" --max-minutes "$maxmin" "$@" | tee "$TABLE"
  local rc=${PIPESTATUS[0]}
  say "e2e_flashinfer.py exited with $rc"

  gpu_bench_finish
  return "$rc"
}

gpu_bench_main run_e2e.log "$@"
