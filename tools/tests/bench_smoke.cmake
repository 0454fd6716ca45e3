# SPDX-License-Identifier: Apache-2.0
# `kvxfer bench` end to end, small: every case against a spawned target over
# shared memory, with the JSON record (and the plot when gnuplot is there)
# checked for a verified result per case, and the initiators' metrics
# (--metrics) checked for every case's transfers. With --telemetry the
# bench itself fails a case whose metrics or telemetry records disagree
# with what poll() reported.
#   cmake -DKVXFER=path/to/kvxfer -DWORK_DIR=dir -P bench_smoke.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(args bench --region 64M --total 16M --reg-reps 5 --verify-blocks 512
  --perftest-timeout 20 --quiet --json "${WORK_DIR}/bench.json"
  --metrics "${WORK_DIR}/metrics.prom" --telemetry)
find_program(GNUPLOT gnuplot)
if(GNUPLOT)
  list(APPEND args --plot "${WORK_DIR}/bench.png")
endif()
execute_process(COMMAND "${KVXFER}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "kvxfer ${args}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer bench exited with ${rc}")
endif()
set(JSON "${WORK_DIR}/bench.json")
set(CASES big layer small runs reg)
include("${CMAKE_CURRENT_LIST_DIR}/check_bench_json.cmake")
if(GNUPLOT AND NOT EXISTS "${WORK_DIR}/bench.png")
  message(FATAL_ERROR "no plot written")
endif()

# Each write case timed a verified first pass before its steady state; only
# the first case met the target's pool fresh. The table names the lane.
file(READ "${JSON}" doc)
foreach(i 0 1 2 3)
  string(JSON name GET "${doc}" cases ${i} case)
  string(JSON first GET "${doc}" cases ${i} first_pass_gbps)
  string(JSON fresh GET "${doc}" cases ${i} first_pass_fresh_pool)
  if(NOT first GREATER 0)
    message(FATAL_ERROR "case ${name}: no verified first pass (${first})")
  endif()
  if((i EQUAL 0 AND NOT fresh) OR (i GREATER 0 AND fresh))
    message(FATAL_ERROR "case ${name}: first_pass_fresh_pool is ${fresh}")
  endif()
endforeach()
if(NOT out MATCHES "lanes: the bytes went over cma")
  message(FATAL_ERROR "no 'lanes: the bytes went over cma' line")
endif()

# --metrics: one `agent` per case, each with its writes counted done and
# none failed.
file(READ "${WORK_DIR}/metrics.prom" prom)
foreach(case big layer small runs)
  string(REGEX MATCH
    "kvxfer_transfers_done_total{agent=\"bench-initiator-[0-9]+-${case}\",op=\"write\"} ([0-9]+)"
    done_line "${prom}")
  if(NOT done_line OR CMAKE_MATCH_1 EQUAL 0)
    message(FATAL_ERROR "metrics.prom: no writes done for case ${case}")
  endif()
  string(REGEX MATCH
    "kvxfer_transfers_failed_total{agent=\"bench-initiator-[0-9]+-${case}\",op=\"write\"} ([0-9]+)"
    failed_line "${prom}")
  if(NOT failed_line OR NOT CMAKE_MATCH_1 EQUAL 0)
    message(FATAL_ERROR "metrics.prom: failed writes for case ${case}: ${failed_line}")
  endif()
endforeach()
foreach(line "# TYPE kvxfer_transfer_latency_seconds histogram"
    "# TYPE kvxfer_inflight_transfers gauge")
  string(FIND "${prom}" "${line}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "metrics.prom: no \"${line}\"")
  endif()
endforeach()

# --telemetry: every throughput case checked its records.
file(READ "${WORK_DIR}/bench.json" bench_json)
string(JSON ncases LENGTH "${bench_json}" cases)
math(EXPR last "${ncases} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${bench_json}" cases ${i} case)
  string(JSON records GET "${bench_json}" cases ${i} telemetry_records)
  if(NOT name STREQUAL "reg" AND records EQUAL 0)
    message(FATAL_ERROR "case ${name}: no telemetry records checked")
  endif()
endforeach()
