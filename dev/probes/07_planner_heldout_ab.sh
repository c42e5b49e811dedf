#!/usr/bin/env bash
# 07_planner_heldout_ab.sh OUT [POLICY] - a planner change checked on the GPU in one call: test_cuda, then every
# route on the held-out subsets it touches (shapes d64, g7, g8 at B 1, 4, 16, 64, seed 20260623;
# paper B 4 and 8, five seeds) and the anchors, JSON into OUT/ab.tgz, to set beside an earlier
# scripts/policy_data.sh run of the same sets.
set -u
out=${1:?usage: dev/probes/07_planner_heldout_ab.sh OUT [POLICY]}
policy=${2:-bench/results/h200.policy}
mkdir -p "$out/ab"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null &&
  cmake --build build-gpu -j "$(nproc)" >/dev/null 2>&1 || { echo build failed; exit 1; }
echo "test_cuda: $(PKV_TEST_CASES=20 build-gpu/tests/test_cuda 2>&1 | tail -n 1)"
m="--backend cuda --heldout-set --no-check --reps 20 --warmup 3 --wall-reps 3 --quiet --policy $policy"
for sh in d64 g7 g8; do
  build-gpu/pkv bench $m --shape $sh --set-seeds 1 --set-batches 1,4,16,64 --json "$out/ab/heldout_$sh.json" \
    >/dev/null 2>>"$out/ab/bench.log"
done
build-gpu/pkv bench $m --set-batches 4,8 --json "$out/ab/heldout_paper_b48.json" >/dev/null 2>>"$out/ab/bench.log"
build-gpu/pkv bench --backend cuda --anchor all --reps 50 --wall-reps 5 --no-check --quiet --json "$out/ab/anchors.json" \
  >"$out/ab/anchors.md" 2>>"$out/ab/bench.log"
tar -czf "$out/ab.tgz" -C "$out" ab && rm -rf "$out/ab"
