#!/usr/bin/env bash
# sanitize.sh - the host code under AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer: builds
# the CPU backend with -DPKV_SANITIZE=ON (no CUDA: the GPU check runs compute-sanitizer on the kernels)
# and runs every C test and the pkv tool's tests (the Python binding's tests are left out: an
# instrumented library cannot load into an uninstrumented python3).  Any report fails its test.
# ~10 min on 2 cores (test_cli and test_fuzz are the long ones; PKV_FUZZ_CASES=N shortens the fuzzer).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PKV_SANITIZE_DIR:-$root/build-sanitize}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DPKV_SANITIZE=ON -DPKV_ENABLE_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >"$build.log" 2>&1 || { tail -n 30 "$build.log"; exit 1; }
cd "$build"
PKV_FUZZ_CASES=${PKV_FUZZ_CASES:-1500} ctest --output-on-failure "$@"
