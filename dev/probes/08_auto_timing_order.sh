#!/usr/bin/env bash
# 08_auto_timing_order.sh BUILD - is auto's extra time on single-row trace steps the route or the order?
# The same B1 trace steps timed with auto alone, split alone (separate processes) and all routes in
# one process (auto timed first), with the live policy.
set -u
b=${1:?build dir}
for r in split auto all; do
  echo "== --route $r"
  "$b/pkv" bench --backend cuda --trace homogeneous --seed 20260623 --batch 1 --requests 3 --steps 4 --reps 30 \
    --no-check --per-step --quiet --route $r --policy bench/results/h200.policy 2>/dev/null |
    awk -F'|' 'NR>2 && NF>8 {printf "%-28s %-16s kernel us %8s tasks %6s\n", $2, $5, $6, $9}'
done
