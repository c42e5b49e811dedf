#!/usr/bin/env bash
# probe_cpasync_stages.sh OUT - does a deeper ring make v15's cp.async fill win on small grids too?  Builds
# pkv (sm_90a) and benches every anchor and route at page size 1, alternating over two rounds: cp.async on
# every grid with the default ring (2 stages per warp at d = 128: 3 CTAs per SM), with 3 stages
# (PKV_TMA_STAGES=3: 2 CTAs per SM, the most a grid of up to 2 per SM uses), and the register kernels.
# OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_cpasync_stages.sh OUT}
mkdir -p "$out"
. "$root/dev/build.sh"
r=$(mktemp -d)
a=$root/build-gpu
dev_build "$a" "$r/build.log" pkv -DBUILD_TESTING=OFF || { tail -n 40 "$r/build.log"; exit 1; }
S="$r/summary.txt"
{
  echo "# dev/probe_cpasync_stages.sh at ${PKV_COMMIT:-unknown}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  bench() { # NAME ENV...
    local name=$1; shift
    env "$@" timeout 100 "$a/pkv" bench --backend cuda --anchor all --route all --reps 30 --wall-reps 2 \
      --no-check --quiet --page-size 1 --json "$r/$name.json" >/dev/null 2>>"$r/bench.log"
  }
  for k in 1 2; do
    bench c2_$k PKV_DECODE_CPASYNC=all
    bench c3_$k PKV_DECODE_CPASYNC=all PKV_TMA_STAGES=3
    bench r_$k PKV_DECODE_CPASYNC=0
  done
  python3 - "$r" <<'PY'
import json, sys, statistics as st
r = sys.argv[1]
def load(n):
    try:
        return {(x["step"], x["route"]): x for x in json.load(open(f"{r}/{n}.json"))["rows"]}
    except Exception:
        return {}
runs = {c: [load(f"{c}_{k}") for k in (1, 2)] for c in ("c2", "c3", "r")}
if not all(all(v) for v in runs.values()):
    print("missing runs"); sys.exit(0)
keys = [k for k in runs["r"][0] if all(k in d for v in runs.values() for d in v)]
med = {c: {k: st.median([d[k]["kernel_us"] for d in v]) for k in keys} for c, v in runs.items()}
print("| anchor | route | tasks | cp.async 2 stages us | cp.async 3 stages us | registers us | 2st / reg | 3st / reg |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for k in keys:
    a, b, c = med["c2"][k], med["c3"][k], med["r"][k]
    print(f"| {k[0]} | {k[1]} | {runs['r'][0][k]['tasks']} | {a:.1f} | {b:.1f} | {c:.1f} | {a / c:.3f} | {b / c:.3f} |")
PY
} 2>&1 | tee "$S.all"
mv "$S.all" "$S"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
