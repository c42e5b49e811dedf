#!/usr/bin/env bash
# 38_decode_graphs.sh OUT [BUILD] - what CUDA graphs per batch bucket (pkv decode --graphs on) change in the
# end-to-end loop: pkv decode, Llama-3-8B's first 8 layers, the uniform trace, B 1, 8, 32 and 128, 40 steps, graphs
# off and on side by side (off, on, off, on: two rounds each), the report's tokens/s, median step and split, and
# the host's part per step (the bar: < 10 us at B = 128).  BUILD: a CUDA build folder with pkv (default build-gpu,
# built here when missing).  OUT/summary.txt, the reports and JSON in OUT.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/38_decode_graphs.sh OUT [BUILD]}
build=${2:-$root/build-gpu}
mkdir -p "$out"
if [ ! -x "$build/pkv" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBUILD_TESTING=OFF \
    >"$out/build.log" 2>&1 && cmake --build "$build" -j "$(nproc)" --target pkv >>"$out/build.log" 2>&1 ||
    { tail -n 30 "$out/build.log"; exit 1; }
fi
{
  echo "# probe 38: pkv decode with and without CUDA graphs ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1))"
  echo "commit ${PKV_COMMIT:-unknown}, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "| B | graphs | round | tokens/s | median step ms | attention | in graphs | host mean us | host median us | plan median us | launch median us |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for b in 1 8 32 128; do
    for round in 1 2; do
      for g in off on; do
        n="b${b}_${g}_${round}"
        timeout 120 "$build/pkv" decode --backend cuda --layers 8 --trace uniform --batch "$b" --steps 40 --graphs "$g" \
          --json "$out/$n.json" >"$out/$n.md" 2>"$out/$n.err" || { echo "| $b | $g | $round | failed: $(tail -n 1 "$out/$n.err") |"; continue; }
        python3 - "$out/$n.json" "$b" "$g" "$round" <<'PY'
import json, sys
x = json.load(open(sys.argv[1])); sp = x["split_us"]; w = sp["wall"] or 1
hm, hd = x["host_us_per_step_mean"], x["host_us_per_step_median"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {x['tokens_per_s']:.1f} | {x['median_step_ms']:.3f} | "
      f"{100 * sp['attention'] / w:.1f}% | {100 * sp.get('graphed', 0) / w:.1f}% | {hm['host']:.2f} | {hd['host']:.2f} | "
      f"{hd['plan']:.2f} | {hd['launch']:.2f} |")
PY
      done
    done
  done
} 2>&1 | tee "$out/summary.txt"
