#!/usr/bin/env bash
# test_pip_install.sh REPO_ROOT PYTHON - the Python package as a user gets it: a fresh virtual environment,
# `pip install REPO_ROOT/python` (scikit-build-core builds the library with CMake, here the CPU backend only
# to keep it fast), then from outside the checkout: import persistentkv, check that it loaded the library
# inside the installed package and that its version is the package's, and run a small decode on the CPU
# backend against the float64 reference.  Then `pip wheel`: the wheel must carry both libraries, and work
# when installed on its own.  Skips (77) only when pip cannot get the build backend (no package index).
set -euo pipefail
root=$(cd "${1:?usage: test_pip_install.sh REPO_ROOT PYTHON}" && pwd)
py=${2:?usage: test_pip_install.sh REPO_ROOT PYTHON}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset PKV_LIBRARY PKV_LAB_LIBRARY PYTHONPATH PYTHONHOME VIRTUAL_ENV
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1
cd "$tmp"  # everything below runs outside the checkout
# CPU only; one build folder for both pip calls, so the wheel's build is the install's, reused
cpu_only=(--config-settings=cmake.define.PKV_ENABLE_CUDA=OFF --config-settings=build-dir="$tmp/build")

echo "== a fresh virtual environment ($("$py" --version 2>&1))"
"$py" -m venv "$tmp/venv"
vpy=$tmp/venv/bin/python
"$vpy" -m pip --version >/dev/null || { echo "the fresh venv has no pip (python3 -m venv without ensurepip?)"; exit 1; }

# The build backend pyproject.toml asks for: only if pip cannot get it is the test skipped.
backend=$(sed -n 's/^requires = \["\([^"]*\)".*/\1/p' "$root/python/pyproject.toml")
if ! "$vpy" -m pip download -q --no-deps --retries 2 --timeout 15 -d "$tmp/probe" "$backend" >"$tmp/probe.log" 2>&1; then
  echo "SKIP: pip cannot get $backend (no network or package index): $(tail -n 1 "$tmp/probe.log")"
  exit 77
fi

echo "== pip install $root/python[numpy] (CPU backend only)"
t0=$(date +%s)
"$vpy" -m pip install -q "$root/python[numpy]" "${cpu_only[@]}" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; exit 1; }
echo "installed in $(( $(date +%s) - t0 )) s"

cat >"$tmp/check.py" <<'PY'
import importlib.metadata
import os
import sys

import numpy as np

import persistentkv as pkv

root = sys.argv[1]
pkg = os.path.dirname(os.path.abspath(pkv.__file__))
print(f"persistentkv {pkv.__version__} from {pkg}\nlibrary {pkv.library_path}")
assert not pkg.startswith(root + os.sep), f"imported from the checkout ({pkg}), not the installed package"
assert os.path.dirname(os.path.abspath(pkv.library_path)) == os.path.join(pkg, "lib"), \
    "the library loaded is not the one inside the package"
assert importlib.metadata.version("persistentkv") == pkv.__version__, \
    f"package metadata {importlib.metadata.version('persistentkv')} != persistentkv.__version__ {pkv.__version__}"
assert not pkv.cuda_available(), "built with PKV_ENABLE_CUDA=OFF, yet the CUDA backend is there"
assert "zipf" in pkv.TRACE_FAMILIES  # the lab library (traces, reference) was found beside the library

# a small ragged step: B 3, Hq 8, Hkv 2 (GQA), d 64, fp16, 16-token pages scattered over the pool
rng = np.random.default_rng(20260623)
B, hq, hkv, d, ps = 3, 8, 2, 64, 16
lens = np.array([1, 37, 300], np.int32)                                  # seq_lens [B]
indptr = np.concatenate([[0], np.cumsum((lens + ps - 1) // ps)]).astype(np.int32)  # indptr [B+1]
pool = int(indptr[-1]) + 5
indices = rng.permutation(pool)[: indptr[-1]].astype(np.int32)          # indices [nnz]
k = rng.standard_normal((pool, ps, hkv, d)).astype(np.float16)          # k_cache [P, ps, Hkv, d]
v = rng.standard_normal((pool, ps, hkv, d)).astype(np.float16)
q = rng.standard_normal((B, hq, d)).astype(np.float16)                  # q [B, Hq, d]
w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu")
w.plan(indptr, indices, lens, hq, hkv, d, ps, num_pages=pool, q_data_type="float16")
o, lse = w.run(q, k, v, return_lse=True)
ro, rl = pkv.reference(q, k, v, indptr, indices, lens)
rel = np.linalg.norm(o.astype(np.float64) - ro) / np.linalg.norm(ro)
lse_err = float(np.max(np.abs(np.asarray(lse, np.float64) - rl)))
print(f"decode on the CPU backend: rel L2 error {rel:.2e}, max lse error {lse_err:.2e} against the float64 reference")
assert rel < 2e-3 and lse_err < 2e-3
PY
echo "== import persistentkv outside the checkout; a decode against the reference"
"$vpy" "$tmp/check.py" "$root"

echo "== pip wheel $root/python"
"$vpy" -m pip wheel -q --no-deps -w "$tmp/wheels" "$root/python" "${cpu_only[@]}" >"$tmp/wheel.log" 2>&1 ||
  { cat "$tmp/wheel.log"; exit 1; }
whl=$(ls "$tmp"/wheels/persistentkv-*.whl)
echo "built $(basename "$whl")"
version=$("$vpy" -c "import persistentkv; print(persistentkv.__version__)")
case "$(basename "$whl")" in persistentkv-"$version"-py3-none-*.whl) ;;
  *) echo "the wheel's name should say version $version and tag py3-none-<platform>"; exit 1 ;; esac
"$vpy" -m zipfile -l "$whl" >"$tmp/wheel.txt"
for f in persistentkv/__init__.py persistentkv/lib/libpersistentkv.so persistentkv/lib/libpersistentkv_lab.so; do
  grep -q "^$f " "$tmp/wheel.txt" || { echo "the wheel lacks $f:"; cat "$tmp/wheel.txt"; exit 1; }
done
echo "the wheel carries persistentkv/lib/libpersistentkv.so and libpersistentkv_lab.so"
# the wheel alone, unpacked as an installer would, ahead of the installed package on the path
"$vpy" -m pip install -q --no-deps --target "$tmp/from_wheel" "$whl" >"$tmp/target.log" 2>&1 ||
  { cat "$tmp/target.log"; exit 1; }
got=$(PYTHONPATH="$tmp/from_wheel" "$vpy" "$tmp/check.py" "$root")
case "$got" in *"library $tmp/from_wheel/persistentkv/lib/libpersistentkv.so"*) ;;
  *) echo "$got"; echo "the package installed from the wheel did not load its own library"; exit 1 ;; esac
echo "the wheel, installed on its own, imports and decodes"
echo "test_pip_install: passed"
