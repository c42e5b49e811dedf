#!/usr/bin/env bash
# 27_cpasync_into_tiles.sh OUT - copy mode 3 (the cp.async fill writes the whole-tile boxes instead of
# token-major rows; d = 256 pages below 16 tokens take it too; the default from v16, PKV_CPASYNC_LAYOUT=rows
# the other; the probe ran at e3c9851, when it was opt-in) on the GPU in one call: builds
# the working tree (pkv, test_cuda); test_cuda and memcheck with it on every grid; then every anchor and route,
# alternating over two rounds: at page size 1 (paper shape) mode 3 against mode 2 (both on every grid), and at
# the d256 shape (Gemma-2-9B) on pages of 1 and 8 mode 3 against the register kernels.  OUT/summary.txt,
# OUT/probe.tgz.
set -u
. "$(dirname "$0")/../lib/build.sh"
dev_probe_start "${1:?usage: dev/probes/27_cpasync_into_tiles.sh OUT}" "pkv test_cuda"
T="PKV_CPASYNC_LAYOUT=tiles PKV_DECODE_CPASYNC=all"
{
  dev_probe_header dev/probes/27_cpasync_into_tiles.sh
  env $T timeout 200 "$a/tests/test_cuda" >"$r/test_cuda.log" 2>&1
  rc=$?
  echo "test_cuda, $T (rc $rc): $(tail -n 1 "$r/test_cuda.log")"
  [ $rc -ne 0 ] && grep -m 30 -iE "fail|error" "$r/test_cuda.log"
  env $T PKV_TEST_SMALL=1 PKV_TEST_CASES=4 timeout 200 compute-sanitizer --tool memcheck "$a/tests/test_cuda" \
    >"$r/memcheck.log" 2>&1
  echo "memcheck, $T: $(grep -E "test_cuda:" "$r/memcheck.log" | tail -n 1) $(grep -E "ERROR SUMMARY" "$r/memcheck.log")"
  [ $rc -eq 0 ] || exit 1
  for k in 1 2; do
    dev_bench tiles1_$k "$a/pkv" $T -- --page-size 1
    dev_bench rows1_$k "$a/pkv" PKV_CPASYNC_LAYOUT=rows PKV_DECODE_CPASYNC=all -- --page-size 1
    dev_bench t256p1_$k "$a/pkv" $T -- --shape d256 --page-size 1
    dev_bench r256p1_$k "$a/pkv" PKV_DECODE_CPASYNC=0 -- --shape d256 --page-size 1
  done
  dev_bench t256p8_1 "$a/pkv" $T -- --shape d256 --page-size 8
  dev_bench r256p8_1 "$a/pkv" PKV_DECODE_CPASYNC=0 -- --shape d256 --page-size 8
  ab="$dev_root/dev/lib/ab_table.py"
  python3 "$ab" "$r" "paper, page 1: cp.async into tiles / into token-major rows" tiles1_1,tiles1_2 rows1_1,rows1_2
  python3 "$ab" "$r" "d256, page 1: cp.async into tiles / register kernels" t256p1_1,t256p1_2 r256p1_1,r256p1_2
  python3 "$ab" "$r" "d256, page 8: cp.async into tiles / register kernels" t256p8_1 r256p8_1
} 2>&1 | tee "$r/summary.txt.all"
dev_probe_finish
