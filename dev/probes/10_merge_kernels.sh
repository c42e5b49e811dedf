#!/usr/bin/env bash
# 10_merge_kernels.sh OUT - the merge kernels A/B (PKV_MERGE_KERNEL=head|row, and the default choice) on
# the anchors that merge (split and work-queue routes), their correctness (test_cuda with each merge
# kernel forced), and the tail timelines of dev/probes/11_merge_tail.sh.  OUT/summary.txt, OUT/probe.tgz.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/10_merge_kernels.sh OUT}
r=$(mktemp -d)
b=$root/build-gpu
. "$root/dev/lib/build.sh"
dev_build "$b" "$r/build.log" "pkv test_cuda" &
bash "$root/dev/probes/11_merge_tail.sh" "$r" >"$r/tail.log" 2>&1 &
wait
[ -x "$b/pkv" ] || { tail -n 40 "$r/build.log"; exit 1; }
S="$r/summary.txt"
{
for mk in head row; do
  echo "merge=$mk test_cuda: $(PKV_MERGE_KERNEL=$mk PKV_TEST_CASES=40 "$b/tests/test_cuda" 2>&1 | tail -n 1)"
done
echo "default test_cuda: $(PKV_TEST_CASES=40 "$b/tests/test_cuda" 2>&1 | tail -n 1)"
cat "$r/summary.txt" 2>/dev/null
echo "== merge A/B (kernel us, 100 reps)"
for mk in default head row; do
  env $( [ $mk = default ] || echo PKV_MERGE_KERNEL=$mk ) "$b/pkv" bench --backend cuda --anchor all --route split \
    --reps 100 --wall-reps 5 --no-check --quiet --json "$r/ab_${mk}_split.json" >/dev/null 2>>"$r/bench.log"
  env $( [ $mk = default ] || echo PKV_MERGE_KERNEL=$mk ) "$b/pkv" bench --backend cuda --anchor all --route workqueue \
    --reps 100 --wall-reps 5 --no-check --quiet --json "$r/ab_${mk}_workqueue.json" >/dev/null 2>>"$r/bench.log"
done
python3 - "$r" <<'PY'
import json, sys
r = sys.argv[1]
def load(mk, rt):
    return {x["step"]: x["kernel_us"] for x in json.load(open(f"{r}/ab_{mk}_{rt}.json"))["rows"]}
for rt in ("split", "workqueue"):
    d, h, w = load("default", rt), load("head", rt), load("row", rt)
    print(f"| {rt} step | default us | head us | row us |")
    for k in d:
        print(f"| {k} | {d[k]:.1f} | {h[k]:.1f} | {w[k]:.1f} |")
PY
} 2>&1 | tee "$S.all"
mv "$S.all" "$S"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" .
