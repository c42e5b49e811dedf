#!/usr/bin/env bash
# 29_no_math.sh OUT - how much of each anchor's time the tensor-copy kernel's math holds on the critical
# path, and whether its own reads are faster than the pages floor (the warp-per-page gather that bounds
# B1_N32768 at 0.80 of the read ceiling; kernel-notes "Now"): a variant of the working tree's decode.cu
# with the per-tile math (S^T, softmax, O^T) compiled out - the ring is filled and drained as before, the
# outputs are garbage (no reference check) - against the working tree, every anchor and route, two
# alternating rounds.  The bench rows carry the pages floor of the same run.  OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/29_no_math.sh OUT}
mkdir -p "$out"
. "$root/dev/lib/build.sh"
variant=dev/decode_nomath.cu
dev_nomath_variant "$variant" || exit 1
dev_ab_setup "$variant"   # a: working tree, b: the variant
{
  dev_probe_header dev/probes/29_no_math.sh
  for k in 1 2; do
    dev_bench "nomath_$k" "$b/pkv" PKV_DECODE_CPASYNC=default --
    dev_bench "full_$k" "$a/pkv" PKV_DECODE_CPASYNC=default --
  done
  python3 "$dev_root/dev/lib/ab_table.py" "$r" "paper shape: math compiled out (variant) / the working tree" \
    nomath_1,nomath_2 full_1,full_2
  python3 - "$r" <<'PY'
import json, sys
try:
    rows = json.load(open(f"{sys.argv[1]}/nomath_1.json"))["rows"]
except (OSError, ValueError, KeyError):
    print("nomath_1: no result"); sys.exit(0)
print("\n| anchor | route | no-math kernel us | pages floor us | no-math / pages floor |\n| --- | --- | ---: | ---: | ---: |")
for x in rows:
    if x["step"].startswith("B1_") and x["route"] in ("split", "workqueue"):
        pf = x.get("pages_floor_us")
        print(f"| {x['step']} | {x['route']} | {x['kernel_us']:.1f} | {pf if pf is None else f'{pf:.1f}'} | "
              f"{x['kernel_us'] / pf if pf else float('nan'):.3f} |")
PY
} 2>&1 | tee "$r/summary.txt.all"
rm -f "$root/$variant"
dev_probe_finish
