#!/usr/bin/env bash
# bench/run_compare.sh OUT_DIR [quick|full] [more options for bench/compare_flashinfer.py]
#
# On the GPU machine: installs the carried FlashInfer wheels (.whl, see bench/FLASHINFER.md),
# builds libpersistentkv with CUDA for sm_90a while FlashInfer's JIT modules compile in parallel,
# then runs bench/compare_flashinfer.py and bench/plot_compare.py into OUT_DIR.
#
# Device call (repo root, carry [".whl"]):
#   PKV_COMMIT=<commit> bash bench/run_compare.sh $OUT full
# Files written to OUT_DIR (at most 5): compare.json, compare.md, compare.png, run_compare.log and,
# with PKV_SAVE_FI_CACHE=1, fi-cache.tgz (FlashInfer's compiled modules, when under 16 MiB).
#
# Environment:
#   PKV_TIME_LIMIT_S   seconds the whole script may take (default 570: the device tool stops a
#                      command at 600 s); the benchmark gets what is left after install, build and
#                      JIT as --max-minutes, stops starting new steps in time and still writes
#   PKV_COMMIT         commit recorded in compare.json (the copy on the GPU machine has no .git)
#   PKV_FLASHINFER_CACHE, PKV_FLASHINFER_CACHE_TGZ   as in bench/install_wheelhouse.sh
#                      (default cache: build-gpu/fi-cache, kept while the machine stays warm)
#   PKV_SAVE_FI_CACHE=1  tar the JIT cache into OUT_DIR/fi-cache.tgz at the end
#   PKV_ALLOW_NO_CUDA=1  go on without a CUDA library (only to test this script with --dry-run)
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: bench/run_compare.sh OUT_DIR [quick|full] [compare_flashinfer.py options]" >&2
  exit 2
fi
T0=$(date +%s)
OUT=$1
MATRIX=${2:-full}
shift
[ $# -gt 0 ] && shift
case "$MATRIX" in quick|full) ;; *) echo "run_compare.sh: matrix must be quick or full, not '$MATRIX'" >&2; exit 2 ;; esac
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$REPO/bench/gpu_bench_lib.sh"
gpu_bench_init compare
say() { echo "[run_compare +$(elapsed)s] $*"; }

run() {
  cd "$REPO" || return 1
  say "repo $REPO, matrix $MATRIX, out $OUT, limit ${LIMIT}s, extra args: $*"
  # 1. the machine, FlashInfer from the carried wheels, nvcc
  gpu_bench_setup || return 1

  # 2. FlashInfer's JIT modules, compiled in the background while the library builds
  python3 bench/compare_flashinfer.py --jit-warmup-only --matrix "$MATRIX" "$@" &
  local jit_pid=$!

  # 3. the library, with CUDA, for the H200
  gpu_bench_build "$jit_pid" run_compare || return 1
  # the same wrapper calls on FlashInfer and on persistentkv.flashinfer (drop-in parity), a few seconds
  python3 bench/check_flashinfer_api.py || say "check_flashinfer_api.py: persistentkv.flashinfer disagrees with FlashInfer"

  # 4. the comparison, inside what is left of the time limit
  local maxmin
  maxmin=$(gpu_bench_minutes_left 30)
  say "running the comparison (--max-minutes $maxmin)"
  python3 bench/compare_flashinfer.py --matrix "$MATRIX" --out "$OUT" --max-minutes "$maxmin" "$@" | tee "$TABLE"
  local rc=${PIPESTATUS[0]}
  say "compare_flashinfer.py exited with $rc"

  # 5. the plot
  if [ -f "$OUT/compare.json" ]; then
    python3 bench/plot_compare.py "$OUT/compare.json" --out "$OUT/compare.png" || say "plot failed"
  fi
  gpu_bench_finish
  return "$rc"
}

gpu_bench_main run_compare.log "$@"
