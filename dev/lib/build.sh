# dev/lib/build.sh - sourced by the dev probes: the GPU builds they start with.
# dev_build DIR LOG TARGETS [CMAKE OPTIONS...]: a Release build for sm_90a of TARGETS ("" for all) in DIR,
# with the extra cmake options (e.g. -DBUILD_TESTING=OFF -DPKV_TIMELINE=ON); its output goes to LOG.
dev_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dev_build() {
  local dir=$1 log=$2 targets=$3
  shift 3
  { cmake -S "$dev_root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real "$@" &&
    cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 8)" ${targets:+--target $targets}; } >"$log" 2>&1
}
# dev_build_ab NEW_DIR OLD_DIR VARIANT_SOURCE LOGDIR: the A/B pair of the kernel probes, built side by side -
# the working tree in NEW_DIR (pkv, test_cuda) and the decode source VARIANT_SOURCE in OLD_DIR (pkv); logs
# LOGDIR/build.log and LOGDIR/build_variant.log.  Fails (with the failing log's tail) when a binary is missing.
dev_build_ab() {
  local new=$1 old=$2 variant=$3 logs=$4
  dev_build "$new" "$logs/build.log" "pkv test_cuda" -DBUILD_TESTING=ON &
  dev_build "$old" "$logs/build_variant.log" pkv -DBUILD_TESTING=OFF -DPKV_DECODE_SOURCE="$variant" &
  wait
  [ -x "$new/pkv" ] && [ -x "$new/tests/test_cuda" ] || { tail -n 40 "$logs/build.log"; return 1; }
  [ -x "$old/pkv" ] || { tail -n 40 "$logs/build_variant.log"; return 1; }
}
# dev_build_overlay DIR LOG TARGETS NAME [CMAKE OPTIONS...]: a Release build for sm_90a of TARGETS in DIR of a copy
# of the working tree (sources only: no build folders, no .whl) with the files of dev/variants/NAME/ laid over it
# at the same paths - a variant of whole library files, measured beside the tree it came from.  The copy is
# DIR.src; fails with the log's tail when the build does.
dev_build_overlay() {
  local dir=$1 log=$2 targets=$3 name=$4
  shift 4
  local src=$dir.src
  rm -rf "$src" && mkdir -p "$src" || return 1
  (cd "$dev_root" && tar -cf - --exclude='./build*' --exclude=./.whl --exclude=./.whl-hf --exclude=./.git .) |
    (cd "$src" && tar -xf -) || return 1
  [ -d "$dev_root/dev/variants/$name" ] || { echo "no dev/variants/$name" >"$log"; return 1; }
  cp -r "$dev_root/dev/variants/$name/." "$src/" || return 1
  { cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real "$@" &&
    cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 8)" ${targets:+--target $targets}; } >"$log" 2>&1 ||
    { tail -n 40 "$log"; return 1; }
}
# dev_ab_setup VARIANT_SOURCE: the start of the A/B probes - r, a fresh log directory; a, the working tree's
# build (build-gpu: pkv, test_cuda); b, VARIANT_SOURCE's (build-variant: pkv) - built side by side; exits the
# probe when a build fails.
dev_ab_setup() {
  r=$(mktemp -d)
  a=$dev_root/build-gpu; b=$dev_root/build-variant
  dev_build_ab "$a" "$b" "$1" "$r" || exit 1
}
# dev_bench NAME BIN ENV... -- ARGS...: every anchor and route on the GPU (30 CUDA-event runs each, no
# reference check) by BIN (a pkv) under the environment ENV, with ARGS, into $r/NAME.json (r: the probe's log
# directory; its stderr appends to $r/bench.log).  dev/lib/ab_table.py then compares such runs.
dev_bench() {
  local name=$1 bin=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout 200 "$bin" bench --backend cuda --anchor all --route all --reps 30 --wall-reps 2 \
    --no-check --quiet "$@" --json "$r/$name.json" >/dev/null 2>>"$r/bench.log"
}
# dev_probe_start OUT TARGETS [CMAKE OPTIONS...]: the start of a probe - out (OUT, created), r (a fresh log
# directory), a (the working tree's build, build-gpu, with TARGETS built and the cmake options); exits the
# probe when the build fails.
dev_probe_start() {
  local targets=$2
  out=$1
  mkdir -p "$out"
  r=$(mktemp -d)
  a=$dev_root/build-gpu
  shift 2
  dev_build "$a" "$r/build.log" "$targets" "$@" || { tail -n 40 "$r/build.log"; exit 1; }
}
# dev_probe_header NAME: a probe summary's first lines - NAME, the commit (PKV_COMMIT: the device's copy of
# the tree has no .git), the date, the GPU and its driver.
dev_probe_header() {
  echo "# $1 at ${PKV_COMMIT:-unknown}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
}
# dev_probe_finish: the end of a probe whose output went to $r/summary.txt.all - OUT/summary.txt, and
# OUT/probe.tgz with every log of $r.
dev_probe_finish() {
  mv "$r/summary.txt.all" "$r/summary.txt"
  cp "$r/summary.txt" "$out/summary.txt"
  tar -czf "$out/probe.tgz" -C "$r" .
}
# dev_nomath_variant FILE: writes FILE (relative to the root) as src/cuda/decode.cu with the tensor-copy
# kernel's per-tile math (S^T, softmax, O^T) compiled out - the ring is filled and drained as before, the
# outputs are garbage (time it with --no-check); fails when the edit did not apply.
dev_nomath_variant() {
  sed -e '/\/\/ ---- S^T = K Q^T (two accumulators per n-tile/i #if 0 // dev/probes/29_no_math.sh: no math' \
    -e '/\/\/ ---- refill this stage with tile it + S/i #endif' "$dev_root/src/cuda/decode.cu" >"$dev_root/$1"
  [ "$(grep -c "^#if 0 // dev/probes/29_no_math.sh" "$dev_root/$1")" = 1 ] || { echo "the variant's edit did not apply"; return 1; }
}
# dev_build_read_probe BIN LOG: dev/cuda/read_patterns.cu (standalone, nvcc alone, sm_90a) into BIN, its
# output to LOG; fails with the log's tail.
dev_build_read_probe() {
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$dev_root/include" -I"$dev_root/src/core" \
    -I"$dev_root/src/cuda" "$dev_root/dev/cuda/read_patterns.cu" -o "$1" >"$2" 2>&1 || { tail -n 30 "$2"; return 1; }
}
