# SPDX-License-Identifier: Apache-2.0
# `kvxfer bench --op notify`, small: 300 notifications per mode against a
# spawned target; every one delivered, in order, after its block, and the
# latency figures in the JSON.
#   cmake -DKVXFER=path/to/kvxfer -DTLS=sm|tcp -DWORK_DIR=dir -P notify_smoke.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(args bench --op notify --tls ${TLS} --notifications 300 --block-len 16K --poll-wait yield
  --quiet --json "${WORK_DIR}/notify.json")
execute_process(COMMAND "${KVXFER}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "kvxfer ${args}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer bench --op notify exited with ${rc}")
endif()
file(READ "${WORK_DIR}/notify.json" json)
string(JSON count GET "${json}" count)
string(JSON modes LENGTH "${json}" modes)
if(NOT count EQUAL 300 OR NOT modes EQUAL 2)
  message(FATAL_ERROR "expected 2 modes of 300, got ${modes} of ${count}")
endif()
foreach(i 0 1)
  string(JSON mode GET "${json}" modes ${i} mode)
  foreach(key delivered bad out_of_order failed)
    string(JSON ${key} GET "${json}" modes ${i} ${key})
  endforeach()
  string(JSON p50 GET "${json}" modes ${i} latency_us p50)
  string(JSON p99 GET "${json}" modes ${i} latency_us p99)
  if(NOT delivered EQUAL 300 OR NOT bad EQUAL 0 OR NOT out_of_order EQUAL 0 OR NOT failed EQUAL 0)
    message(FATAL_ERROR "${mode}: delivered ${delivered}, bad ${bad}, out of order ${out_of_order}, failed ${failed}")
  endif()
  if(NOT p50 GREATER 0 OR p99 LESS p50)
    message(FATAL_ERROR "${mode}: implausible latency p50 ${p50} p99 ${p99}")
  endif()
endforeach()
