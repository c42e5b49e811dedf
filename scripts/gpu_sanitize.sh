#!/usr/bin/env bash
# gpu_sanitize.sh BUILD_DIR LOG_DIR - compute-sanitizer over test_cuda on a reduced set (rows clamped to
# 1500 tokens), every tool that applies to the kernels: memcheck (out-of-bounds and misaligned accesses,
# leaks of device memory), racecheck (shared-memory hazards), initcheck (reads of device memory nothing
# wrote) and synccheck (barriers used where not every thread reaches them).  Two tools at a time, as
# two processes on the GPU.  Writes LOG_DIR/sanitizer.log (all four logs) and prints each summary;
# exits 1 if a tool reports anything or a test fails under it.  Called by scripts/gpu_check.sh.
set -u -o pipefail
build=${1:?usage: scripts/gpu_sanitize.sh BUILD_DIR LOG_DIR}
log=${2:?usage: scripts/gpu_sanitize.sh BUILD_DIR LOG_DIR}
mkdir -p "$log"
if ! command -v compute-sanitizer >/dev/null; then
  echo "compute-sanitizer not found" | tee "$log/sanitizer.log"; exit 1
fi
status=0
# run TOOL CASES [ENV...]: one tool over CASES random problems plus the fixed cases (memcheck, racecheck and
# synccheck with the cp.async ring on every grid: by default the tests' small grids at d = 64/128 run the
# register kernels there, which initcheck then covers; the register kernels' other shapes run under every
# tool; cp.async fills the whole-tile boxes by default, and racecheck runs it into token-major rows)
run() { # TOOL CASES [ENV...]
  env "${@:3}" PKV_TEST_SMALL=1 PKV_TEST_CASES=$2 timeout 300 compute-sanitizer --tool "$1" --error-exitcode 9 \
    "$build/tests/test_cuda" >"$log/$1.log" 2>&1
}
run memcheck 4 PKV_DECODE_CPASYNC=all & a=$!
run racecheck 1 PKV_DECODE_CPASYNC=all PKV_CPASYNC_LAYOUT=rows || status=1
wait $a || status=1
run initcheck 2 & a=$!
run synccheck 2 PKV_DECODE_CPASYNC=all || status=1
wait $a || status=1
: >"$log/sanitizer.log"
for tool in memcheck racecheck initcheck synccheck; do
  cat "$log/$tool.log" >>"$log/sanitizer.log"
  # the tool's summary line and test_cuda's count, each prefixed by the tool's name
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed, " "$log/$tool.log" | sed "s/^/$tool: /"
  grep -qE "(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)" "$log/$tool.log" || status=1
  grep -q " 0 failed" "$log/$tool.log" || status=1
done
exit $status
