#!/usr/bin/env bash
# 06_wave_on_ragged_traces.sh BUILD OUT - tasks per SM (--ctas-per-unit) against mean kernel time on the trace rows
# that trail FlashInfer (ragged B8; d64 B32 bimodal) and neighbours (B4, B16), work-queue and fused;
# SWEEP_CPUS (default "2 3 4") sets the tasks per SM; SWEEP_EXTRA adds comma-separated "shape family batch"
# rows (e.g. the batches of 2-4 long rows where auto's resident wave lost on kernel v8:
# "d64 homogeneous 4,g8 homogeneous 4,paper homogeneous 2").
set -u
build=${1:?build dir}; out=${2:?out dir}
IFS=',' read -r -a extra <<<"${SWEEP_EXTRA:-}"
for cpu in ${SWEEP_CPUS:-2 3 4}; do
  for spec in "paper bimodal 8" "paper zipf 8" "paper uniform 8" "paper bucketed 8" "paper bimodal 4" "paper zipf 16" \
              "d64 bimodal 32" "d64 bimodal 8" "g8 bimodal 8" ${extra[@]+"${extra[@]}"}; do
    set -- $spec
    for route in workqueue; do
      "$build/pkv" bench --backend cuda --shape $1 --trace $2 --seed 20260623 --batch $3 --steps 16 --reps 30 --wall-reps 2 \
        --quiet --no-check --route $route --ctas-per-unit $cpu 2>/dev/null |
        awk -v c=$cpu -v s="$1 $2 B$3" -F'|' '$2 ~ /(workqueue|fused)/ && NF > 8 {printf "cpu=%s %-20s %-10s kernel us %s tasks %s\n", c, s, $2, $4, $8}'
    done
  done
done | tee "$out/sweep_wave.txt"
