#!/usr/bin/env bash
# soak.sh OUT_DIR [soak options] - the GPU soak (tests/soak.c) on a machine with a GPU and the CUDA toolkit:
# builds (sm_90a unless PKV_CUDA_ARCH says otherwise), then >= 100000 random steps on the CUDA backend, each
# sampled step checked against the float64 reference, device memory checked for leaks; OUT_DIR/soak.json.
set -euo pipefail
out=${1:?usage: scripts/soak.sh OUT_DIR [soak options]}
shift
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PKV_BUILD_DIR:-$root/build-gpu}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${PKV_CUDA_ARCH:-90a-real}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target soak >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
export PKV_COMMIT=${PKV_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
"$build/tests/soak" --backend cuda --steps 100000 --sample 25 --json "$out/soak.json" "$@"
