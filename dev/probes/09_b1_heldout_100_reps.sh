#!/usr/bin/env bash
# 09_b1_heldout_100_reps.sh BUILD OUT - every route and auto (live policy) on the held-out single-request rows of
# every shape, with 100 timing repetitions (policy_data.sh uses 20): the B1 rows are where auto runs
# a fixed route's own plan and its regret is the measurement's noise.
set -u
b=${1:?build dir}; out=${2:?out dir}
for sh in paper g8 g7 mha d256 d64; do
  seeds=1; [ $sh = paper ] && seeds=5
  "$b/pkv" bench --backend cuda --heldout-set --shape $sh --set-seeds $seeds --set-batches 1 --reps 100 --warmup 5 \
    --wall-reps 2 --no-check --quiet --policy bench/results/h200.policy --json "$out/b1_$sh.json" >/dev/null 2>>"$out/b1.log"
done
"$b/pkv" calibrate --policy bench/results/h200.policy --evaluate "$(ls "$out"/b1_*.json | paste -sd,)" | tail -n 40
