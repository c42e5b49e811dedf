#!/usr/bin/env bash
# probe_pack.sh OUT [ROUNDS] - packed work queues (pkv_plan_options.pack) on the GPU in one call: the
# working tree against kernel v8 (the previous src/cuda/decode.cu, one task per CTA; dev/decode_v8.cu
# must exist: git show 28235f0:src/cuda/decode.cu plus a pkv_cuda_decode_runs_packed that returns 0)
# on every anchor and route (dev/probe_variant_ab.sh: tests, memcheck, racecheck, alternating rounds),
# with the new build also timed packed (pack = 1) at 2 and 3 CTAs per SM and unpacked at 3; then the
# held-out traces of B 4..16 (paper shape, 2 seeds) on the fused and work-queue routes, unpacked and
# packed (while the call has time: PROBE_BUDGET_S, default 500 s).  OUT/summary.txt, OUT/heldout.txt, OUT/probe.tgz, OUT/heldout.tgz.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_pack.sh OUT [ROUNDS]}
mkdir -p "$out"
AB_RACECHECK=1 AB_EXTRA="pack:--pack=1 pack3:--pack=1,--ctas-per-unit=3 res3:--pack=-1,--ctas-per-unit=3" \
  bash "$root/dev/probe_variant_ab.sh" "$out" dev/decode_v8.cu "${2:-2}" || exit 1
h=$(mktemp -d)
for route in fused workqueue; do
  for cfg in "plain:--pack -1" "pack:--pack 1" "pack3:--pack 1 --ctas-per-unit 3"; do
    [ $SECONDS -lt "${PROBE_BUDGET_S:-500}" ] || { echo "held-out runs stopped at ${SECONDS}s" >>"$h/bench.log"; break 2; }
    timeout 200 "$root/build-gpu/pkv" bench --backend cuda --heldout-set --set-batches 4,8,16 --set-seeds 2 \
      --route $route ${cfg#*:} --reps 30 --wall-reps 3 --no-check --quiet --json "$h/${route}_${cfg%%:*}.json" \
      >/dev/null 2>>"$h/bench.log"
  done
done
python3 - "$h" <<'PY' | tee "$out/heldout.txt"
import json, sys, glob, os, collections, statistics as st
h = sys.argv[1]
runs = {}
for f in sorted(glob.glob(f"{h}/*.json")):
    name = os.path.basename(f)[:-5]
    runs[name] = {(x["step"], x["args"]): x for x in json.load(open(f))["rows"]}
for route in ("fused", "workqueue"):
    base = runs.get(f"{route}_plain", {})
    for cfg in ("pack", "pack3"):
        other = runs.get(f"{route}_{cfg}", {})
        byb = collections.defaultdict(list)
        for k, x in base.items():
            if k in other:
                byb[x["batch"]].append(other[k]["kernel_us"] / x["kernel_us"])
        for b in sorted(byb):
            v = byb[b]
            g = 1.0
            for r in v: g *= r
            print(f"{route} {cfg} / one task per CTA (2 per SM), B {b}: geomean {g ** (1 / len(v)):.4f} over {len(v)} steps, "
                  f"min {min(v):.3f} max {max(v):.3f}")
PY
tar -czf "$out/heldout.tgz" -C "$h" .
