# SPDX-License-Identifier: Apache-2.0
# `kvxfer bench --targets 1,2 --initiators 1,2`, small, over TLS (sm or tcp):
# every fan-out and incast run verified, the JSON has every run's figures.
#   cmake -DKVXFER=path/to/kvxfer -DTLS=sm -DWORK_DIR=dir -P fan_smoke.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(json "${WORK_DIR}/fan.json")
set(args bench --tls ${TLS} --targets 1,2 --initiators 1,2 --region 32M --total 64M --batch 16 --depth 2 --quiet
  --iperf3-seconds 1 --json "${json}")
execute_process(COMMAND "${KVXFER}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "kvxfer ${args}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer bench exited with ${rc}")
endif()
file(READ "${json}" doc)
string(JSON count LENGTH "${doc}" runs)
if(NOT count EQUAL 4)
  message(FATAL_ERROR "fan_smoke: ${count} runs in the JSON, expected 4")
endif()
find_program(IPERF3_PROGRAM iperf3)
set(expected fan-out:1 fan-out:2 incast:1 incast:2)
foreach(i RANGE 3)
  string(JSON kind GET "${doc}" runs ${i} experiment)
  string(JSON n GET "${doc}" runs ${i} n)
  string(JSON verified GET "${doc}" runs ${i} verified)
  string(JSON blocks GET "${doc}" runs ${i} verified_blocks)
  string(JSON gbps GET "${doc}" runs ${i} gbps)
  string(JSON each LENGTH "${doc}" runs ${i} each_gbps)
  string(JSON p99 GET "${doc}" runs ${i} write_call p99_us)
  list(GET expected ${i} want)
  if(NOT "${kind}:${n}" STREQUAL "${want}")
    message(FATAL_ERROR "fan_smoke: run ${i} is ${kind} N=${n}, expected ${want}")
  endif()
  if(NOT verified OR blocks LESS 1 OR NOT gbps GREATER 0 OR NOT each EQUAL n OR p99 STREQUAL "")
    message(FATAL_ERROR "fan_smoke: ${kind} N=${n}: verified=${verified} blocks=${blocks} gbps=${gbps} each=${each}")
  endif()
  # Over TCP each run has N raw streams beside it (iperf3, when installed).
  string(JSON raw GET "${doc}" runs ${i} raw_gbps)
  if(TLS STREQUAL "tcp" AND IPERF3_PROGRAM AND (raw STREQUAL "null" OR NOT raw GREATER 0))
    message(FATAL_ERROR "fan_smoke: ${kind} N=${n} has no raw-stream figure")
  endif()
endforeach()
if(NOT "${doc}" MATCHES "\"target_engine_config\": {}")
  message(FATAL_ERROR "fan_smoke: no empty target_engine_config in the JSON")
endif()

# --target-engine reaches the spawned target's Transport: a value it must
# refuse fails the run, naming it; one it takes is in the JSON.
set(bad_args bench --tls ${TLS} --no-iperf3 --initiators 1 --region 32M --total 16M --batch 16 --depth 2 --quiet
  --target-engine KVXFER_RMA=99)
execute_process(COMMAND "${KVXFER}" ${bad_args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "refused.*KVXFER_RMA=99")
  message(FATAL_ERROR "fan_smoke: --target-engine KVXFER_RMA=99 gave rc=${rc}:\n${out}${err}")
endif()
set(rma_args bench --tls ${TLS} --no-iperf3 --initiators 1 --region 32M --total 16M --batch 16 --depth 2 --quiet
  --target-engine KVXFER_RMA=off --engine KVXFER_RMA=auto --json "${json}")
execute_process(COMMAND "${KVXFER}" ${rma_args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fan_smoke: ${rma_args} exited with ${rc}:\n${out}${err}")
endif()
file(READ "${json}" doc)
string(JSON target_rma GET "${doc}" target_engine_config KVXFER_RMA)
string(JSON initiator_rma GET "${doc}" engine_config KVXFER_RMA)
if(NOT target_rma STREQUAL "off" OR NOT initiator_rma STREQUAL "auto")
  message(FATAL_ERROR "fan_smoke: JSON engine configs ${initiator_rma} / ${target_rma}")
endif()

# --engine, --num-threads and --no-progress-thread reach every incast
# initiator's Transport: a value it must refuse fails the run, named by the
# initiator; the others run and verify.
set(bad_args bench --tls ${TLS} --no-iperf3 --initiators 1 --region 32M --total 16M --batch 16 --depth 2 --quiet
  --engine KVXFER_RMA=99)
execute_process(COMMAND "${KVXFER}" ${bad_args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "kvxfer initiator: [^\n]*KVXFER_RMA=99")
  message(FATAL_ERROR "fan_smoke: --engine KVXFER_RMA=99 with --initiators gave rc=${rc}:\n${out}${err}")
endif()
set(knob_args bench --tls ${TLS} --no-iperf3 --initiators 1,2 --region 32M --total 16M --batch 16 --depth 2 --quiet
  --engine KVXFER_RMA=auto --num-threads 1 --no-progress-thread --json "${json}")
execute_process(COMMAND "${KVXFER}" ${knob_args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fan_smoke: ${knob_args} exited with ${rc}:\n${out}${err}")
endif()
