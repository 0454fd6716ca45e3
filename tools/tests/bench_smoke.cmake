# `kvxfer bench` end to end, small: every case against a spawned target over
# shared memory, with the JSON record (and the plot when gnuplot is there)
# checked for a verified result per case.
#   cmake -DKVXFER=path/to/kvxfer -DWORK_DIR=dir -P bench_smoke.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(args bench --region 64M --total 16M --reg-reps 5 --verify-blocks 512
  --perftest-timeout 20 --quiet --json "${WORK_DIR}/bench.json")
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
