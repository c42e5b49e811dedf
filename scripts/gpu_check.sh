#!/usr/bin/env bash
# gpu_check.sh OUT_DIR [--quick] - the GPU check, end to end on a bare machine with a GPU and the
# CUDA toolkit: build, GPU tests (every route against the float64 CPU reference, outputs poisoned),
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck: scripts/gpu_sanitize.sh) on a reduced
# set, then the benchmark (anchor steps, trace families, Gemma-2's local layers, d = 64 on pages of 1 token, the
# anchors with an fp8 e4m3 cache, then e5m2, and a trace with an e5m2 one, the anchors as graph-stable plans).  Full logs
# and JSON go to OUT_DIR; a short table is printed last.
#   --quick   fewer random cases, fewer timing repetitions, anchors only (a smoke run)
#   --tests-only / --bench-only   one half: build, tests, portability and sanitizers; or build and the
#             benchmark (the whole check takes ~9-10 minutes on an H200: two calls of a machine that limits
#             one command's time; the second reuses the first's build folder when it is still there)
set -u -o pipefail
usage="usage: scripts/gpu_check.sh OUT_DIR [--quick] [--tests-only|--bench-only]"
out=${1:?$usage}
quick=0 tests=1 bench=1
for arg in "${@:2}"; do
  case $arg in
    --quick) quick=1 ;;
    --tests-only) bench=0 ;;
    --bench-only) tests=0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[ $tests = 0 ] && [ $bench = 0 ] && { echo "gpu_check.sh: --tests-only and --bench-only exclude each other" >&2; exit 2; }
mkdir -p "$out"
log=$(mktemp -d)
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu"
jobs=$(nproc 2>/dev/null || echo 8)
status=0
say() { printf '\n== %s  [%d s]\n' "$*" "$SECONDS"; }

say "build (CUDA, sm_90a for this machine)"
arch=${PKV_CUDA_ARCH:-90a-real}
cases=60; [ $quick = 1 ] && cases=20
if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" &&
       cmake --build "$build" -j "$jobs"; } >"$log/build.log" 2>&1; then
  tail -n 40 "$log/build.log"; cat "$log/build.log" >"$out/log.txt"; echo "build failed"; exit 1
fi
grep -E "spill|warning" "$log/build.log" | head -n 20
if [ $quick = 0 ] && [ $tests = 1 ]; then
  # the portability check in the background while the tests run: the compute_80 PTX build, then its
  # test_cuda JIT-compiled for this GPU (what a build for older GPUs does on this one: the sm_90
  # kernels' bodies are compiled out there)
  { cmake -S "$root" -B "$root/build-ptx80" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=80-virtual &&
    cmake --build "$root/build-ptx80" -j "$(( (jobs + 1) / 2 ))" --target test_cuda; } >"$log/build_ptx80.log" 2>&1 &&
    PKV_TEST_CASES=$((cases / 3)) timeout 400 "$root/build-ptx80/tests/test_cuda" >"$log/ptx80.log" 2>&1 &
  ptx80_run=$!
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null | tee "$log/gpu.txt"

if [ $tests = 1 ]; then
  say "tests (ctest: CPU and GPU; then pkv check and test_cuda in each setting side by side)"
  # ctest -j 6: the CPU tests (test_fuzz ~70 s) run beside test_cuda
  if ! PKV_TEST_CASES=$cases ctest --test-dir "$build" -j 6 --output-on-failure >"$log/tests.log" 2>&1; then status=1; fi
  grep -E "tests passed|Passed|Failed|SKIP|passed, " "$log/tests.log" | tail -n 20
  # then, as concurrent processes on the one GPU (correctness runs, nothing timed): pkv check, and test_cuda
  # under each PKV_TUNING setting that reaches a path the default does not take on this GPU (src/core/tuning.c
  # documents the keys): the register kernels where sm_90 runs the ring kernel (tma=0: the kernels of
  # sm_80-89 GPUs), each merge kernel on every plan (merge=head also merges graph-stable steps per head
  # whatever their width; by default a narrow step merges one CTA per merge), the ring kernel with a forced
  # 3-stage ring (one CTA per SM at d = 256, 2 at d = 128), graph-stable tasks dealt over 16 SMs (more per SM
  # than its CTAs: the unclaimed tasks must be found and run by the CTAs that wait for them), plan uploads from
  # pageable memory (the staging ring's fallback; test_cuda prints how long three uploads queued behind a
  # 300 ms kernel kept the host there) and no programmatic dependent launch at all (pdl=0: the launch order
  # of GPUs and builds without sm_90 code)
  settings="tma=0 merge=head merge=row tma_stages=3 claim_sms=16 pageable_upload=1 pdl=0"
  pids=""
  "$build/pkv" check --backend cuda --count $((cases / 2)) >"$log/check.log" 2>&1 & pids="$pids $!"
  i=0
  for setting in $settings; do
    PKV_TUNING="$setting" PKV_TEST_CASES=$((cases / 3)) "$build/tests/test_cuda" >"$log/setting_$i.log" 2>&1 &
    pids="$pids $!"
    i=$((i + 1))
  done
  for pid in $pids; do wait "$pid" || status=1; done
  tail -n 5 "$log/check.log" | tee -a "$log/tests.log"
  grep -h "uploads from pageable memory" "$log"/setting_*.log | head -n 1 | tee -a "$log/tests.log"
  grep -q " 0 failed" "$log/check.log" || status=1
  i=0
  for setting in $settings; do
    echo "PKV_TUNING=$setting: $(tail -n 1 "$log/setting_$i.log")" | tee -a "$log/tests.log"
    grep -q "PKV_TUNING=$setting: test_cuda: .* 0 failed" "$log/tests.log" || status=1
    i=$((i + 1))
  done
  if [ $quick = 0 ]; then
    say "portability: compute_80 PTX alone, JIT-compiled for this GPU (tensor copies and PDL must switch off)"
    if wait "$ptx80_run"; then
      grep -E "^device:" "$log/ptx80.log" | head -n 1
      echo "compute_80 PTX: $(tail -n 1 "$log/ptx80.log")" | tee -a "$log/tests.log"
      grep -q "no sm_90 code" "$log/ptx80.log" || { echo "compute_80 PTX: the sm_90 paths did not switch off"; status=1; }
    else
      tail -n 20 "$log/build_ptx80.log" "$log/ptx80.log"; status=1
    fi
  fi

  say "compute-sanitizer (memcheck, racecheck, initcheck, synccheck) on a reduced set"
  if [ $quick = 1 ]; then
    echo "skipped in --quick" | tee "$log/sanitizer.log"
  else
    bash "$root/scripts/gpu_sanitize.sh" "$build" "$log" || status=1
  fi
fi

if [ $bench = 1 ]; then
  say "benchmark: anchor steps (paper shape)"
  reps=100; [ $quick = 1 ] && reps=30
  export PKV_COMMIT=${PKV_COMMIT:-$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
  "$build/pkv" bench --backend cuda --anchor all --reps $reps --json "$out/anchors.json" --quiet \
    >"$out/anchors.md" 2>"$log/bench.log" || status=1

  if [ $quick = 0 ]; then
    say "benchmark: trace families (paper shape, seed 20260623)"
    for fam in bimodal uniform zipf; do
      "$build/pkv" bench --backend cuda --trace $fam --seed 20260623 --steps 16 --reps 30 --wall-reps 10 --quiet \
        --json "$log/trace_$fam.json" >>"$out/traces.md" 2>>"$log/bench.log" || status=1
    done
    "$build/pkv" bench --backend cuda --trace bucketed --seed 20260623 --steps 16 --reps 30 --wall-reps 10 --quiet \
      --json "$log/trace_bucketed.json" >>"$out/traces.md" 2>>"$log/bench.log" || status=1
    say "benchmark: anchor steps, d256 shape with Gemma-2's soft cap 50 and 4096-token window (local layers)"
    "$build/pkv" bench --backend cuda --shape d256 --soft-cap 50 --window 4096 --anchor all --reps 50 --wall-reps 5 \
      --quiet --json "$out/anchors_gemma2_local.json" >"$out/anchors_gemma2_local.md" 2>>"$log/bench.log" || status=1
    say "benchmark: anchor steps, d = 64 (32:8:64) on pages of 1 token (gathered row by row; v18's wave)"
    "$build/pkv" bench --backend cuda --shape 32:8:64 --page-size 1 --anchor all --reps 50 --wall-reps 5 \
      --quiet --json "$out/anchors_d64_page1.json" >"$out/anchors_d64_page1.md" 2>>"$log/bench.log" || status=1
    say "benchmark: anchor steps with an fp8 KV cache (e4m3, scale 0.05; then e5m2, auto only), and a trace with an e5m2 one"
    "$build/pkv" bench --backend cuda --dtype fp8 --kv-scale 0.05 --anchor all --reps 50 --wall-reps 5 \
      --quiet --json "$out/anchors_fp8.json" >"$out/anchors_fp8.md" 2>>"$log/bench.log" || status=1
    "$build/pkv" bench --backend cuda --kv-dtype fp8_e5m2 --kv-scale 0.05 --anchor all --route auto --reps 50 \
      --wall-reps 3 --quiet --json "$out/anchors_fp8_e5m2.json" >"$out/anchors_fp8_e5m2.md" 2>>"$log/bench.log" ||
      status=1
    "$build/pkv" bench --backend cuda --kv-dtype fp8_e5m2 --trace bimodal --seed 20260623 --steps 8 --reps 30 \
      --wall-reps 5 --quiet --json "$out/trace_bimodal_fp8_e5m2.json" >"$out/trace_fp8_e5m2.md" \
      2>>"$log/bench.log" || status=1
    say "benchmark: anchor steps as graph-stable plans (work queue, capacity = batch rounded up to a power of two)"
    "$build/pkv" bench --backend cuda --anchor all --route workqueue --graph-max-batch pow2 --reps 50 --wall-reps 5 \
      --quiet --json "$out/anchors_graph_stable.json" >"$out/anchors_graph_stable.md" 2>>"$log/bench.log" || status=1
  fi
fi

say "summary"
echo "elapsed: $SECONDS s"
cat "$log/gpu.txt" "$log/build.log" "$log/tests.log" "$log/sanitizer.log" "$log/bench.log" >"$out/log.txt" 2>/dev/null
python3 "$root/scripts/summarize.py" "$out" "$log"/trace_*.json || true
exit $status
