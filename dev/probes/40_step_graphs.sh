#!/usr/bin/env bash
# 40_step_graphs.sh OUT [BUILD] - whole decode steps in one CUDA graph (pkv decode --graphs step: attention from
# graph-stable work-queue plans inside the replay) against the pieces (--graphs pieces: L + 1 replays, attention
# planned by the policy and launched between them) and no graphs, in the end-to-end loop: first test_decoder
# (graphs of both kinds against op by op, bit for bit on the CPU, bf16 GEMM rounding on CUDA) and test_model (the
# fused add_rmsnorm against its two ops on the device), then pkv decode,
# Llama-3-8B's first 8 layers (and all 32 at B 1 and 128), the uniform trace, 60 steps, the three modes in turn
# (PKV_ROUNDS rounds at 8 layers, default 1).  The questions: does the step graph's single replay lift tokens/s (the launch gaps of
# L attention launches gone) or lose it (graph-stable plans' surplus CTAs, no per-step route), and does it bring the
# host's part per step under the 10 us bar at B = 128?  BUILD: a CUDA build folder (default build-gpu, built here
# when pkv or test_decoder is missing).  OUT/summary.txt, the reports and JSON in OUT.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/40_step_graphs.sh OUT [BUILD]}
build=${2:-$root/build-gpu}
mkdir -p "$out"
if [ ! -x "$build/pkv" ] || [ ! -x "$build/tests/test_decoder" ] || [ ! -x "$build/tests/test_model" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBUILD_TESTING=ON \
    >"$out/build.log" 2>&1 && cmake --build "$build" -j "$(nproc)" --target pkv test_decoder test_model >>"$out/build.log" 2>&1 ||
    { tail -n 30 "$out/build.log"; exit 1; }
fi
{
  echo "# probe 40: pkv decode, whole steps in graphs against pieces and none ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1))"
  echo "commit ${PKV_COMMIT:-unknown}, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  timeout 150 "$build/tests/test_decoder" >"$out/test_decoder.log" 2>&1
  echo "test_decoder: exit $?, $(tail -n 1 "$out/test_decoder.log")"
  timeout 60 "$build/tests/test_model" >"$out/test_model.log" 2>&1
  echo "test_model: exit $?, $(tail -n 1 "$out/test_model.log")"
  grep -h "CHECK failed" "$out/test_model.log" | head -n 4
  grep -h "graphs (\|CHECK failed" "$out/test_decoder.log" | head -n 8
  echo
  echo "| layers | B | graphs | round | tokens/s | median step ms | attention | in graphs | host mean us | host median us | plan median us | stage median us | launch median us |"
  echo "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  one() { # LAYERS B MODE ROUND
    local n="l$1_b$2_$3_$4"
    timeout 100 "$build/pkv" decode --backend cuda --layers "$1" --trace uniform --batch "$2" --steps 60 --graphs "$3" \
      --json "$out/$n.json" >"$out/$n.md" 2>"$out/$n.err" || { echo "| $1 | $2 | $3 | $4 | failed: $(tail -n 1 "$out/$n.err") |"; return; }
    python3 - "$out/$n.json" "$1" "$2" "$3" "$4" <<'PY'
import json, sys
x = json.load(open(sys.argv[1])); sp = x["split_us"]; w = sp["wall"] or 1
hm, hd = x["host_us_per_step_mean"], x["host_us_per_step_median"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {x['tokens_per_s']:.1f} | {x['median_step_ms']:.3f} | "
      f"{100 * sp['attention'] / w:.1f}% | {100 * sp.get('graphed', 0) / w:.1f}% | {hm['host']:.2f} | {hd['host']:.2f} | "
      f"{hd['plan']:.2f} | {hd['stage']:.2f} | {hd['launch']:.2f} |")
PY
  }
  for b in 1 32 128; do
    for round in $(seq 1 "${PKV_ROUNDS:-1}"); do
      for g in off pieces step; do one 8 "$b" "$g" "$round"; done
    done
  done
  for b in 1 128; do
    for g in pieces step; do one 32 "$b" "$g" 1; done
  done
} 2>&1 | tee "$out/summary.txt"
