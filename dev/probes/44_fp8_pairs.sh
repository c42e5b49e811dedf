#!/usr/bin/env bash
# 44_fp8_pairs.sh OUT - one device call (carry .whl) for an fp8 kernel change (run with the 16-byte pairs of
# docs/kernel-notes.md "fp8 chunk pairs" applied to c3c5846, which lost; on the tree it measures the tree):
# the CUDA build with tests; test_cuda (fp8 random cases on every route and layout, the 8-byte-off fp8 page
# stride refused), test_append_cuda and test_bounds_cuda; then bench/run_compare.sh on the anchors with our
# 16-bit and e4m3 caches beside FlashInfer's fp8 paths (the f330dbf run's options) in what is left.
# The question: with half the load instructions, do the fp8 anchors read closer to the ceiling
# (f330dbf: step efficiency 0.80-0.92 on fp8 bytes, 0.92x FlashInfer's best fp8 path)?
# PKV_CALL_S: seconds the call may take (default 575).  OUT/summary.txt; OUT/cmp the comparison's files.
set -u
T=${PKV_CALL_S:-575}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/44_fp8_pairs.sh OUT}
mkdir -p "$out"
T0=$SECONDS
left() { echo $((T - (SECONDS - T0))); }
b=$root/build-gpu
{
  echo "# probe 44 at ${PKV_COMMIT:-unknown}: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
  cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBUILD_TESTING=ON \
    >"$out/build.log" 2>&1 && cmake --build "$b" -j "$(nproc)" --target persistentkv persistentkv_lab pkv test_cuda \
    test_append_cuda test_bounds_cuda >>"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
  echo "built in $((SECONDS - T0)) s"
  for t in test_cuda test_append_cuda test_bounds_cuda; do
    timeout 150 "$b/tests/$t" >"$out/$t.log" 2>&1
    echo "$t: exit $? at $((SECONDS - T0)) s, $(tail -n 1 "$out/$t.log")"
    grep -m 6 "CHECK failed\|FAIL" "$out/$t.log"
  done
  PKV_TIME_LIMIT_S=$(($(left) - 10)) bash "$root/bench/run_compare.sh" "$out/cmp" full --groups anchors \
    --kv-dtype q,fp8_e4m3 --kv-scale 0.05 --passes 1 >"$out/compare_stdout.txt" 2>&1
  echo "run_compare: exit $? at $((SECONDS - T0)) s"
  tail -n 30 "$out/compare_stdout.txt"
} 2>&1 | tee "$out/summary.txt"
