# SPDX-License-Identifier: Apache-2.0
# `kvxfer bench --lane both`, small: one case on the tcp lane, then on the
# UCX lane over UCX_TLS=tcp (a spawned target each), each checked against
# the initiator's lane counters, with the tcp/ucx ratio in the JSON.
#   cmake -DKVXFER=path/to/kvxfer -DWORK_DIR=dir -P bench_smoke_lanes.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(args bench --lane both --cases small --region 64M --total 16M --verify-blocks 512
  --no-perftest --no-raw-tcp --no-iperf3 --quiet --json "${WORK_DIR}/bench.json")
execute_process(COMMAND "${KVXFER}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "kvxfer ${args}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer bench exited with ${rc}")
endif()
if(NOT out MATCHES "tcp/ucx")
  message(FATAL_ERROR "the table lacks the tcp/ucx column")
endif()
set(JSON "${WORK_DIR}/bench.json")
set(CASES small small)
set(LANES tcp ucx)
include("${CMAKE_CURRENT_LIST_DIR}/check_bench_json.cmake")
string(JSON ratio GET "${doc}" cases 0 tcp_lane_vs_ucx_lane)
if(ratio STREQUAL "null" OR NOT ratio GREATER 0)
  message(FATAL_ERROR "no tcp lane / ucx lane ratio in ${JSON}")
endif()
message(STATUS "small: tcp lane / ucx lane = ${ratio}")
