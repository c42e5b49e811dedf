#!/usr/bin/env bash
# sanitize.sh - the host code under AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer: builds
# the CPU backend with -DPKV_SANITIZE=ON (RelWithDebInfo: -O2 -g; no CUDA: the GPU check runs
# compute-sanitizer's four tools on the kernels) and runs every C test, the pkv tool's tests and the fuzz
# targets' corpus replays (the Python binding's tests are left out: an instrumented library cannot load into
# an uninstrumented python3).  Any report fails its test.  PKV_TEST_SANITIZE=1 trims the random case counts
# of test_cpu and test_fuzz, not the code paths they reach.  Then ThreadSanitizer (below).  Stage 2 of
# scripts/test.sh; arguments go to ctest (e.g. -R test_plan).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PKV_SANITIZE_DIR:-$root/build-sanitize}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPKV_SANITIZE=ON -DPKV_ENABLE_CUDA=OFF >/dev/null
cmake --build "$build" -j "$jobs" >"$build.log" 2>&1 || { tail -n 30 "$build.log"; exit 1; }
status=0
(cd "$build" && PKV_TEST_SANITIZE=${PKV_TEST_SANITIZE:-1} ctest -j "$jobs" --output-on-failure "$@") || status=1

# ThreadSanitizer (clang; gcc 12's TSan cannot start under this kernel's 28-bit mmap randomization):
# the threading contract (test_threads: eight contexts at once, one plan shared) and the CPU backend's
# own thread pool (test_cpu runs every route on a 4-thread context); a race fails the run
tsan=${PKV_TSAN_DIR:-$root/build-tsan}
if command -v clang >/dev/null; then
  cmake -S "$root" -B "$tsan" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPKV_ENABLE_CUDA=OFF \
    -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >/dev/null
  cmake --build "$tsan" -j "$jobs" --target test_threads test_cpu >"$tsan.log" 2>&1 ||
    { tail -n 30 "$tsan.log"; exit 1; }
  for t in test_threads test_cpu; do
    echo "ThreadSanitizer: $t"
    if ! PKV_TEST_SANITIZE=${PKV_TEST_SANITIZE:-1} TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
         "$tsan/tests/$t" >"$tsan/$t.out" 2>&1; then
      tail -n 40 "$tsan/$t.out"
      status=1
    fi
    tail -n 1 "$tsan/$t.out"
  done
else
  echo "SKIP: clang not found; the ThreadSanitizer pass (test_threads, test_cpu) did not run"
fi
exit $status
