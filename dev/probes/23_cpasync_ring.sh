#!/usr/bin/env bash
# 23_cpasync_ring.sh OUT - the cp.async fill of the shared-memory ring (pages whose chunks take no tensor
# copies, v15) on the GPU in one call: builds the working tree (pkv, test_cuda); test_cuda with cp.async on
# every grid (PKV_DECODE_CPASYNC=all: pages of 1, 2, 4, 12, ... tokens), with the chunked tensor copies off
# too (cp.async at pages of 8) and with cp.async off; memcheck, racecheck and synccheck on a reduced set
# with the chunked copies off and cp.async on every grid; then every anchor and route at page size 1 with
# cp.async on every grid and with the register kernels (PKV_DECODE_CPASYNC=0), alternating, and at page
# size 8 cp.async against the chunked tensor copies (the default) and the register kernels.
# OUT/summary.txt, OUT/probe.tgz.  (It ran at df35b3e, where cp.async was on for every grid by default;
# PKV_DECODE_CPASYNC=all is that setting now.)
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/23_cpasync_ring.sh OUT}" "pkv test_cuda"
grep -E "spill" "$r/build.log" | head -n 8
{
  dev_probe_header dev/probes/23_cpasync_ring.sh
  PKV_DECODE_CPASYNC=all timeout 200 "$a/tests/test_cuda" >"$r/test_cuda.log" 2>&1
  rc=$?
  echo "test_cuda, PKV_DECODE_CPASYNC=all (rc $rc): $(tail -n 1 "$r/test_cuda.log")"
  [ $rc -ne 0 ] && { grep -m 30 -iE "fail|error" "$r/test_cuda.log"; }
  for setting in PKV_TMA_CHUNKED=0 PKV_DECODE_CPASYNC=0; do
    env PKV_DECODE_CPASYNC=all $setting PKV_TEST_CASES=20 timeout 150 "$a/tests/test_cuda" >"$r/test_cuda_$setting.log" 2>&1 &
  done
  wait
  for setting in PKV_TMA_CHUNKED=0 PKV_DECODE_CPASYNC=0; do
    echo "test_cuda, $setting: $(tail -n 1 "$r/test_cuda_$setting.log")"
    grep -m 10 -iE "fail" "$r/test_cuda_$setting.log"
  done
  for tool in memcheck racecheck synccheck; do
    n=4; [ $tool = racecheck ] && n=2
    PKV_TMA_CHUNKED=0 PKV_DECODE_CPASYNC=all PKV_TEST_SMALL=1 PKV_TEST_CASES=$n timeout 150 compute-sanitizer --tool $tool "$a/tests/test_cuda" >"$r/$tool.log" 2>&1 &
  done
  wait
  for tool in memcheck racecheck synccheck; do
    echo "$tool (PKV_TMA_CHUNKED=0, PKV_DECODE_CPASYNC=all): $(grep -E "test_cuda:" "$r/$tool.log" | tail -n 1) $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$r/$tool.log")"
  done
  [ $rc -eq 0 ] || exit 1
  for k in 1 2; do
    dev_bench c1_$k "$a/pkv" PKV_DECODE_CPASYNC=all -- --page-size 1
    dev_bench r1_$k "$a/pkv" PKV_DECODE_CPASYNC=0 -- --page-size 1
  done
  dev_bench c8_1 "$a/pkv" PKV_TMA_CHUNKED=0 PKV_DECODE_CPASYNC=all -- --page-size 8
  dev_bench t8_1 "$a/pkv" PKV_TMA_CHUNKED=8 -- --page-size 8
  dev_bench r8_1 "$a/pkv" PKV_TMA_CHUNKED=0 PKV_DECODE_CPASYNC=0 -- --page-size 8
  ab="$dev_root/dev/lib/ab_table.py"
  python3 "$ab" "$r" "page 1: cp.async / register kernels" c1_1,c1_2 r1_1,r1_2
  python3 "$ab" "$r" "page 8: cp.async / chunked tensor copies" c8_1 t8_1
  python3 "$ab" "$r" "page 8: cp.async / register kernels" c8_1 r8_1
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
