#!/usr/bin/env bash
# 25_g16_d64_tensor_copies.sh OUT - G 9..16 at d = 64 through the tensor-copy kernel (kernel-notes v14's second review):
# the working tree runs the heads-in-M register kernel there (its two-n-tile tensor-copy instance takes 140
# registers, 3 CTAs per SM, so tma_setup gives it no ring); the variant, made here from the working tree's
# decode.cu, compiles that instance for 4 CTAs per SM (128 registers without spills in all three copy modes,
# ptxas for sm_90a), which gives it a ring.  One
# call: both builds side by side (pkv), the variant's outputs against the float64 reference on small steps of
# G 12 and 16 at d = 64 (every route, with the decode kernel each ran), then every anchor and route at
# 48:4:64 (G 12) and 64:4:64 (G 16), bf16, variant against working tree, alternating over two rounds.
# OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/25_g16_d64_tensor_copies.sh OUT}
mkdir -p "$out"
variant=dev/decode_g16d64.cu
sed 's/__launch_bounds__(kThreads, NT == 2 || D > 128 ? 2 : D <= 64 ? 4 : 3)/__launch_bounds__(kThreads, D > 128 || (NT == 2 \&\& D > 64) ? 2 : D <= 64 ? 4 : 3)/' \
  "$root/src/cuda/decode.cu" >"$root/$variant"
cmp -s "$root/src/cuda/decode.cu" "$root/$variant" && { echo "the variant's edit did not apply"; exit 1; }
. "$root/dev/lib/build.sh"
dev_ab_setup "$variant"   # a: working tree, b: the variant
S="$r/summary.txt"
{
  echo "# dev/probes/25_g16_d64_tensor_copies.sh at ${PKV_COMMIT:-unknown}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  for shape in 48:4:64 64:4:64; do
    for bin in "$b/pkv" "$a/pkv"; do
      j="$r/check_${shape//:/_}_$(basename "$(dirname "$bin")").json"
      timeout 120 "$bin" bench --backend cuda --shape "$shape" --dtype bf16 --lens 3001,17,1,0,700 --route all \
        --reps 3 --wall-reps 1 --json "$j" >/dev/null 2>>"$r/bench.log"
      python3 - "$j" "$shape" "$(basename "$(dirname "$bin")")" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except (OSError, ValueError, KeyError):
    print(f"check {sys.argv[2]} {sys.argv[3]}: no result"); sys.exit(0)
print(f"check {sys.argv[2]} {sys.argv[3]}: kernels {sorted({r.get('decode_kernel') for r in rows})}, worst rel err "
      f"{max((r['rel_err'] for r in rows if r['rel_err'] is not None), default=float('nan')):.1e}, unwritten outputs {sum(r['unwritten_outputs'] for r in rows)}")
PY
    done
  done
  for k in 1 2; do
    for shape in 48:4:64 64:4:64; do
      dev_bench "v_${shape//:/_}_$k" "$b/pkv" -- --shape "$shape" --dtype bf16
      dev_bench "t_${shape//:/_}_$k" "$a/pkv" -- --shape "$shape" --dtype bf16
    done
  done
  ab="$root/dev/lib/ab_table.py"
  python3 "$ab" "$r" "G 12 at d = 64 (48:4:64): tensor copies (variant) / register kernel (tree)" v_48_4_64_1,v_48_4_64_2 t_48_4_64_1,t_48_4_64_2
  python3 "$ab" "$r" "G 16 at d = 64 (64:4:64): tensor copies (variant) / register kernel (tree)" v_64_4_64_1,v_64_4_64_2 t_64_4_64_1,t_64_4_64_2
} 2>&1 | tee "$S.all"
mv "$S.all" "$S"
rm -f "$root/$variant"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
