#!/usr/bin/env bash
# 19_graph_stable.sh OUT [ROUNDS] - graph-stable plans (pkv_plan_options.graph_max_batch) on the GPU in one
# device call: test_cuda by default (its graph-stable cases capture a CUDA graph once and replay it for
# steps of other lengths and batch sizes), with the tasks dealt over 16 SMs (PKV_GRAPH_CLAIM_SMS=16: more
# tasks per SM than CTAs, the waiting CTAs must find and run the unclaimed ones), without the claim by SM
# (PKV_GRAPH_CLAIM=0) and in the first-CTAs order (PKV_GRAPH_SPREAD=0); compute-sanitizer memcheck and
# racecheck on the reduced set (memcheck also with 16 SMs); then the 26 anchor steps on the work queue,
# plain against graph-stable plans (capacity: the step's batch rounded up to a power of two), each
# variant of VARIANTS in turn for up to ROUNDS rounds (default 2).  OUT/summary.txt: per anchor the
# kernel time of each variant and its ratio to the plain work queue.
# VARIANTS="name:ENV:ARGS ...": ENV the variant's environment (NAME=value, comma-separated; - for none),
# ARGS more pkv bench arguments (comma-separated; - for none); variants named plain* run plain plans, the
# one named plain is the ratios' base.  TESTS=quick: instead of the tests above, test_cuda (20 random
# cases) once under each variant's environment, side by side, no sanitizers.
# BENCH_ARGS: more pkv bench arguments for every variant (space-separated; e.g. "--shape 32:8:64 --page-size 1").
# Default: plain, the claim by SM, and without it.  The grids of dfe7155's probe, for instance:
# VARIANTS="plain:-:- graph1:-:- graph2:-:--graph-tasks,792 graph4:-:--graph-tasks,1584"
set -u
. "$(dirname "$0")/../lib/build.sh"
root=$dev_root
rounds=${2:-2}
t0=$(date +%s)
dev_probe_start "${1:?usage: dev/probes/19_graph_stable.sh OUT [ROUNDS]}" "pkv test_cuda" -DBUILD_TESTING=ON
echo "build: $(( $(date +%s) - t0 )) s"
variants=${VARIANTS:-"plain:-:- claim:-:- spread:PKV_GRAPH_CLAIM=0:-"}
if [ "${TESTS:-full}" = quick ]; then # test_cuda once under each variant's environment, side by side
  pids=""
  for v in $variants; do
    IFS=: read -r name envv args <<<"$v"
    [ "$envv" = - ] && envv="" || envv=${envv//,/ }
    env $envv PKV_TEST_CASES=20 timeout 300 "$a/tests/test_cuda" >"$r/test_cuda_$name.log" 2>&1 & pids="$pids $!"
  done
  wait $pids
  for v in $variants; do
    n=${v%%:*}; echo "test_cuda ($n): $(tail -n 1 "$r/test_cuda_$n.log")"; grep -E "FAIL" "$r/test_cuda_$n.log" | head -n 10
  done
else
  PKV_TEST_CASES=60 timeout 300 "$a/tests/test_cuda" >"$r/test_cuda.log" 2>&1 &
  tpid=$!
  PKV_GRAPH_CLAIM_SMS=16 PKV_TEST_CASES=30 timeout 300 "$a/tests/test_cuda" >"$r/test_cuda_16.log" 2>&1 &
  t2pid=$!
  PKV_GRAPH_CLAIM=0 PKV_TEST_CASES=30 timeout 300 "$a/tests/test_cuda" >"$r/test_cuda_spread.log" 2>&1 &
  t3pid=$!
  PKV_GRAPH_SPREAD=0 PKV_TEST_CASES=30 timeout 300 "$a/tests/test_cuda" >"$r/test_cuda_first.log" 2>&1 &
  t4pid=$!
  san() { # tool log [env]
    { env ${3:-} PKV_TEST_SMALL=1 PKV_TEST_CASES=6 timeout 400 compute-sanitizer --tool "$1" --error-exitcode 3 \
        "$a/tests/test_cuda" >"$r/$2.log" 2>&1; echo "$2 rc=$?" >>"$r/$2.log"; } &
  }
  san memcheck memcheck; p1=$!
  san racecheck racecheck; p2=$!
  san memcheck memcheck_16 PKV_GRAPH_CLAIM_SMS=16; p3=$!
  wait $tpid $t2pid $t3pid $t4pid
  for f in test_cuda test_cuda_16 test_cuda_spread test_cuda_first; do echo "$f: $(tail -n 1 "$r/$f.log")"; grep -E "FAIL" "$r/$f.log" | head -n 10; done
  wait $p1 $p2 $p3 # nothing else on the GPU while the steps are timed
  tail -n 3 "$r/memcheck.log" "$r/racecheck.log" "$r/memcheck_16.log"
fi
echo "tests done: $(( $(date +%s) - t0 )) s"
for k in $(seq 1 "$rounds"); do
  [ $(( $(date +%s) - t0 )) -lt 420 ] || { echo "round $k skipped (time)"; break; }
  for v in $variants; do
    IFS=: read -r name envv args <<<"$v"
    [ "$envv" = - ] && envv="" || envv=${envv//,/ }
    [ "$args" = - ] && args="" || args=${args//,/ }
    extra="--graph-max-batch pow2 $args"
    case $name in plain*) extra=$args ;; esac
    check="--no-check"; [ "$k" = 1 ] && [ "$name" != plain ] && check=""
    env $envv "$a/pkv" bench --backend cuda --anchor all --route workqueue --reps 50 --warmup 5 --wall-reps 5 $check $extra \
      ${BENCH_ARGS:-} \
      --json "$r/${name}_$k.json" --quiet >"$r/${name}_$k.log" 2>&1 || echo "$name round $k: rc=$?"
  done
  echo "round $k done: $(( $(date +%s) - t0 )) s"
done
python3 - "$r" $(for v in $variants; do echo "${v%%:*}"; done) <<'EOF' | tee "$r/summary.txt"
import json, glob, os, statistics, sys
r = sys.argv[1]
names = sys.argv[2:]
t, ctas, err = {}, {}, {}
for n in names:
    for f in sorted(glob.glob(os.path.join(r, f"{n}_*.json"))):
        d = json.load(open(f))
        for row in d["rows"]:
            t.setdefault((row["step"], n), []).append(row["kernel_us"])
            ctas[(row["step"], n)] = row.get("grid_ctas", row.get("tasks"))
            if row.get("rel_err") is not None: err[(row["step"], n)] = row["rel_err"]
steps = []
for (s, n) in t:
    if s not in steps: steps.append(s)
print("| step | " + " | ".join(f"{n} us (CTAs)" for n in names) + " | " + " | ".join(f"{n}/plain" for n in names[1:]) + " | worst rel err |")
print("| --- |" + " ---: |" * (2 * len(names)))
ratios = {n: [] for n in names[1:]}
for s in steps:
    med = {n: statistics.median(t[(s, n)]) for n in names if (s, n) in t}
    cells = [f"{med[n]:.1f} ({ctas.get((s, n))})" if n in med else "-" for n in names]
    rs = []
    for n in names[1:]:
        if n in med and "plain" in med:
            ratios[n].append(med[n] / med["plain"]); rs.append(f"{med[n] / med['plain']:.3f}")
        else:
            rs.append("-")
    e = max([err[(s, n)] for n in names if (s, n) in err] or [float("nan")])
    print(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(rs) + f" | {e:.1e} |")
for n, v in ratios.items():
    if v:
        g = 1.0
        for x in v: g *= x
        print(f"{n}/plain: geomean {g ** (1 / len(v)):.4f}, min {min(v):.3f}, max {max(v):.3f} over {len(v)} steps")
EOF
cp "$r/summary.txt" "$out/" 2>/dev/null
tar czf "$out/probe.tgz" -C "$r" .
