#!/usr/bin/env bash
# probe_cpasync.sh OUT - the cp.async fill of the shared-memory ring (pages whose chunks take no tensor
# copies, v15) on the GPU in one call: builds the working tree (pkv, test_cuda); test_cuda in the default
# (cp.async for pages of 1, 2, 4, 12, ... tokens), with the chunked tensor copies off (cp.async at pages of
# 8 too) and with cp.async off; memcheck, racecheck and synccheck on a reduced set; then every anchor and
# route at page size 1 with cp.async and with the register kernels (PKV_DECODE_CPASYNC=0), alternating,
# and at page size 8 cp.async (PKV_TMA_CHUNKED=0) against the chunked tensor copies (the default) and the
# register kernels.  OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: dev/probe_cpasync.sh OUT}
mkdir -p "$out"
. "$root/dev/build.sh"
r=$(mktemp -d)
a=$root/build-gpu
dev_build "$a" "$r/build.log" "pkv test_cuda" || { tail -n 40 "$r/build.log"; exit 1; }
grep -E "spill" "$r/build.log" | head -n 8
S="$r/summary.txt"
{
  echo "# dev/probe_cpasync.sh at ${PKV_COMMIT:-unknown}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  timeout 200 "$a/tests/test_cuda" >"$r/test_cuda.log" 2>&1
  rc=$?
  echo "test_cuda (rc $rc): $(tail -n 1 "$r/test_cuda.log")"
  [ $rc -ne 0 ] && { grep -m 30 -iE "fail|error" "$r/test_cuda.log"; }
  for setting in PKV_TMA_CHUNKED=0 PKV_DECODE_CPASYNC=0; do
    env $setting PKV_TEST_CASES=20 timeout 150 "$a/tests/test_cuda" >"$r/test_cuda_$setting.log" 2>&1 &
  done
  wait
  for setting in PKV_TMA_CHUNKED=0 PKV_DECODE_CPASYNC=0; do
    echo "test_cuda, $setting: $(tail -n 1 "$r/test_cuda_$setting.log")"
    grep -m 10 -iE "fail" "$r/test_cuda_$setting.log"
  done
  for tool in memcheck racecheck synccheck; do
    n=4; [ $tool = racecheck ] && n=2
    PKV_TMA_CHUNKED=0 PKV_TEST_SMALL=1 PKV_TEST_CASES=$n timeout 150 compute-sanitizer --tool $tool "$a/tests/test_cuda" >"$r/$tool.log" 2>&1 &
  done
  wait
  for tool in memcheck racecheck synccheck; do
    echo "$tool (PKV_TMA_CHUNKED=0): $(grep -E "test_cuda:" "$r/$tool.log" | tail -n 1) $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$r/$tool.log")"
  done
  [ $rc -eq 0 ] || exit 1
  bench() { # NAME ENV... -- ARGS...
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout 200 "$a/pkv" bench --backend cuda --anchor all --route all --reps 30 --wall-reps 2 \
      --no-check --quiet "$@" --json "$r/$name.json" >/dev/null 2>>"$r/bench.log"
  }
  for k in 1 2; do
    bench c1_$k PKV_DECODE_CPASYNC=1 -- --page-size 1
    bench r1_$k PKV_DECODE_CPASYNC=0 -- --page-size 1
  done
  bench c8_1 PKV_TMA_CHUNKED=0 -- --page-size 8
  bench t8_1 PKV_TMA_CHUNKED=8 -- --page-size 8
  bench r8_1 PKV_TMA_CHUNKED=0 PKV_DECODE_CPASYNC=0 -- --page-size 8
  python3 - "$r" <<'PY'
import json, sys, statistics as st
r = sys.argv[1]
def load(n):
    try:
        return {(x["step"], x["route"]): x for x in json.load(open(f"{r}/{n}.json"))["rows"]}
    except Exception:
        return {}
def gm(v):
    g = 1.0
    for x in v: g *= x
    return g ** (1 / len(v)) if v else float("nan")
for title, A, B in (("page 1: cp.async / register kernels", ["c1_1", "c1_2"], ["r1_1", "r1_2"]),
                    ("page 8: cp.async / chunked tensor copies", ["c8_1"], ["t8_1"]),
                    ("page 8: cp.async / register kernels", ["c8_1"], ["r8_1"])):
    a = [load(n) for n in A]; b = [load(n) for n in B]
    if not all(a + b):
        print(f"\n## {title}: missing runs"); continue
    keys = [k for k in a[0] if all(k in d for d in a + b)]
    print(f"\n## {title}\n| anchor | route | A us | B us | A / B | A of ceiling | A kernel |\n| --- | --- | ---: | ---: | ---: | ---: | --- |")
    ratios, best = {}, {}
    for k in keys:
        ma = st.median([d[k]["kernel_us"] for d in a]); mb = st.median([d[k]["kernel_us"] for d in b])
        ratios[k] = ma / mb
        print(f"| {k[0]} | {k[1]} | {ma:.1f} | {mb:.1f} | {ma / mb:.3f} | {a[0][k]['frac_read_ceiling']:.3f} | {a[0][k].get('decode_kernel', '')} |")
        s = best.setdefault(k[0], [1e30, 1e30])
        s[0] = min(s[0], ma); s[1] = min(s[1], mb)
    for rt in sorted({k[1] for k in keys}):
        print(f"geomean A / B, route {rt}: {gm([x for k, x in ratios.items() if k[1] == rt]):.4f}")
    print(f"geomean A / B, best route of each: {gm([v[0] / v[1] for v in best.values()]):.4f}; "
          + ", ".join(f"{s} {v[0]:.1f}/{v[1]:.1f}" for s, v in best.items()))
PY
} 2>&1 | tee "$S.all"
mv "$S.all" "$S"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
