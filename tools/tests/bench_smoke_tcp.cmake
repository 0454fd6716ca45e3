# SPDX-License-Identifier: Apache-2.0
# `kvxfer bench --tls tcp`, small: two cases against a spawned target over
# TCP (on the tcp lane, checked), with the raw TCP stream (alone and beside
# a spinning thread), iperf3 (when installed: scripts/install-deps.sh
# installs it) and all-cores memcpy baselines in the JSON.
#   cmake -DKVXFER=path/to/kvxfer -DWORK_DIR=dir -P bench_smoke_tcp.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(args bench --tls tcp --cases layer,small --region 64M --total 16M --verify-blocks 512
  --no-perftest --raw-tcp-bytes 64M --iperf3-seconds 1 --quiet --json "${WORK_DIR}/bench.json")
execute_process(COMMAND "${KVXFER}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "kvxfer ${args}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer bench exited with ${rc}")
endif()
if(NOT out MATCHES "raw TCP stream \\(one connection")
  message(FATAL_ERROR "the table lacks the raw TCP stream line")
endif()
if(NOT out MATCHES "raw TCP stream beside one spinning thread")
  message(FATAL_ERROR "the table lacks the raw TCP stream line beside a spinning thread")
endif()
set(JSON "${WORK_DIR}/bench.json")
set(CASES layer small)
set(LANES tcp tcp)
set(RAW_TCP ON)
find_program(IPERF3_PROGRAM iperf3)
if(IPERF3_PROGRAM)
  set(IPERF3 ON)
  if(NOT out MATCHES "iperf3 \\(one connection, 1 MiB writes, loopback")
    message(FATAL_ERROR "the table lacks the iperf3 line")
  endif()
  if(NOT out MATCHES "iperf3 beside one spinning thread")
    message(FATAL_ERROR "the table lacks the iperf3 line beside a spinning thread")
  endif()
endif()
include("${CMAKE_CURRENT_LIST_DIR}/check_bench_json.cmake")
