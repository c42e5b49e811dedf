#!/usr/bin/env bash
# test.sh - builds PersistentKV and runs every test with CTest: planner, CPU backend, traces,
# errors, the pkv tool and the Python binding for real; the GPU tests skip (visibly) without a GPU.
# Sets up what the tests need on a fresh machine: a virtual environment with pytest and numpy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PKV_BUILD_DIR:-$root/build}
venv=${PKV_VENV:-$root/.venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import pytest, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check pytest numpy
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$venv/bin/python" >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >"$build.log" 2>&1 || { tail -n 30 "$build.log"; exit 1; }
cd "$build"
status=0
ctest --output-on-failure "$@" || status=$?
# make skipped GPU tests say why
grep -h "^SKIP" Testing/Temporary/LastTest.log 2>/dev/null | sed 's/^/test_cuda: /' || true
exit $status
