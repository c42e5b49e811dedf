#!/usr/bin/env bash
# Install the wheels fetched by bench/prepare_wheelhouse.sh on the offline GPU
# machine, into a private target dir (nothing in the system site is touched).
#
# Usage: bench/install_wheelhouse.sh [WHEEL_DIR] [TARGET_DIR]
#   WHEEL_DIR   default <repo>/.whl        (carry it: run(..., carry=[".whl"]))
#   TARGET_DIR  default /tmp/pkv-site
# Env:
#   PYTHON                   interpreter (default python3, the torch one there)
#   PKV_FLASHINFER_CACHE     if set, FlashInfer's JIT workspace goes there
#                            (exported as FLASHINFER_WORKSPACE_BASE; kernels land
#                            in $PKV_FLASHINFER_CACHE/.cache/flashinfer/<ver>/<arch>/)
#   PKV_FLASHINFER_CACHE_TGZ if set (and the file exists), a tarball of an
#                            earlier cache (tar czf X.tgz -C $PKV_FLASHINFER_CACHE .cache)
#                            is unpacked into PKV_FLASHINFER_CACHE first; keep
#                            PKV_FLASHINFER_CACHE the same absolute path (e.g.
#                            /tmp/pkv-fi) and TARGET_DIR unchanged so ninja
#                            finds nothing to rebuild
#   FLASHINFER_CUDA_ARCH_LIST  kept if set, else "9.0a" (H200 only)
#   PKV_SKIP_IMPORT_CHECK=1  skip the `import flashinfer` smoke test
#
# Progress goes to stderr; stdout carries only `export ...` lines, so either
#   eval "$(bash bench/install_wheelhouse.sh)"
# or copy the printed lines.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEEL_DIR="${1:-$REPO_ROOT/.whl}"
TARGET="${2:-/tmp/pkv-site}"
PYTHON="${PYTHON:-python3}"

log() { echo "[install_wheelhouse] $*" >&2; }

shopt -s nullglob
wheels=("$WHEEL_DIR"/*.whl)
if [ "${#wheels[@]}" -eq 0 ]; then
  log "no wheels in $WHEEL_DIR (run bench/prepare_wheelhouse.sh and carry .whl)"
  exit 1
fi
log "installing ${#wheels[@]} wheel(s) from $WHEEL_DIR into $TARGET"
mkdir -p "$TARGET"
"$PYTHON" -m pip install -q --disable-pip-version-check \
  --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$TARGET" "${wheels[@]}" >&2

# Give the installed files one fixed, old mtime. FlashInfer's JIT build is a
# ninja build whose inputs include the headers under flashinfer/data; with a
# fixed mtime a JIT cache carried over from an earlier machine (same paths,
# same version) is not rebuilt merely because the wheel was reinstalled.
find "$TARGET" -exec touch -h -d '2001-01-01 00:00:00 UTC' {} + 2>/dev/null || true

EXPORTS=("export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH}")
export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}"

arch="${FLASHINFER_CUDA_ARCH_LIST:-9.0a}"
EXPORTS+=("export FLASHINFER_CUDA_ARCH_LIST='$arch'")
export FLASHINFER_CUDA_ARCH_LIST="$arch"

if [ -n "${PKV_FLASHINFER_CACHE:-}" ]; then
  mkdir -p "$PKV_FLASHINFER_CACHE"
  cache="$(cd "$PKV_FLASHINFER_CACHE" && pwd)"
  if [ -n "${PKV_FLASHINFER_CACHE_TGZ:-}" ] && [ -f "$PKV_FLASHINFER_CACHE_TGZ" ]; then
    log "unpacking JIT cache $PKV_FLASHINFER_CACHE_TGZ into $cache"
    tar xzf "$PKV_FLASHINFER_CACHE_TGZ" -C "$cache"   # tar keeps the mtimes ninja needs
  fi
  EXPORTS+=("export FLASHINFER_WORKSPACE_BASE=$cache")
  export FLASHINFER_WORKSPACE_BASE="$cache"
fi

# FlashInfer's JIT calls `ninja` and `nvcc` by name / via CUDA_HOME.
bindir="$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")"
if ! command -v ninja >/dev/null 2>&1 && [ -x "$bindir/ninja" ]; then
  EXPORTS+=("export PATH=$bindir:\$PATH")
  export PATH="$bindir:$PATH"
fi
if [ -z "${CUDA_HOME:-}${CUDA_PATH:-}" ] && ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda /usr/local/cuda-13.0; do
    if [ -x "$d/bin/nvcc" ]; then
      EXPORTS+=("export CUDA_HOME=$d")
      export CUDA_HOME="$d"
      break
    fi
  done
fi
cuda_home="${CUDA_HOME:-${CUDA_PATH:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}}"
log "CUDA home for the JIT: $cuda_home ($("$cuda_home/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'nvcc NOT found'))"
[ -e "$cuda_home/lib64/libcudart.so" ] || log "warning: $cuda_home/lib64/libcudart.so missing; the JIT links with -L\$cuda_home/lib64 -lcudart"

if [ "${PKV_SKIP_IMPORT_CHECK:-0}" != 1 ]; then
  "$PYTHON" - >&2 <<'EOF'
import flashinfer, tvm_ffi
from flashinfer.jit import env
print("[install_wheelhouse] flashinfer", flashinfer.__version__, "tvm_ffi", tvm_ffi.__version__,
      "from", flashinfer.__file__)
print("[install_wheelhouse] JIT kernels ->", env.FLASHINFER_JIT_DIR)
EOF
fi

log "use:"
for line in "${EXPORTS[@]}"; do echo "$line"; done
