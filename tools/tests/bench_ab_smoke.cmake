# SPDX-License-Identifier: Apache-2.0
# scripts/bench-ab with the same kvxfer on both sides, one small round: both
# runs verify, and the medians have a B/A ratio for the case. A path that is
# not an executable is refused by name.
#   cmake -DKVXFER=path/to/kvxfer -DSCRIPT=scripts/bench-ab -DWORK_DIR=dir -P bench_ab_smoke.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(json "${WORK_DIR}/ab.json")
set(args -n 1 --json "${json}" "${KVXFER}" "${KVXFER}" --
  --tls sm --cases small --region 64M --total 16M --verify-blocks 256 --no-perftest)
execute_process(COMMAND /usr/bin/python3 "${SCRIPT}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "bench-ab ${args}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench-ab exited with ${rc}")
endif()
if(NOT out MATCHES "\nsmall +[0-9.]+ +[0-9.]+ +[0-9.]+ ")
  message(FATAL_ERROR "bench-ab printed no row for small with both figures and a ratio")
endif()
file(READ "${json}" doc)
string(JSON ratio GET "${doc}" medians small b_over_a)
if(ratio STREQUAL "null" OR NOT ratio GREATER 0)
  message(FATAL_ERROR "bench-ab: no B/A ratio for small in the JSON (${ratio})")
endif()
execute_process(COMMAND /usr/bin/python3 "${SCRIPT}" -n 1 "${WORK_DIR}/missing" "${KVXFER}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
if(rc EQUAL 0 OR NOT err MATCHES "missing is not an executable")
  message(FATAL_ERROR "bench-ab took a missing binary: rc=${rc}\n${out}${err}")
endif()
