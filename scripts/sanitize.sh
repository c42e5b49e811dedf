#!/usr/bin/env bash
# sanitize.sh - the host code under AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer: builds
# the CPU backend with -DPKV_SANITIZE=ON (no CUDA: the GPU check runs compute-sanitizer on the kernels)
# and runs every C test and the pkv tool's tests (the Python binding's tests are left out: an
# instrumented library cannot load into an uninstrumented python3).  Any report fails its test.
# ~10 min on 2 cores (test_cli and test_fuzz are the long ones; PKV_FUZZ_CASES=N shortens the fuzzer), then
# ~2 min of ThreadSanitizer (below).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PKV_SANITIZE_DIR:-$root/build-sanitize}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DPKV_SANITIZE=ON -DPKV_ENABLE_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >"$build.log" 2>&1 || { tail -n 30 "$build.log"; exit 1; }
cd "$build"
PKV_FUZZ_CASES=${PKV_FUZZ_CASES:-1500} ctest --output-on-failure "$@"

# ThreadSanitizer (clang; gcc 12's TSan cannot start under this kernel's 28-bit mmap randomization):
# the threading contract (test_threads: eight contexts at once, one plan shared) and the CPU backend's
# own thread pool (test_cpu runs every route on a 4-thread context); a race fails the run
tsan=${PKV_TSAN_DIR:-$root/build-tsan}
if command -v clang >/dev/null; then
  cmake -S "$root" -B "$tsan" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPKV_ENABLE_CUDA=OFF \
    -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
  cmake --build "$tsan" -j "$(nproc 2>/dev/null || echo 2)" --target test_threads test_cpu >"$tsan.log" 2>&1 ||
    { tail -n 30 "$tsan.log"; exit 1; }
  for t in test_threads test_cpu; do
    echo "ThreadSanitizer: $t"
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$tsan/tests/$t" | tail -n 1
  done
else
  echo "SKIP: clang not found; the ThreadSanitizer pass (test_threads, test_cpu) did not run"
fi
