# SPDX-License-Identifier: Apache-2.0
# `kvxfer bench --tls tcp --encrypt both`, small: one case on the tcp lane
# in the clear, then encrypted (KVXFER_TCP_ENCRYPT=on on both sides, a
# spawned target each), both verified, the encrypted row marked as such.
#   cmake -DKVXFER=path/to/kvxfer -DWORK_DIR=dir -P bench_smoke_encrypt.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(args bench --tls tcp --encrypt both --cases small --region 64M --total 16M
  --verify-blocks 512 --no-perftest --no-raw-tcp --no-iperf3 --quiet
  --json "${WORK_DIR}/bench.json")
execute_process(COMMAND "${KVXFER}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "kvxfer ${args}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer bench exited with ${rc}")
endif()
if(NOT out MATCHES "tcp\\+tls" OR NOT out MATCHES "x the [0-9.]+ GB/s of cleartext")
  message(FATAL_ERROR "the table lacks the encrypted row or its ratio to cleartext")
endif()
set(JSON "${WORK_DIR}/bench.json")
set(CASES small small)
set(LANES tcp tcp)
include("${CMAKE_CURRENT_LIST_DIR}/check_bench_json.cmake")
string(JSON first GET "${doc}" cases 0 encrypted)
string(JSON second GET "${doc}" cases 1 encrypted)
if(first OR NOT second)
  message(FATAL_ERROR "cases 0 and 1 should be cleartext then encrypted: ${first}, ${second}")
endif()
