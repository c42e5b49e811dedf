#!/usr/bin/env bash
# 42_call_hf.sh OUT - one device call for the decode loop's side (carry .whl-hf, not .whl): the CUDA build;
# test_decoder and test_model on the device (steps in CUDA graphs against op by op, add_rmsnorm); the Python
# binding's CUDA tests (run()'s and append_kv's memos over fresh views and new addresses among them; pytest travels
# in .whl-hf, the machine's own pytest plugins are not loaded); bench/check_transformers.py (transformers'
# LlamaForCausalLM trained on repeated segments of distinct tokens, against pkv decode's tokens and logits).
# PKV_CALL_S: seconds the call may take (default 575); PKV_TESTS: the C tests to run (default test_decoder test_model).  OUT/summary.txt; the parts' logs beside it.
set -u
T=${PKV_CALL_S:-575}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: dev/probes/42_call_hf.sh OUT}
mkdir -p "$out"
T0=$SECONDS
left() { echo $((T - (SECONDS - T0))); }
b=$root/build-gpu
{
  echo "# probe 42 at ${PKV_COMMIT:-unknown}: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
  cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real -DBUILD_TESTING=ON \
    >"$out/build.log" 2>&1 && cmake --build "$b" -j "$(nproc)" --target persistentkv persistentkv_lab pkv test_decoder \
    test_model >>"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
  echo "built in $((SECONDS - T0)) s"
  for t in ${PKV_TESTS-test_decoder test_model}; do
    timeout 120 "$b/tests/$t" >"$out/$t.log" 2>&1
    echo "$t: exit $?, $(tail -n 1 "$out/$t.log")"
  done
  grep -h "graphs against\|CHECK failed" "$out"/test_decoder.log "$out"/test_model.log | head -n 8
  eval "$(PKV_SKIP_IMPORT_CHECK=1 bash "$root/bench/install_wheelhouse.sh" "$root/.whl-hf" /tmp/hf-site 2>"$out/install.log")"
  export PKV_LIBRARY=$b/libpersistentkv.so
  (cd "$root/python" && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 120 python3 -m pytest -q -k "cuda" tests \
    >"$out/pytest_cuda.log" 2>&1)
  echo "pytest -k cuda: exit $?, $(tail -n 1 "$out/pytest_cuda.log")"
  grep -m 8 -E "^FAILED|^ERROR|Error:" "$out/pytest_cuda.log"
  echo "check_transformers from $((SECONDS - T0)) s"
  timeout $(($(left) - 5)) python3 "$root/bench/check_transformers.py" --pkv "$b/pkv" \
    --train-seconds $(( $(left) - 95 > 150 ? 150 : $(left) - 95 )) \
    --json "$out/check_transformers.json" >"$out/check_transformers.md" 2>"$out/check_transformers.err"
  echo "check_transformers: exit $? at $((SECONDS - T0)) s"
  cat "$out/check_transformers.md"; grep -v Warning "$out/check_transformers.err" | tail -n 12
} 2>&1 | tee "$out/summary.txt"
