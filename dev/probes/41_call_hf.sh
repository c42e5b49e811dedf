#!/usr/bin/env bash
# 41_call_hf.sh OUT - one device call for what changed on the decode loop's side (carry .whl-hf, not .whl): the CUDA
# build; probe 40 (test_decoder and test_model on the device, then pkv decode with whole steps in graphs against
# the pieces and no graphs); the Python binding's CUDA tests (run()'s and append_kv's memos over fresh views among
# them; pytest travels in .whl-hf); bench/check_transformers.py (transformers' LlamaForCausalLM trained on
# repeated segments, against pkv decode's tokens and logits); then, if the time allows, probe 37 (the fp8 chunk
# pairs A/B).  PKV_CALL_S: seconds the call may take (default 575).  OUT/summary.txt; the parts' files beside it.
set -u
T=${PKV_CALL_S:-575}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/41_call_hf.sh OUT}
mkdir -p "$out"
T0=$SECONDS
left() { echo $((T - (SECONDS - T0))); }
b=$root/build-gpu
{
  echo "# probe 41 at ${PKV_COMMIT:-unknown}: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
  cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBUILD_TESTING=ON \
    >"$out/build.log" 2>&1 && cmake --build "$b" -j "$(nproc)" --target persistentkv persistentkv_lab pkv test_decoder \
    test_model >>"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
  echo "built in $((SECONDS - T0)) s"
  timeout $(($(left) - 200)) bash "$root/dev/probes/40_step_graphs.sh" "$out/p40" "$b" >/dev/null 2>&1
  echo "probe 40: exit $? at $((SECONDS - T0)) s"
  cat "$out/p40/summary.txt"
  echo
  eval "$(PKV_SKIP_IMPORT_CHECK=1 bash "$root/bench/install_wheelhouse.sh" "$root/.whl-hf" /tmp/hf-site 2>"$out/install.log")"
  export PKV_LIBRARY=$b/libpersistentkv.so
  (cd "$root/python" && timeout 90 python3 -m pytest -q -x tests -k "cuda" >"$out/pytest_cuda.log" 2>&1)
  echo "pytest -k cuda: exit $?, $(tail -n 1 "$out/pytest_cuda.log")"
  grep -m 5 -E "^FAILED|Error" "$out/pytest_cuda.log"
  timeout $(($(left) - 10)) python3 "$root/bench/check_transformers.py" --pkv "$b/pkv" --train-steps 1000 \
    --json "$out/check_transformers.json" >"$out/check_transformers.md" 2>"$out/check_transformers.err"
  echo "check_transformers: exit $? at $((SECONDS - T0)) s"
  cat "$out/check_transformers.md"; tail -n 5 "$out/check_transformers.err"
  if [ "$(left)" -ge 300 ]; then
    timeout $(($(left) - 5)) bash "$root/dev/probes/37_fp8_chunk_pairs.sh" "$out/p37" >/dev/null 2>&1
    echo "probe 37: exit $?"; cat "$out/p37/summary.txt" 2>/dev/null
  else
    echo "probe 37 skipped: $(left) s left"
  fi
} 2>&1 | tee "$out/summary.txt"
