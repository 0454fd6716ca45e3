# SPDX-License-Identifier: Apache-2.0
# `kvxfer peers` and `kvxfer startup` end to end, small: 1 and 8 loopback
# peers, 1 and 2 target processes over TCP; checks the JSON fields exist
# (never their values, but that startup derives no negative figure: this is
# no timed test).
#   cmake -DKVXFER=path/to/kvxfer -DWORK_DIR=dir -P peers_smoke.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(args peers --loopback 1,8 --tcp 1,2 --region 4M --poll-reps 50 --quiet
  --json "${WORK_DIR}/peers.json")
find_program(GNUPLOT gnuplot)
if(GNUPLOT)
  list(APPEND args --plot "${WORK_DIR}/peers.png")
endif()
execute_process(COMMAND "${KVXFER}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "kvxfer ${args}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer peers exited with ${rc}")
endif()
file(READ "${WORK_DIR}/peers.json" json)
foreach(engine loopback tcp)
  string(JSON n LENGTH "${json}" ${engine})
  if(NOT n EQUAL 2)
    message(FATAL_ERROR "${engine}: ${n} checkpoints, expected 2")
  endif()
  foreach(i 0 1)
    foreach(field peers heap_bytes_per_peer rss_bytes_per_peer fds_per_peer mean_in_flight)
      string(JSON v GET "${json}" ${engine} ${i} ${field})
    endforeach()
    foreach(timing add_remote_peer poll_peer)
      foreach(field count p50_us p99_us)
        string(JSON v GET "${json}" ${engine} ${i} ${timing} ${field})
      endforeach()
    endforeach()
  endforeach()
endforeach()
if(GNUPLOT AND NOT EXISTS "${WORK_DIR}/peers.png")
  message(FATAL_ERROR "no plot written")
endif()

execute_process(COMMAND "${KVXFER}" startup --region 16M --reps 2 --json "${WORK_DIR}/startup.json"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
message(STATUS "kvxfer startup\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer startup exited with ${rc}")
endif()
file(READ "${WORK_DIR}/startup.json" json)
foreach(k transport transport_no_progress_thread transport_rma_on transport_rma_off
    transport_loopback)
  string(JSON v GET "${json}" median_ms ${k})
  string(JSON v GET "${json}" first_ms ${k})
  string(JSON v GET "${json}" lanes ${k})
endforeach()
# Whole Transports only: no row of UCX steps the engine does not take, and
# the one derived figure (what the ucx lane adds) positive or absent.
string(JSON ucx_lane TYPE "${json}" ucx_lane_ms)
if(ucx_lane STREQUAL "NUMBER")
  string(JSON ucx_lane GET "${json}" ucx_lane_ms)
  if(NOT ucx_lane GREATER 0)
    message(FATAL_ERROR "startup: ucx_lane_ms ${ucx_lane} is not positive")
  endif()
elseif(NOT ucx_lane STREQUAL "NULL")
  message(FATAL_ERROR "startup: ucx_lane_ms is ${ucx_lane}")
endif()
