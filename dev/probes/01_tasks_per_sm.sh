#!/usr/bin/env bash
# 01_tasks_per_sm.sh BUILD OUT - tasks per SM (--ctas-per-unit) and smallest split against kernel time on
# the anchors that miss FlashInfer (single requests, B8 ragged), fused and workqueue routes.
set -u
build=${1:?build dir}; out=${2:?out dir}
for cpu in 2 3 4 6; do
  for a in B1_N2048 B1_N8192 B1_N32768 B1_N65536 B8_zipf B8_bimodal; do
    "$build/pkv" bench --backend cuda --anchor $a --route fused --reps 50 --quiet --no-check --ctas-per-unit $cpu \
      2>/dev/null | awk -v c=$cpu -F'|' 'NR>2 && NF>5 {print "cpu=" c " |" $0}' | head -n 1
  done
done | tee "$out/sweep_ctas.txt"
for mc in 64 256 512; do
  for a in B1_N2048 B1_N8192; do
    "$build/pkv" bench --backend cuda --anchor $a --route fused --reps 50 --quiet --no-check --min-chunk $mc \
      2>/dev/null | awk -v c=$mc -F'|' 'NR>2 && NF>5 {print "minchunk=" c " |" $0}' | head -n 1
  done
done | tee "$out/sweep_minchunk.txt"
