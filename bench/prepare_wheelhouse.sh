#!/usr/bin/env bash
# Download the wheels needed to run FlashInfer (JIT mode) on the offline GPU
# machine into an ignored folder of this repo (default: <repo>/.whl).
#
# Usage: bench/prepare_wheelhouse.sh [DEST_DIR]
#        WHEELS=hf bench/prepare_wheelhouse.sh .whl-hf   (transformers' set, for bench/check_transformers.py)
# Env overrides: FLASHINFER_VERSION, TVM_FFI_VERSION, PY_VERSION, PYTHON, WHEELS (flashinfer | hf)
#
# Only what the GPU machine lacks is fetched (see bench/FLASHINFER.md):
#   flashinfer-python  pure-Python wheel; kernels are JIT-compiled with the
#                      machine's nvcc, CUDA/CUTLASS/CCCL headers ship inside it
#   apache-tvm-ffi     binary wheel (cp312); FlashInfer's JIT modules are
#                      built against and loaded through it
# Everything else FlashInfer imports on the decode path (torch, numpy, ninja,
# packaging, requests, tqdm, click, tabulate, einops, filelock, jinja2,
# nvidia-ml-py, cuda-bindings, typing-extensions) is already on that machine.
# Optional extras (nvidia-cutlass-dsl, nvidia-cudnn-frontend, cuda-tile,
# nccl4py, nccl-extensions, flashinfer-cubin, flashinfer-jit-cache) are left
# out on purpose: they are only imported lazily by other kernels/backends.
# Both sets carry pytest (and pluggy, iniconfig: 0.5 MiB) for the Python
# binding's CUDA tests; the machine's own pytest plugins need a newer pytest,
# so run it there with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1.
set -euo pipefail

# 0.7.0.post1 is the newest flashinfer-python whose wheel fits the 64 MiB
# working-tree limit (0.7.1+ wheels are 59-97 MiB). 0.6.18.post1 (17.5 MiB)
# matches the reference measurement (0.6.18) and works with the same tvm-ffi.
FLASHINFER_VERSION="${FLASHINFER_VERSION:-0.7.0.post1}"
TVM_FFI_VERSION="${TVM_FFI_VERSION:-0.1.15.post2}"   # flashinfer needs >=0.1.11,<0.2
PY_VERSION="${PY_VERSION:-3.12}"
PYTHON="${PYTHON:-python3}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$REPO_ROOT/.whl}"
mkdir -p "$DEST"

TEST_PKGS=("pytest==8.3.3" "pluggy==1.5.0" "iniconfig==2.0.0")
case "${WHEELS:-flashinfer}" in
  flashinfer) PKGS=("flashinfer-python==$FLASHINFER_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION" "${TEST_PKGS[@]}") ;;
  hf) PKGS=("transformers==4.57.1" "tokenizers==0.22.1" "huggingface_hub==0.36.0" "safetensors==0.6.2"
            "regex==2025.9.18" "PyYAML==6.0.2" "${TEST_PKGS[@]}") ;;
  *) echo "WHEELS must be flashinfer or hf, not '$WHEELS'" >&2; exit 2 ;;
esac

PLATFORMS=(
  manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
  manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64
)
PLAT_ARGS=()
for p in "${PLATFORMS[@]}"; do PLAT_ARGS+=(--platform "$p"); done

# Two versions of one package in the folder would break the offline install:
# drop wheels of these projects whose version is not the pinned one.
for whl in "$DEST"/*.whl; do
  [ -e "$whl" ] || continue
  base="$(basename "$whl")"
  case "$base" in
    flashinfer_python-"$FLASHINFER_VERSION"-*|apache_tvm_ffi-"$TVM_FFI_VERSION"-*) ;;
    flashinfer_python-*|apache_tvm_ffi-*)
      echo "removing stale $base"; rm -f "$whl" ;;
  esac
done

for spec in "${PKGS[@]}"; do
  echo "fetching $spec"
  "$PYTHON" -m pip download -q --disable-pip-version-check \
    --no-deps --only-binary=:all: \
    --python-version "$PY_VERSION" --implementation cp \
    "${PLAT_ARGS[@]}" -d "$DEST" "$spec"
done

echo
echo "wheels in $DEST:"
total=0
for whl in "$DEST"/*.whl; do
  sz=$(stat -c %s "$whl")
  total=$((total + sz))
  awk -v s="$sz" -v n="$(basename "$whl")" 'BEGIN { printf "  %8.1f MiB  %s\n", s / 1048576, n }'
done
awk -v s="$total" 'BEGIN { printf "total: %.1f MiB (%d bytes)\n", s / 1048576, s }'
if [ "$total" -gt $((40 * 1024 * 1024)) ]; then
  echo "warning: over 40 MiB; the tree sent to the GPU machine is limited to 64 MiB" >&2
fi
