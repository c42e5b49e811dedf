#!/usr/bin/env bash
# gpu_sanitize.sh BUILD_DIR LOG_DIR - compute-sanitizer over test_cuda on a reduced set (rows clamped to
# 1500 tokens), every tool that applies to the kernels: memcheck (out-of-bounds and misaligned accesses,
# leaks of device memory), racecheck (shared-memory hazards), initcheck (reads of device memory nothing
# wrote) and synccheck (barriers used where not every thread reaches them); and test_append_cuda (the
# append and page-copy kernels) under memcheck and initcheck.  Two tools at a time, as two processes on
# the GPU.  Writes LOG_DIR/sanitizer.log (all the logs) and prints each summary;
# exits 1 if a tool reports anything or a test fails under it.  Called by scripts/gpu_check.sh.
set -u -o pipefail
build=${1:?usage: scripts/gpu_sanitize.sh BUILD_DIR LOG_DIR}
log=${2:?usage: scripts/gpu_sanitize.sh BUILD_DIR LOG_DIR}
mkdir -p "$log"
if ! command -v compute-sanitizer >/dev/null; then
  echo "compute-sanitizer not found" | tee "$log/sanitizer.log"; exit 1
fi
status=0
# run TOOL CASES [TUNING]: one tool over CASES random problems plus the fixed cases, with PKV_TUNING=TUNING
# (src/core/tuning.c), into LOG/TOOL.log (TOOL-registers.log for the run with tma=0).  Three processes at a
# time: memcheck in the default setting (tensor copies, and cp.async into the whole-tile boxes) and with the
# register kernels everywhere (tma=0: the kernels of sm_80-89 GPUs), racecheck in the default setting (the
# shared-memory ring's stages and barriers); then initcheck over the register kernels and synccheck in the
# default setting.
run() { # TOOL CASES [TUNING]
  local name=$1
  [ "${3:-}" = tma=0 ] && name=$1-registers
  PKV_TUNING="${3:-}" PKV_TEST_SMALL=1 PKV_TEST_CASES=$2 timeout 300 compute-sanitizer --tool "$1" --error-exitcode 9 \
    "$build/tests/test_cuda" >"$log/$name.log" 2>&1
}
run memcheck 3 & a=$!
run memcheck 2 tma=0 & b=$!
run racecheck 1 || status=1
wait $a || status=1
wait $b || status=1
run initcheck 2 tma=0 & a=$!
run synccheck 2 || status=1
wait $a || status=1
# the append and page-copy kernels (test_append_cuda): out-of-bounds writes, and reads of unwritten memory
for tool in memcheck initcheck; do
  PKV_TEST_CASES=6 timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/test_append_cuda" \
    >"$log/$tool-append.log" 2>&1 || status=1
done
: >"$log/sanitizer.log"
for tool in memcheck memcheck-registers racecheck initcheck-registers synccheck memcheck-append initcheck-append; do
  cat "$log/$tool.log" >>"$log/sanitizer.log"
  # the tool's summary line and test_cuda's count, each prefixed by the tool's name
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed, " "$log/$tool.log" | sed "s/^/$tool: /"
  grep -qE "(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)" "$log/$tool.log" || status=1
  grep -q " 0 failed" "$log/$tool.log" || status=1
done
exit $status
