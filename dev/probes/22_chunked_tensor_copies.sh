#!/usr/bin/env bash
# 22_chunked_tensor_copies.sh OUT OLD_DECODE_SOURCE - the chunked tensor-copy kernel (pages that are not a multiple of
# 16 tokens, v14) on the GPU in one call: builds the working tree (pkv, test_cuda) and OLD_DECODE_SOURCE
# (pkv) side by side; test_cuda (default, and with the chunked kernel off), memcheck and racecheck with
# chunks of any size on a reduced set; then every anchor and route at page size 1 with chunks of any size
# (PKV_TMA_CHUNKED=all) and with the register kernels (=0), alternating, at page size 8 the same once, and
# at page size 16 the working tree against the old source (the whole-tile kernel must not have moved).
# OUT/summary.txt, OUT/probe.tgz.  The old source: a decode.cu from before the chunks, e.g.
# git show 0d315fa:src/cuda/decode.cu > dev/decode_v13d.cu (not committed).  QUICK=1: test_cuda default
# and with chunks of any size, memcheck with them, and the page-16 comparison only.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/22_chunked_tensor_copies.sh OUT OLD_DECODE_SOURCE}
old_src=${2:?old decode source, relative to the repository root}
mkdir -p "$out"
. "$root/dev/lib/build.sh"
dev_ab_setup "$old_src"
S="$r/summary.txt"
{
  echo "# dev/probes/22_chunked_tensor_copies.sh at ${PKV_COMMIT:-unknown}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  timeout 200 "$a/tests/test_cuda" >"$r/test_cuda.log" 2>&1
  rc=$?
  echo "test_cuda (rc $rc): $(tail -n 1 "$r/test_cuda.log")"
  [ $rc -ne 0 ] && { grep -m 30 -i "fail" "$r/test_cuda.log"; }
  q=${QUICK:-0}
  if [ "$q" = 1 ]; then ch=all; else ch=0; fi
  echo "test_cuda, PKV_TMA_CHUNKED=$ch: $(PKV_TMA_CHUNKED=$ch PKV_TEST_CASES=30 timeout 150 "$a/tests/test_cuda" 2>&1 | tail -n 1)"
  PKV_TMA_CHUNKED=all PKV_TEST_SMALL=1 PKV_TEST_CASES=4 timeout 150 compute-sanitizer --tool memcheck "$a/tests/test_cuda" >"$r/memcheck.log" 2>&1
  echo "memcheck (PKV_TMA_CHUNKED=all): $(grep -E "test_cuda:" "$r/memcheck.log" | tail -n 1) $(grep -E "ERROR SUMMARY" "$r/memcheck.log")"
  if [ "$q" != 1 ]; then
    PKV_TMA_CHUNKED=all PKV_TEST_SMALL=1 PKV_TEST_CASES=2 timeout 150 compute-sanitizer --tool racecheck "$a/tests/test_cuda" >"$r/racecheck.log" 2>&1
    echo "racecheck (PKV_TMA_CHUNKED=all): $(grep -E "test_cuda:" "$r/racecheck.log" | tail -n 1) $(grep -E "RACECHECK SUMMARY" "$r/racecheck.log")"
  fi
  [ $rc -eq 0 ] || exit 1
  if [ "$q" != 1 ]; then
    for k in 1 2; do
      dev_bench c1_$k "$a/pkv" PKV_TMA_CHUNKED=all -- --page-size 1
      dev_bench r1_$k "$a/pkv" PKV_TMA_CHUNKED=0 -- --page-size 1
    done
    dev_bench c8_1 "$a/pkv" PKV_TMA_CHUNKED=all -- --page-size 8
    dev_bench r8_1 "$a/pkv" PKV_TMA_CHUNKED=0 -- --page-size 8
  fi
  dev_bench new16_1 "$a/pkv" PKV_TMA_CHUNKED=all --
  dev_bench old16_1 "$b/pkv" PKV_TMA_CHUNKED=all --
  ab="$root/dev/lib/ab_table.py"
  python3 "$ab" "$r" "page 1: chunked tensor copies / register kernels" c1_1,c1_2 r1_1,r1_2
  python3 "$ab" "$r" "page 8: chunked / register" c8_1 r8_1
  python3 "$ab" "$r" "page 16: working tree / old source" new16_1 old16_1
} 2>&1 | tee "$S.all"
mv "$S.all" "$S"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
