#!/usr/bin/env bash
# 16_settings_ab.sh OUT [ROUNDS] - one build of the working tree timed under several environment settings
# in one device call, alternating the settings for ROUNDS rounds (default 2; no round starts after ~5
# minutes): every route of the chosen anchor steps in a chosen shape, each a median of CUDA-event runs.
# test_cuda runs first under every setting (a setting whose kernels fail stops nothing but is marked).
#   PROBE_SETTINGS  "name:VAR=value,VAR=value ..." (an empty list after the colon: the defaults);
#                   default "reg:PKV_DECODE_TMA=0 tma:" (register kernels against the tensor-copy kernel)
#   PROBE_SHAPE     pkv bench shape options, default "--shape d256 --dtype bf16"
#   PROBE_ANCHORS   anchor names, default a spread of B1 .. B64
#   PROBE_REPS      CUDA-event runs per route, default 50
#   PROBE_TRACES    trace runs too, "family:B ..." (held-out seed 20260624, 3B requests, the first 8 steps)
# Reuses build-gpu when scripts/gpu_check.sh built it in the same call.  OUT/summary.txt (per anchor: the
# best route and auto under each setting, medians over rounds, ratios to the first setting),
# OUT/probe.tgz (the JSON and logs).
set -u
. "$(dirname "$0")/../lib/build.sh"
root=$dev_root
rounds=${2:-2}
t0=$(date +%s)
dev_probe_start "${1:?usage: dev/probes/16_settings_ab.sh OUT [ROUNDS]}" "pkv test_cuda" -DBUILD_TESTING=ON
settings=${PROBE_SETTINGS:-"reg:PKV_DECODE_TMA=0 tma:"}
shape=${PROBE_SHAPE:-"--shape d256 --dtype bf16"}
anchors=${PROBE_ANCHORS:-"B1_N2048 B1_N8192 B1_N32768 B1_N65536 B4_zipf B8_bimodal B8_uniform B16_zipf B32_bimodal B64_uniform"}
reps=${PROBE_REPS:-50}
S="$r/summary.txt"
{
  echo "# dev/probes/16_settings_ab.sh: commit ${PKV_COMMIT:-$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null)};" \
    "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null); $(date -u +%FT%TZ);" \
    "shape: $shape; settings: $settings; $rounds rounds of $reps runs"
  for c in $settings; do
    name=${c%%:*}; envs=${c#*:}
    echo "test_cuda $name ($envs): $(env ${envs//,/ } PKV_TEST_CASES=24 timeout 200 "$a/tests/test_cuda" 2>&1 | tail -n 1)"
  done
  for k in $(seq 1 "$rounds"); do
    [ $(( $(date +%s) - t0 )) -lt 300 ] || { echo "round $k skipped (time)"; break; }
    for c in $settings; do
      name=${c%%:*}; envs=${c#*:}
      for an in $anchors; do
        env ${envs//,/ } timeout 120 "$a/pkv" bench --backend cuda $shape --anchor "$an" --reps "$reps" --wall-reps 3 \
          --no-check --quiet --json "$r/${name}_${k}_${an}.json" >/dev/null 2>>"$r/bench.log" ||
          echo "bench $name $an round $k failed"
      done
      for tr in ${PROBE_TRACES:-}; do
        fam=${tr%%:*}; B=${tr#*:}
        env ${envs//,/ } timeout 120 "$a/pkv" bench --backend cuda $shape --trace "$fam" --seed 20260624 --batch "$B" \
          --requests $((3 * B)) --steps 8 --reps "$reps" --wall-reps 3 --no-check --quiet \
          --json "$r/${name}_${k}_${fam}${B}.json" >/dev/null 2>>"$r/bench.log" || echo "bench $name $tr round $k failed"
      done
    done
  done
  python3 - "$r" "$settings" <<'PY'
import glob, json, sys, statistics as st
r, settings = sys.argv[1], [c.split(":")[0] for c in sys.argv[2].split()]
t = {}  # (step, setting, route) -> [kernel us per round]
order = []
for n in settings:
    for f in sorted(glob.glob(f"{r}/{n}_*.json")):
        tag = f.rsplit("/", 1)[1][:-5].split("_", 2)[2]  # NAME_ROUND_TAG.json: the anchor, or family and B
        try:
            rows = json.load(open(f))["rows"]
        except Exception:
            continue
        for x in rows:
            step = x["step"] if x["step"] == tag else tag + ":" + x["step"]
            if step not in order: order.append(step)
            t.setdefault((step, n, x["route"]), []).append(x["kernel_us"])
routes = sorted({k[2] for k in t})
def med(s, n, ro):
    v = t.get((s, n, ro))
    return st.median(v) if v else None
def best(s, n):
    c = [(med(s, n, ro), ro) for ro in routes if ro != "auto" and med(s, n, ro) is not None]
    return min(c) if c else (None, "-")
print("| step | " + " | ".join(f"{n} best (route) | {n} auto" for n in settings) + " | best " +
      " | ".join(f"{n}/{settings[0]}" for n in settings[1:]) + " |")
print("| --- |" + " ---: | ---: |" * len(settings) + " ---: |" * (len(settings) - 1))
ratios = {n: [] for n in settings[1:]}
for s in order:
    cells, b0 = [], best(s, settings[0])[0]
    for n in settings:
        b, ro = best(s, n)
        a = med(s, n, "auto")
        cells.append(f"{b:.1f} ({ro})" if b else "-")
        cells.append(f"{a:.1f}" if a else "-")
    rs = []
    for n in settings[1:]:
        b = best(s, n)[0]
        if b and b0:
            ratios[n].append(b / b0)
            rs.append(f"{b / b0:.3f}")
        else:
            rs.append("-")
    print(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(rs) + " |")
for n, v in ratios.items():
    if v:
        g = 1.0
        for x in v: g *= x
        print(f"geomean best-route time {n}/{settings[0]}: {g ** (1 / len(v)):.3f} over {len(v)} steps")
print()
print("every route (kernel us, median over rounds):")
for s in order:
    for ro in routes:
        print(f"{s} {ro}: " + "  ".join(f"{n} {med(s, n, ro):.1f}" if med(s, n, ro) else f"{n} -" for n in settings))
PY
} 2>&1 | tee "$S"
cp "$S" "$out/summary.txt"
tar -czf "$out/probe.tgz" -C "$r" . 2>/dev/null
