# dev/build.sh - sourced by the dev probes: the GPU build they all start with.
# dev_build DIR LOG TARGETS [CMAKE OPTIONS...]: a Release build for sm_90a of TARGETS ("" for all) in DIR,
# with the extra cmake options (e.g. -DBUILD_TESTING=OFF -DPKV_TIMELINE=ON); its output goes to LOG.
dev_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dev_build() {
  local dir=$1 log=$2 targets=$3
  shift 3
  { cmake -S "$dev_root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real "$@" &&
    cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 8)" ${targets:+--target $targets}; } >"$log" 2>&1
}
