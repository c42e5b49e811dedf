#!/usr/bin/env bash
# 39_one_call.sh OUT - when one device call is all there is: the CUDA build, the GPU tests that cover what changed
# since the last GPU check (test_cuda with and without pageable_upload=1: plan blobs in page-locked memory and
# incremental plans; test_decoder: decode steps in CUDA graphs against op by op; test_append_cuda; test_model),
# then probe 38's graphs-on/off decode at B 1 and 128, then the end-to-end loop beside FlashInfer
# (bench/run_e2e.sh, the long family first) in what is left of the time.  Carry .whl.
#   PKV_COMMIT=<commit> [PKV_CALL_S=seconds the call may take, default 575] bash dev/probes/39_one_call.sh $OUT
set -u
T=${PKV_CALL_S:-575}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/39_one_call.sh OUT}
mkdir -p "$out"
T0=$SECONDS
b=$root/build-gpu
echo "== build [$((SECONDS - T0)) s]"
{ cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real &&
  cmake --build "$b" -j "$(nproc)" --target persistentkv persistentkv_lab pkv test_cuda test_decoder test_append_cuda \
    test_model; } >"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
grep -E "spill|warning" "$out/build.log" | grep -v " 0 bytes spill" | head -n 10
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== tests [$((SECONDS - T0)) s]"
PKV_TEST_CASES=20 timeout 150 "$b/tests/test_cuda" >"$out/test_cuda.log" 2>&1 &
p1=$!
PKV_TUNING=pageable_upload=1 PKV_TEST_CASES=8 timeout 150 "$b/tests/test_cuda" >"$out/test_cuda_pageable.log" 2>&1 &
p2=$!
for t in test_decoder test_append_cuda test_model; do timeout 120 "$b/tests/$t" >"$out/$t.log" 2>&1; echo "$t: exit $?, $(tail -n 1 "$out/$t.log")"; done
grep -h "graphs against" "$out/test_decoder.log"
grep -h "CHECK failed\|FAIL" "$out"/test_decoder.log "$out"/test_append_cuda.log "$out"/test_model.log | head -n 8
wait $p1; echo "test_cuda: exit $?, $(tail -n 1 "$out/test_cuda.log")"
wait $p2; echo "test_cuda pageable_upload=1: exit $?, $(tail -n 1 "$out/test_cuda_pageable.log")"
grep -h "uploads from\|CHECK failed" "$out"/test_cuda*.log | head -n 8
echo "== decode with and without graphs [$((SECONDS - T0)) s]"
for bb in 1 128; do
  for g in off on; do
    [ $((SECONDS - T0)) -gt $((T - 60)) ] && break 2
    timeout 25 "$b/pkv" decode --backend cuda --layers 8 --trace uniform --batch $bb --steps 30 --graphs $g \
      --json "$out/decode_b${bb}_$g.json" >"$out/decode_b${bb}_$g.md" 2>"$out/decode_b${bb}_$g.err"
    echo "B $bb graphs $g: exit $?"; sed -n 5p "$out/decode_b${bb}_$g.md"; grep -A4 "host per step" "$out/decode_b${bb}_$g.md" | tail -n 2
  done
done
echo "== e2e beside FlashInfer [$((SECONDS - T0)) s]"
left=$((T - (SECONDS - T0) - 45))
[ "$left" -lt 150 ] && echo "e2e skipped: $left s left"
[ "$left" -ge 150 ] && PKV_TIME_LIMIT_S=$left PKV_SAVE_FI_CACHE=1 bash "$root/bench/run_e2e.sh" "$out/e2e" --families long,uniform,bimodal,zipf \
  >"$out/e2e_stdout.txt" 2>&1
echo "run_e2e: exit $?"
tail -n 45 "$out/e2e_stdout.txt"
echo "== done [$((SECONDS - T0)) s]"
