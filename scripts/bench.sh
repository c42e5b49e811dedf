#!/usr/bin/env bash
# bench.sh [pkv bench options] - builds PersistentKV (CUDA when nvcc is present) and runs the main
# job: `pkv bench`, by default a replay of the default trace (bimodal, B8, seed 20260623) on the
# best available backend (the GPU when there is one, else the CPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PKV_BUILD_DIR:-$root/build}
if [ ! -x "$build/pkv" ] || [ -n "${PKV_REBUILD:-}" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >"$build.log" 2>&1 || { tail -n 30 "$build.log"; exit 1; }
else
  cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >"$build.log" 2>&1 || { tail -n 30 "$build.log"; exit 1; }
fi
exec "$build/pkv" bench "$@"
