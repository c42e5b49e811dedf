#!/usr/bin/env bash
# test.sh - the README's test command, and CI's (.ci/run): builds PersistentKV and runs every test, in three
# stages (docs/testing.md):
#   1. CTest on a Release build: planner, CPU backend, traces, errors, the pkv tool, the Python binding, the
#      install, and the fuzz targets' corpus replays, for real; the GPU tests skip (visibly) without a GPU;
#   2. sanitizers (scripts/sanitize.sh): the C tests, the pkv tool's tests and the corpus replays under
#      ASan + UBSan (+ LeakSanitizer), test_threads and test_cpu under TSan - fewer random cases
#      (PKV_TEST_SANITIZE=1), the same code paths;
#   3. fuzzing (scripts/fuzz.sh --ci): each libFuzzer target ~45 s from its seed corpus (clang).
# PKV_TEST_QUICK=1 runs stage 1 only; arguments go to stage 1's ctest (e.g. -R test_plan).
# Sets up what the tests need on a fresh machine: a virtual environment with pytest and numpy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PKV_BUILD_DIR:-$root/build}
venv=${PKV_VENV:-$root/.venv}
stage_start=$SECONDS
stage_done() { echo "== stage $1 ($2): $((SECONDS - stage_start)) s"; stage_start=$SECONDS; }

echo "== stage 1: ctest, Release"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import pytest, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check pytest numpy
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$venv/bin/python" >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >"$build.log" 2>&1 || { tail -n 30 "$build.log"; exit 1; }
status=0
(cd "$build" && ctest --output-on-failure "$@") || status=$?
# make skipped GPU tests say why
grep -h "^SKIP" "$build/Testing/Temporary/LastTest.log" 2>/dev/null | sed 's/^/test_cuda: /' || true
stage_done 1 ctest
if [ "${PKV_TEST_QUICK:-0}" = 1 ]; then exit $status; fi

echo "== stage 2: sanitizers"
"$root/scripts/sanitize.sh" || status=1
stage_done 2 sanitizers

echo "== stage 3: fuzzing"
"$root/scripts/fuzz.sh" --ci || status=1
stage_done 3 fuzzing
exit $status
