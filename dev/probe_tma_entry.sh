#!/usr/bin/env bash
# probe_tma_entry.sh OUT - what the tensor-copy kernel gains from work before its dependency wait
# (PKV_TMA_ENTRY: 0 none, 1 prefetch.tensormap of the K and V maps, 2 that and the warps' barrier set-up).
#  1. builds pkv and test_cuda (build-gpu; scripts/gpu_check.sh runs test_cuda with PKV_TMA_ENTRY=2);
#  2. every anchor, auto, in passes 0 1 2 0 1 2: kernel time as the anchors are timed (events around the
#     run) and behind a kernel that writes q (PDL on: the entry work overlaps the producer's end).
# Everything lands in OUT (summary.txt, the JSON and Markdown of each pass, logs).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_tma_entry.sh OUT}
mkdir -p "$out"
b=$root/build-gpu
. "$root/dev/build.sh"
dev_build "$b" "$out/build.log" "pkv test_cuda" || { tail -n 40 "$out/build.log"; exit 1; }
S="$out/summary.txt"
for pass in a b; do
  for e in 0 1 2; do
    PKV_TMA_ENTRY=$e "$b/pkv" bench --backend cuda --anchor all --route auto --reps 100 --wall-reps 5 --no-check \
      --behind-producer --json "$out/entry${e}$pass.json" >"$out/entry${e}$pass.md" 2>>"$out/bench.log"
  done
done
python3 - "$out" <<'PY' | tee -a "$S"
import json, math, sys
o = sys.argv[1]
def load(n):
    return {r["step"]: r for r in json.load(open(f"{o}/entry{n}.json"))["rows"]}
runs = {e: (load(f"{e}a"), load(f"{e}b")) for e in (0, 1, 2)}
def k(e, s):
    return sum(r[s]["kernel_us"] for r in runs[e]) / 2
def bh(e, s):
    return sum(r[s]["producer_step_us"] - r[s]["producer_us"] for r in runs[e]) / 2
print("\n== auto, PKV_TMA_ENTRY 0 / 1 / 2; us, mean of two passes' medians; behind = (producer + step) - producer alone")
print("| step | kernel 0 | 1 | 2 | 1 vs 0 | 2 vs 0 | behind 0 | 1 | 2 | 1 vs 0 | 2 vs 0 |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
g = {x: [] for x in ("k1", "k2", "b1", "b2")}
for s in runs[0][0]:
    k0, k1, k2, b0, b1, b2 = k(0, s), k(1, s), k(2, s), bh(0, s), bh(1, s), bh(2, s)
    g["k1"].append(k1 / k0); g["k2"].append(k2 / k0); g["b1"].append(b1 / b0); g["b2"].append(b2 / b0)
    print(f"| {s} | {k0:.2f} | {k1:.2f} | {k2:.2f} | {k1 - k0:+.2f} | {k2 - k0:+.2f} | {b0:.2f} | {b1:.2f} | {b2:.2f} | {b1 - b0:+.2f} | {b2 - b0:+.2f} |")
gm = lambda v: math.exp(sum(map(math.log, v)) / len(v))
print(f"\ngeomean time ratio vs 0: kernel 1 {gm(g['k1']):.4f}, 2 {gm(g['k2']):.4f}; behind 1 {gm(g['b1']):.4f}, 2 {gm(g['b2']):.4f}")
a0, b0 = runs[0]
print("pass-to-pass noise at 0 (geomean b/a, kernel): %.4f" % gm([b0[s]["kernel_us"] / a0[s]["kernel_us"] for s in a0]))
PY
