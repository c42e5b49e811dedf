#!/usr/bin/env bash
# fuzz.sh - runs every fuzz target (fuzz/fuzz_<name>.c) under libFuzzer with ASan and UBSan (clang),
# each from its seed corpus fuzz/corpus/<name>/ (docs/testing.md).
#
#   scripts/fuzz.sh --ci              each target PKV_FUZZ_SECONDS (default 45) seconds, two at a time;
#                                     new inputs go to a scratch corpus outside the repository
#   scripts/fuzz.sh --long [SECONDS]  each target SECONDS (default 3600), one at a time, all cores to it
#                                     (-fork); then the new inputs that add coverage are merged into
#                                     fuzz/corpus/<name>/ (-merge=1) for you to review and commit
#   scripts/fuzz.sh ... TARGET...     only these targets (plan, trace, ...)
#
# A crash, leak, timeout or failed property fails the run; the input is kept as
# $PKV_FUZZ_DIR/crashes/<name>-crash-<sha1> and the fuzzer's report printed.  Make it a regression: copy it
# to fuzz/corpus/<name>/regress-<what>, fix the bug, and `ctest -R fuzz_<name>` replays it in every build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PKV_FUZZ_BUILD_DIR:-$root/build-fuzz}
mode=ci
seconds=${PKV_FUZZ_SECONDS:-45}
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --ci) mode=ci; shift ;;
    --long) mode=long; seconds=3600; shift
            if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then seconds=$1; shift; fi ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
cc=${PKV_FUZZ_CC:-clang}
if ! command -v "$cc" >/dev/null; then
  echo "SKIP: $cc not found; the libFuzzer runs did not happen (the corpora still replay in ctest)"
  exit 0
fi
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPKV_ENABLE_CUDA=OFF \
  -DPKV_FUZZ_LIBFUZZER=ON >/dev/null
if [ ${#targets[@]} -eq 0 ]; then
  for src in "$root"/fuzz/fuzz_*.c; do n=$(basename "$src" .c); targets+=("${n#fuzz_}"); done
fi
exes=()
for name in "${targets[@]}"; do exes+=("fuzz_${name}_libfuzzer"); done
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target "${exes[@]}" >"$build.log" 2>&1 ||
  { tail -n 30 "$build.log"; exit 1; }

# scratch corpora and logs outside the repository (tmpfs when there is one)
work=${PKV_FUZZ_DIR:-$(mktemp -d "$( [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/pkv-fuzz.XXXXXX")}
mkdir -p "$work/crashes"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1
# -malloc_limit_mb: one allocation above it is a failure (a file's header must not size memory alone)
flags=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1)

run_one() { # name seconds extra-flags...
  local name=$1 secs=$2; shift 2
  local exe="$build/fuzz/fuzz_${name}_libfuzzer" corpus="$work/corpus-$name" log="$work/$name.log"
  mkdir -p "$corpus" "$work/artifacts-$name"
  local rc=0
  (cd "$work" && TMPDIR="$work" "$exe" "${flags[@]}" "$@" -max_total_time="$secs" \
     -artifact_prefix="$work/artifacts-$name/" "$corpus" "$root/fuzz/corpus/$name") >"$log" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    for a in "$work/artifacts-$name"/*; do [ -e "$a" ] && cp "$a" "$work/crashes/$name-$(basename "$a")"; done
    echo "fuzz_$name: FAILED (exit $rc); input(s) in $work/crashes; the report:"
    grep -E -A 30 'ERROR|fuzz property failed|runtime error|Timeout|out-of-memory' "$log" | head -n 60
    return 1
  fi
  echo "fuzz_$name: ok, $secs s ($(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?') runs, corpus $(ls "$corpus" | wc -l) new inputs)"
}

status=0
if [ $mode = ci ]; then
  # two at a time (a 2-core CI machine): the slowest pair sets the wall time
  jobs=${PKV_FUZZ_JOBS:-2}
  pids=() names=()
  for name in "${targets[@]}"; do
    run_one "$name" "$seconds" & pids+=($!) names+=("$name")
    if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
else
  for name in "${targets[@]}"; do
    run_one "$name" "$seconds" -fork="$(nproc 2>/dev/null || echo 2)" -ignore_crashes=0 || status=1
    # keep what adds coverage, minimised, in the repository's corpus (review, then commit)
    before=$(ls "$root/fuzz/corpus/$name" | wc -l)
    "$build/fuzz/fuzz_${name}_libfuzzer" -merge=1 "${flags[@]}" "$root/fuzz/corpus/$name" "$work/corpus-$name" \
      >"$work/$name-merge.log" 2>&1 || true
    echo "fuzz_$name: corpus $before -> $(ls "$root/fuzz/corpus/$name" | wc -l) files after the merge"
  done
fi
if [ $status -eq 0 ] && [ -z "${PKV_FUZZ_DIR:-}" ]; then rm -rf "$work"; fi
exit $status
