# SPDX-License-Identifier: Apache-2.0
# `kvxfer bench --pool shared`, small, writes and reads over shared memory:
# every case verified, the JSON saying the pools were shared, and each case's
# initiator having mapped the target's pool (its cma_mapped_peers counter in
# the --metrics text), so that the memcpy path is what was measured. Each
# case, write or read, timed its first pass (first_pass_gbps, verified), so
# no target's pool took the untimed process_vm_writev pass; each write case
# then wrote every block once through its new mapping (mapping_warm_gbps)
# before timing, and a read case did not.
#   cmake -DKVXFER=path/to/kvxfer -DWORK_DIR=dir -P bench_shared_smoke.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
foreach(op write read)
  set(args bench --pool shared --op ${op} --cases big,layer,small,runs --region 64M
    --total 16M --verify-blocks 512 --no-perftest --quiet --json "${WORK_DIR}/${op}.json"
    --metrics "${WORK_DIR}/${op}.prom")
  execute_process(COMMAND "${KVXFER}" ${args}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
  message(STATUS "kvxfer ${args}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvxfer bench --op ${op} exited with ${rc}")
  endif()
  set(JSON "${WORK_DIR}/${op}.json")
  set(CASES big layer small runs)
  include("${CMAKE_CURRENT_LIST_DIR}/check_bench_json.cmake")
  file(READ "${JSON}" doc)
  string(JSON pool GET "${doc}" config pool)
  if(NOT pool STREQUAL "shared")
    message(FATAL_ERROR "${op}.json: config.pool is '${pool}', not 'shared'")
  endif()
  string(JSON via GET "${doc}" pool_warm_pass via)
  string(JSON warmed GET "${doc}" pool_warm_pass targets)
  if(NOT warmed EQUAL 0)
    message(FATAL_ERROR "${op}.json: pool_warm_pass ran ('${via}') for ${warmed} targets")
  endif()
  string(JSON ncases LENGTH "${doc}" cases)
  math(EXPR last "${ncases} - 1")
  foreach(i RANGE ${last})
    string(JSON name GET "${doc}" cases ${i} case)
    string(JSON warm_type TYPE "${doc}" cases ${i} mapping_warm_gbps)
    if(op STREQUAL "write" AND NOT warm_type STREQUAL "NUMBER")
      message(FATAL_ERROR "write case ${name}: no mapping warm pass (${warm_type})")
    elseif(op STREQUAL "read" AND NOT warm_type STREQUAL "NULL")
      message(FATAL_ERROR "read case ${name}: a mapping warm pass ran (${warm_type})")
    endif()
    string(JSON first_type TYPE "${doc}" cases ${i} first_pass_gbps)
    if(NOT first_type STREQUAL "NUMBER")
      message(FATAL_ERROR "${op} case ${name}: no verified first pass (${first_type})")
    endif()
  endforeach()
  file(READ "${WORK_DIR}/${op}.prom" prom)
  foreach(case big layer small runs)
    string(REGEX MATCH
      "kvxfer_engine_cma_mapped_peers_total{agent=\"bench-initiator-[0-9]+-${case}\"} ([0-9]+)"
      line "${prom}")
    if(NOT line OR NOT CMAKE_MATCH_1 EQUAL 1)
      message(FATAL_ERROR "${op}: case ${case} did not map the target's pool: '${line}'")
    endif()
  endforeach()
endforeach()
