#!/usr/bin/env bash
# 43_call_e2e.sh OUT - one device call for the e2e twin and the binding on CUDA (carry .whl, which holds pytest too:
# bench/prepare_wheelhouse.sh): bench/run_e2e.sh (FlashInfer's install and JIT beside the library's build, then the
# loops of the families given in PKV_FAMILIES, default long,uniform,bimodal,zipf, in what is left of PKV_CALL_S
# less 60 s), then the Python binding's CUDA tests (run()'s and append_kv's memos among them) and test_decoder on
# the device.  The question: with the memos keyed without addresses, do the host-bound B 1 / B 8 cells close?
# PKV_CALL_S: seconds the call may take (default 575).  OUT/summary.txt; OUT/e2e/ the run's files.
set -u
T=${PKV_CALL_S:-575}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/43_call_e2e.sh OUT}
mkdir -p "$out"
T0=$SECONDS
{
  echo "# probe 43 at ${PKV_COMMIT:-unknown}: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PKV_TIME_LIMIT_S=$((T - 60)) bash "$root/bench/run_e2e.sh" "$out/e2e" \
    --families "${PKV_FAMILIES:-long,uniform,bimodal,zipf}" --tol 0.15 >"$out/e2e_stdout.txt" 2>&1
  echo "run_e2e: exit $? at $((SECONDS - T0)) s"
  tail -n 24 "$out/e2e_stdout.txt"
  eval "$(PKV_SKIP_IMPORT_CHECK=1 bash "$root/bench/install_wheelhouse.sh" "$root/.whl" /tmp/pkv-site 2>/dev/null)"
  export PKV_LIBRARY=$root/build-gpu/libpersistentkv.so
  (cd "$root/python" && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 40 python3 -m pytest -q -k cuda tests \
    >"$out/pytest_cuda.log" 2>&1)
  echo "pytest -k cuda: exit $?, $(tail -n 1 "$out/pytest_cuda.log")"
  grep -m 8 -E "^FAILED|^ERROR" "$out/pytest_cuda.log"
  if [ $((T - (SECONDS - T0))) -gt 15 ]; then
    cmake --build "$root/build-gpu" -j "$(nproc)" --target test_decoder >/dev/null 2>&1 &&
      timeout $((T - (SECONDS - T0) - 5)) "$root/build-gpu/tests/test_decoder" >"$out/test_decoder.log" 2>&1
    echo "test_decoder: exit $?, $(tail -n 1 "$out/test_decoder.log" 2>/dev/null)"
  fi
} 2>&1 | tee "$out/summary.txt"
