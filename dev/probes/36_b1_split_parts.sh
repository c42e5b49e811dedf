#!/usr/bin/env bash
# 36_b1_split_parts.sh OUT - where B1_N32768's split route spends the time above dev/cuda/read_patterns.cu's
# bound (the decode's read pattern with no math + the cheapest dependent merge): pkv bench on that one step,
# route split, under settings that each take one part away or change it - the ring's stages (PKV_TMA_STAGES),
# the merge kernel (PKV_MERGE_KERNEL), PDL (PKV_NO_PDL), the register kernels (PKV_DECODE_TMA=0) - and a
# build with the per-tile math compiled out (as dev/probes/29_no_math.sh), two alternating rounds, then the bound
# in the same process order.  OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/36_b1_split_parts.sh OUT}
mkdir -p "$out"
. "$root/dev/lib/build.sh"
variant=dev/decode_nomath.cu
dev_nomath_variant "$variant" || exit 1
r=$(mktemp -d); a=$root/build-gpu; b=$root/build-variant
dev_build "$a" "$r/build.log" pkv -DBUILD_TESTING=OFF &
dev_build "$b" "$r/build_variant.log" pkv -DBUILD_TESTING=OFF -DPKV_DECODE_SOURCE="$variant" &
dev_build_read_probe "$r/probe" "$r/probe_build.log" &
wait
rm -f "$root/$variant"
for f in "$a/pkv" "$b/pkv" "$r/probe"; do [ -x "$f" ] || { tail -n 30 "$r"/*.log; exit 1; }; done
one() { # NAME BIN ENV...: B1_N32768, split, 200 CUDA-event runs
  local name=$1 bin=$2; shift 2
  env "$@" timeout 100 "$bin" bench --backend cuda --anchor B1_N32768 --route split --reps 200 --wall-reps 2 \
    --no-check --quiet --json "$r/$name.json" >/dev/null 2>>"$r/bench.log"
  python3 -c "import json,sys; x=json.load(open(sys.argv[1]))['rows'][0]; print(f\"| {sys.argv[2]} | {x['kernel_us']:.1f} | {x['kernel_p10_us']:.1f} | {x['kernel_p90_us']:.1f} | {x.get('decode_kernel','')} |\")" \
    "$r/$name.json" "$name" 2>/dev/null || echo "| $name | failed | | | |"
}
{
  dev_probe_header dev/probes/36_b1_split_parts.sh
  echo "| setting (B1_N32768, split) | kernel us | p10 | p90 | decode kernel |"
  echo "| --- | ---: | ---: | ---: | --- |"
  for k in 1 2; do
    one "default_$k" "$a/pkv"
    one "nomath_$k" "$b/pkv"
    one "stages2_$k" "$a/pkv" PKV_TMA_STAGES=2
    one "stages3_$k" "$a/pkv" PKV_TMA_STAGES=3
    one "stages4_$k" "$a/pkv" PKV_TMA_STAGES=4
    one "merge_row_$k" "$a/pkv" PKV_MERGE_KERNEL=row
    one "merge_head_$k" "$a/pkv" PKV_MERGE_KERNEL=head
    one "no_pdl_$k" "$a/pkv" PKV_NO_PDL=1
    one "nomath_no_pdl_$k" "$b/pkv" PKV_NO_PDL=1
    one "register_$k" "$a/pkv" PKV_DECODE_TMA=0
  done
  echo "== bound"
  timeout 150 "$r/probe" bound
} 2>&1 | tee "$r/summary.txt"
cp "$r/summary.txt" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
