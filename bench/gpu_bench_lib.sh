# bench/gpu_bench_lib.sh - what the GPU-machine drivers of the FlashInfer benchmarks share (sourced by
# bench/run_compare.sh and bench/run_e2e.sh): their output folder, time limit and environment, FlashInfer from
# the carried wheels, nvcc on the PATH, the library and its lab built for sm_90a beside FlashInfer's JIT
# warm-up, the time left, the JIT cache saved for the next call, and the run's log.  The sourcing script sets
# T0, REPO and OUT, calls gpu_bench_init, defines say and run, and ends with gpu_bench_main.

elapsed() { echo $(( $(date +%s) - T0 )); }

# OUT created and made absolute, LIMIT (PKV_TIME_LIMIT_S, default 570: the device tool stops a command at
# 600 s), the benchmarks' environment, and TABLE: a temporary file for the short table printed last ($1: the
# driver's name).
gpu_bench_init() {
  mkdir -p "$OUT"
  OUT="$(cd "$OUT" && pwd)"
  LIMIT=${PKV_TIME_LIMIT_S:-570}
  export PYTHONUNBUFFERED=1
  export FLASHINFER_NO_DOWNLOAD=1
  export PKV_FLASHINFER_CACHE="${PKV_FLASHINFER_CACHE:-$REPO/build-gpu/fi-cache}"
  TABLE=$(mktemp "/tmp/pkv-$1-table.XXXXXX")
}

# The driver's run "$@" with its output also in OUT/$1, then its exit status.
gpu_bench_main() {
  local logname=$1
  shift
  run "$@" 2>&1 | tee -a "$OUT/$logname"
  local rc=${PIPESTATUS[0]}
  rm -f "$TABLE"
  exit "$rc"
}

# The end of a run: the JIT cache saved, the outputs listed, and the short table last (the device tool returns
# the tail of the output).
gpu_bench_finish() {
  gpu_bench_save_cache
  ls -l "$OUT"
  say "done in $(elapsed) s"
  echo
  [ -s "$TABLE" ] && cat "$TABLE"
}

# The machine (GPUs, Python, cores), FlashInfer from the carried wheels (.whl; install_wheelhouse.sh prints
# export lines) and nvcc on the PATH.
gpu_bench_setup() {
  local exports
  nvidia-smi -L 2>/dev/null || say "nvidia-smi not available"
  say "$(python3 --version 2>&1), $(nproc) cores"
  if ! exports="$(bash bench/install_wheelhouse.sh "$REPO/.whl")"; then
    say "installing the FlashInfer wheels failed (carry .whl: run(..., carry=[\".whl\"]))"
    return 1
  fi
  eval "$exports"
  if ! command -v nvcc >/dev/null 2>&1; then
    for d in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-13.0; do
      if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then export PATH="$d/bin:$PATH"; break; fi
    done
  fi
  say "nvcc: $(command -v nvcc || echo missing) $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*')"
}

# Builds libpersistentkv and libpersistentkv_lab with CUDA for sm_90a (build-gpu) while the background job
# JIT_PID (FlashInfer's warm-up) runs, checks that the library sees a GPU (tag: the line's prefix), then
# waits for the warm-up.  PKV_ALLOW_NO_CUDA=1 goes on without a GPU (to test a driver with --dry-run).
gpu_bench_build() {
  local jit_pid=$1 tag=$2
  say "building libpersistentkv and libpersistentkv_lab (build-gpu, sm_90a)"
  if ! { cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a-real -DCMAKE_BUILD_TYPE=Release \
         && cmake --build build-gpu -j "$(nproc)" --target persistentkv persistentkv_lab; }; then
    say "library build failed"
    kill "$jit_pid" 2>/dev/null
    wait "$jit_pid" 2>/dev/null
    return 1
  fi
  export PKV_LIBRARY="$REPO/build-gpu/libpersistentkv.so"
  python3 -c "import sys; sys.path.insert(0, 'python'); import persistentkv as p; \
print('[$tag] persistentkv', p.__version__, p.library_path, 'cuda', p.cuda_available()); \
sys.exit(0 if p.cuda_available() else 1)" || [ "${PKV_ALLOW_NO_CUDA:-0}" = 1 ] \
    || { say "the library has no CUDA backend or sees no GPU"; return 1; }
  say "library built; waiting for the FlashInfer JIT warm-up"
  wait "$jit_pid" || say "JIT warm-up exited with $? (the benchmark compiles what is missing on first use)"
}

# Minutes left of LIMIT after keeping back $1 seconds for the outputs (at least one minute).
gpu_bench_minutes_left() {
  local left=$(( LIMIT - $(elapsed) - $1 ))
  [ "$left" -lt 60 ] && left=60
  python3 -c "print(round($left / 60.0, 2))"
}

# With PKV_SAVE_FI_CACHE=1, FlashInfer's compiled modules into OUT/fi-cache.tgz (when under the 16 MiB the
# device tool returns).
gpu_bench_save_cache() {
  if [ "${PKV_SAVE_FI_CACHE:-0}" = 1 ] && [ -d "$PKV_FLASHINFER_CACHE/.cache" ]; then
    tar czf "$OUT/fi-cache.tgz" -C "$PKV_FLASHINFER_CACHE" .cache
    local sz
    sz=$(stat -c %s "$OUT/fi-cache.tgz")
    if [ "$sz" -gt $((16 * 1024 * 1024)) ]; then
      say "fi-cache.tgz is $sz bytes, over the 16 MiB the device tool returns: removed"
      rm -f "$OUT/fi-cache.tgz"
    else
      say "saved the FlashInfer JIT cache ($sz bytes): carry it and set PKV_FLASHINFER_CACHE_TGZ"
    fi
  fi
}
