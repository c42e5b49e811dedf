#!/usr/bin/env bash
# policy_data.sh OUT_DIR - the adaptive policy's measurements on a GPU, in one run: the live
# calibration (every route on the seed-20260622 traces of the shapes in PKV_CALIB_SHAPES, default
# every shape of workloads.md, then `pkv calibrate --from-json` over all: OUT_DIR/policy), then
# every route on the held-out traces (seeds 20260623..27, five families, B 1..128, paper shape;
# the other shapes of workloads.md on seed 20260623, B 1, 4, 16, 64) with auto following the live
# policy (as PKV_POLICY=OUT_DIR/policy would), JSON per set; then the offline replay of that policy
# (pkv calibrate --policy P --evaluate F1,F2,... --replay-auto).  PKV_USE_POLICY=file skips the
# calibration and evaluates that policy.
set -u -o pipefail
out=${1:?usage: scripts/policy_data.sh OUT_DIR}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu"
if [ ! -x "$build/pkv" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${PKV_CUDA_ARCH:-90a-real}" >/dev/null &&
    cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
fi
export PKV_COMMIT=${PKV_COMMIT:-$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
status=0
if [ -n "${PKV_USE_POLICY:-}" ]; then
  # a policy calibrated before (e.g. bench/results/h200.policy): held-out evaluation only
  echo "== policy $PKV_USE_POLICY (no live calibration)"
  cp "$PKV_USE_POLICY" "$out/policy" || exit 1
else
  echo "== live calibration (seed 20260622; shapes ${PKV_CALIB_SHAPES:-paper g8 g7 mha d256 d64})"
  # every route on the calibration traces of each shape (one head dim and group size per shape, so
  # the fit sees how the merge and the tiles scale), then one fit over all of them
  cal=""
  for sh in ${PKV_CALIB_SHAPES:-paper g8 g7 mha d256 d64}; do
    "$build/pkv" bench --backend cuda --calibration-set --shape "$sh" --reps 30 --no-check --quiet \
      --json "$out/calibration_$sh.json" >"$out/calibration_$sh.md" 2>>"$out/bench.log" || status=1
    cal="$cal${cal:+,}$out/calibration_$sh.json"
  done
  "$build/pkv" calibrate --from-json "$cal" --out "$out/policy" >"$out/calibration.md" 2>>"$out/bench.log" || status=1
  grep -E "^fit on" "$out/calibration.md"
fi
m="--backend cuda --heldout-set --no-check --reps 20 --warmup 3 --wall-reps 3 --quiet --policy $out/policy"
echo "== held-out traces, paper shape (5 seeds, B 1..128)"
"$build/pkv" bench $m --json "$out/heldout_paper.json" >"$out/heldout_paper.md" 2>>"$out/bench.log" || status=1
for sh in ${PKV_POLICY_SHAPES:-g8 g7 mha d256 d64}; do
  echo "== held-out traces, shape $sh (seed 20260623, B 1, 4, 16, 64)"
  "$build/pkv" bench $m --shape $sh --set-seeds 1 --set-batches 1,4,16,64 --json "$out/heldout_$sh.json" \
    >"$out/heldout_$sh.md" 2>>"$out/bench.log" || status=1
done
echo "== offline evaluation of the live policy on the held-out sets"
files=$(ls "$out"/heldout_*.json | paste -sd, -)
# --replay-auto: the policy's auto re-planned and looked up among the measured plans (a check that the
# replay reproduces the live auto: "a plan other than the measured auto's on 0")
"$build/pkv" calibrate --policy "$out/policy" --evaluate "$files" --replay-auto | tee "$out/evaluation.md" | tail -n 4
echo "== decision cost on this host (B = 128)"; "$build/tests/test_cost" | grep decision | tee "$out/decision.txt"
exit $status
