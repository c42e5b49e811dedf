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
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LIMIT=${PKV_TIME_LIMIT_S:-570}
export PYTHONUNBUFFERED=1
export FLASHINFER_NO_DOWNLOAD=1
export PKV_FLASHINFER_CACHE="${PKV_FLASHINFER_CACHE:-$REPO/build-gpu/fi-cache}"
TABLE=$(mktemp /tmp/pkv-e2e-table.XXXXXX)

elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "[run_e2e +$(elapsed)s] $*"; }

run() {
  cd "$REPO" || return 1
  say "repo $REPO, out $OUT, limit ${LIMIT}s, options: $*"
  nvidia-smi -L 2>/dev/null || say "nvidia-smi not available"
  say "$(python3 --version 2>&1), $(nproc) cores"

  # 1. FlashInfer from the carried wheels (prints the export lines on stdout)
  local exports
  if ! exports="$(bash bench/install_wheelhouse.sh "$REPO/.whl")"; then
    say "installing the FlashInfer wheels failed (carry .whl: run(..., carry=[\".whl\"]))"
    return 1
  fi
  eval "$exports"
  if ! command -v nvcc >/dev/null 2>&1; then
    for d in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-13.0; do
      if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then export PATH="$d/bin:$PATH"; break; fi
    done
  fi
  say "nvcc: $(command -v nvcc || echo missing) $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*')"

  # 2. FlashInfer's JIT modules for the chosen paths (and its append), compiled while the library builds
  python3 bench/e2e_flashinfer.py --jit-warmup-only "$@" &
  local jit_pid=$!

  # 3. the library and the lab library (traces, page manager helpers) with CUDA, for sm_90a
  say "building libpersistentkv and libpersistentkv_lab (build-gpu, sm_90a)"
  if ! { cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a-real -DCMAKE_BUILD_TYPE=Release \
         && cmake --build build-gpu -j "$(nproc)" --target persistentkv persistentkv_lab; }; then
    say "library build failed"
    kill "$jit_pid" 2>/dev/null
    wait "$jit_pid" 2>/dev/null
    return 1
  fi
  export PKV_LIBRARY="$REPO/build-gpu/libpersistentkv.so"
  python3 -c "import sys; sys.path.insert(0, 'python'); import persistentkv as p; \
print('[run_e2e] persistentkv', p.__version__, p.library_path, 'cuda', p.cuda_available(), 'traces', p.TRACE_FAMILIES); \
sys.exit(0 if p.cuda_available() else 1)" || { say "the library has no CUDA backend or sees no GPU"; return 1; }
  say "library built; waiting for the FlashInfer JIT warm-up"
  wait "$jit_pid" || say "JIT warm-up exited with $? (the benchmark compiles what is missing on first use)"

  # 4. the decode loops, inside what is left of the time limit
  local left maxmin
  left=$(( LIMIT - $(elapsed) - 25 ))
  [ "$left" -lt 60 ] && left=60
  maxmin=$(python3 -c "print(round($left / 60.0, 2))")
  say "running the decode loops (--max-minutes $maxmin)"
  python3 bench/e2e_flashinfer.py --out "$OUT" --max-minutes "$maxmin" "$@" | tee "$TABLE"
  local rc=${PIPESTATUS[0]}
  say "e2e_flashinfer.py exited with $rc"

  if [ "${PKV_SAVE_FI_CACHE:-0}" = 1 ] && [ -d "$PKV_FLASHINFER_CACHE/.cache" ]; then
    tar czf "$OUT/fi-cache.tgz" -C "$PKV_FLASHINFER_CACHE" .cache
    local sz
    sz=$(stat -c %s "$OUT/fi-cache.tgz")
    if [ "$sz" -gt $((16 * 1024 * 1024)) ]; then
      say "fi-cache.tgz is $sz bytes, over the 16 MiB the device tool returns: removed"
      rm -f "$OUT/fi-cache.tgz"
    else
      say "saved the FlashInfer JIT cache ($sz bytes): carry it and set PKV_FLASHINFER_CACHE_TGZ"
    fi
  fi
  ls -l "$OUT"
  say "done in $(elapsed) s"
  # the short table last: the device tool returns the tail of the output
  echo
  [ -s "$TABLE" ] && cat "$TABLE"
  return "$rc"
}

run "$@" 2>&1 | tee -a "$OUT/run_e2e.log"
rc=${PIPESTATUS[0]}
rm -f "$TABLE"
exit "$rc"
