# decode_kv_compare.cmake - `pkv decode --kv-compare` on the tiny model, CPU backend: the report is produced, the
# fp8 KV run differs from the bf16 one (a logit difference above 0, below a bound), greedy agreement is high with
# a sensible scale, and a scale that sends every K and V value under fp8's smallest code is seen as much worse.
# cmake -DPKV=<pkv> -DOUT=<dir> -P decode_kv_compare.cmake
function(kv_compare name scale)
  set(json ${OUT}/kv_compare_${name}.json)
  execute_process(COMMAND ${PKV} decode --model tiny --backend cpu --kv-compare fp8_e4m3 --kv-scale ${scale}
                          --batch 4 --max-new 16 --json ${json}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkv decode --kv-compare (scale ${scale}) failed (${rc}): ${err}")
  endif()
  if(NOT out MATCHES "\\| all \\|" OR NOT out MATCHES "greedy agreement")
    message(FATAL_ERROR "no report in:\n${out}")
  endif()
  file(READ ${json} j)
  string(JSON steps LENGTH "${j}" per_step)
  string(JSON max_abs GET "${j}" overall max_abs_logit_diff)
  string(JSON rel_l2 GET "${j}" overall rel_l2)
  string(JSON agree GET "${j}" overall agreement)
  string(JSON kvt GET "${j}" kv_dtype)
  if(NOT steps EQUAL 16 OR NOT kvt STREQUAL "fp8_e4m3")
    message(FATAL_ERROR "${json}: ${steps} steps of ${kvt}, not 16 of fp8_e4m3")
  endif()
  message(STATUS "scale ${scale}: max abs logit diff ${max_abs}, rel L2 ${rel_l2}, agreement ${agree}")
  set(${name}_max_abs ${max_abs} PARENT_SCOPE)
  set(${name}_rel_l2 ${rel_l2} PARENT_SCOPE)
  set(${name}_agree ${agree} PARENT_SCOPE)
endfunction()

kv_compare(good 1)
if(NOT good_max_abs GREATER 0 OR NOT good_rel_l2 GREATER 0)
  message(FATAL_ERROR "the fp8 KV run's logits equal the bf16 run's: the fp8 cache is not in the loop")
endif()
if(NOT good_max_abs LESS 0.5 OR NOT good_rel_l2 LESS 0.1 OR good_agree LESS 0.9)
  message(FATAL_ERROR "fp8_e4m3 at scale 1: max abs ${good_max_abs} (bound 0.5), rel L2 ${good_rel_l2} (bound 0.1), "
                      "agreement ${good_agree} (at least 0.9)")
endif()
# real value = stored x 1e6: every value / 1e6 is below e4m3's smallest code, stored as zero
kv_compare(underflow 1e6)
if(NOT underflow_rel_l2 GREATER good_rel_l2)
  message(FATAL_ERROR "a scale of 1e6 (every K and V stored as 0) looks no worse than 1: rel L2 ${underflow_rel_l2} "
                      "against ${good_rel_l2}")
endif()
message(STATUS "decode_kv_compare: passed")
