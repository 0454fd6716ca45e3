# SPDX-License-Identifier: Apache-2.0
# `kvxfer bench --pool huge`, small, writes and reads over shared memory:
# every case verified, the JSON saying the pools were huge, and, where the
# kernel offers transparent huge pages (THP "always" or "madvise"), the
# initiator's pool on them (config.pool_huge_bytes > 0), so that what was
# measured is a pool on huge pages. A plain pool reports 0 (checked too, so
# that the figure cannot read the same either way).
# Reads run one at a time (--depth 1): the bench's random schedule lets
# transfers in flight together share a destination block (left out of the
# verification, as their landing order is unknown), and a read's
# destination is in this process, where ThreadSanitizer sees two
# process_vm_readv calls write one block and reports the race the schedule
# made. The lane's own concurrency on reads (copiers and a polling caller
# on one transfer, several in flight) is covered by cma_lane_test.
#   cmake -DKVXFER=path/to/kvxfer -DWORK_DIR=dir -P bench_huge_smoke.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(thp_offered FALSE)
if(EXISTS /sys/kernel/mm/transparent_hugepage/enabled)
  file(READ /sys/kernel/mm/transparent_hugepage/enabled thp)
  if(thp MATCHES "\\[(always|madvise)\\]")
    set(thp_offered TRUE)
  endif()
endif()
foreach(pool_op huge:write private:write huge:read private:read)
  string(REPLACE ":" ";" parts "${pool_op}")
  list(GET parts 0 pool)
  list(GET parts 1 op)
  set(args bench --pool ${pool} --op ${op} --cases big,layer,small,runs --region 64M
    --total 16M --verify-blocks 512 --no-perftest --quiet --json "${WORK_DIR}/${pool}-${op}.json")
  if(op STREQUAL "read")
    list(APPEND args --depth 1)
  endif()
  execute_process(COMMAND "${KVXFER}" ${args}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
  message(STATUS "kvxfer ${args}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kvxfer bench --pool ${pool} --op ${op} exited with ${rc}")
  endif()
  set(JSON "${WORK_DIR}/${pool}-${op}.json")
  set(CASES big layer small runs)
  include("${CMAKE_CURRENT_LIST_DIR}/check_bench_json.cmake")
  file(READ "${JSON}" doc)
  string(JSON got GET "${doc}" config pool)
  if(NOT got STREQUAL "${pool}")
    message(FATAL_ERROR "${pool}-${op}.json: config.pool is '${got}', not '${pool}'")
  endif()
  string(JSON on_huge GET "${doc}" config pool_huge_bytes)
  if(pool STREQUAL "huge" AND thp_offered AND NOT on_huge GREATER 0)
    message(FATAL_ERROR "${pool}-${op}: THP is offered but no byte of the pool is on huge pages")
  endif()
  if(pool STREQUAL "private" AND thp MATCHES "\\[madvise\\]" AND NOT on_huge EQUAL 0)
    message(FATAL_ERROR "${pool}-${op}: a plain pool reports ${on_huge} bytes on huge pages")
  endif()
endforeach()
