#!/usr/bin/env bash
# bench.sh [pkv bench options] - builds PersistentKV and runs the main job: `pkv bench`, by default a
# replay of the default trace (bimodal, B8, seed 20260623) on the best available backend (the GPU when
# there is one, else the CPU).  What it does goes to stderr as it goes; the job's tables to stdout.
#
# The CUDA kernels are built when nvcc is present and a GPU answers (nvidia-smi); with nvcc but no GPU
# the CPU path alone is built (seconds, where the kernels for four architectures take minutes).
#   PKV_BUILD_CUDA=1 / 0   build the CUDA backend or not, whatever is found
#   PKV_BUILD_DIR=DIR      the build folder (default: build, or build-cpu for a CPU-only build)
#   PKV_REBUILD=1          configure again before building
#   PKV_BENCH_DRY_RUN=1    say what would be built, build and run nothing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
say() { printf 'bench.sh: %s\n' "$*" >&2; }
rel() { case $1 in "$root"/*) printf '%s' "${1#"$root"/}" ;; *) printf '%s' "$1" ;; esac; } # paths as in the repository

nvcc_found() { command -v nvcc >/dev/null 2>&1 || [ -n "${CUDACXX:-}" ] || [ -x /usr/local/cuda/bin/nvcc ]; }
gpu_found() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

case "${PKV_BUILD_CUDA:-}" in
  1) cuda=ON; why="PKV_BUILD_CUDA=1"
     nvcc_found || say "PKV_BUILD_CUDA=1 but no nvcc found: CMake will build the CPU path only" ;;
  0) cuda=OFF; why="PKV_BUILD_CUDA=0" ;;
  "") if ! nvcc_found; then
        cuda=OFF; why="no nvcc"
      elif gpu_found; then
        cuda=ON; why="nvcc and a GPU"
      else
        cuda=OFF; why="nvcc but no GPU (nvidia-smi missing or failing); PKV_BUILD_CUDA=1 builds the kernels too (minutes)"
      fi ;;
  *) say "PKV_BUILD_CUDA takes 1 or 0, got '${PKV_BUILD_CUDA}'"; exit 2 ;;
esac
if [ "$cuda" = ON ]; then build=${PKV_BUILD_DIR:-$root/build}; else build=${PKV_BUILD_DIR:-$root/build-cpu}; fi
log=$build.log
say "CUDA backend $cuda ($why); build folder $(rel "$build")"
if [ -n "${PKV_BENCH_DRY_RUN:-}" ]; then say "dry run (PKV_BENCH_DRY_RUN): nothing built or run"; exit 0; fi

: >"$log"
# Configure when there is no build yet, on PKV_REBUILD, or when the build has the other CUDA setting.
cached=$(sed -n 's/^PKV_ENABLE_CUDA:BOOL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
if [ ! -f "$build/CMakeCache.txt" ] || [ -n "${PKV_REBUILD:-}" ] || [ "$cached" != "$cuda" ]; then
  say "configuring $(rel "$build")"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPKV_ENABLE_CUDA="$cuda" >>"$log" 2>&1 ||
    { tail -n 30 "$log" >&2; say "configure failed (log: $(rel "$log"))"; exit 1; }
fi

# The build, with a line every 30 s while it runs (the CUDA kernels take minutes on a few cores).
if [ "$cuda" = ON ]; then
  say "building pkv with $jobs jobs, CUDA kernels included: the first build takes minutes (log: $(rel "$log"))"
else
  say "building pkv (CPU path) with $jobs jobs (log: $(rel "$log"))"
fi
start=$SECONDS
next=30
cmake --build "$build" --target pkv -j "$jobs" >>"$log" 2>&1 & # the tool (and the library) only
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  if [ $((SECONDS - start)) -ge "$next" ]; then
    say "still building after $((SECONDS - start)) s $(grep -o '^\[ *[0-9]*%\]' "$log" | tail -n 1 || true)"
    next=$((next + 30))
  fi
done
if ! wait "$pid"; then
  tail -n 30 "$log" >&2
  say "build failed (log: $(rel "$log"))"
  exit 1
fi
say "built in $((SECONDS - start)) s; running: pkv bench $*"
exec "$build/pkv" bench "$@"
