# SPDX-License-Identifier: Apache-2.0
# `kvxfer info` names the libkvxfer the process really loaded: the line
# "library: <path>" must resolve to the library this build made (the tool's
# build RPATH points there), not merely be present.
#   cmake -DKVXFER=path/to/kvxfer -DLIBRARY=path/to/libkvxfer.so.X.Y.Z -P info_library.cmake
execute_process(COMMAND "${KVXFER}" info
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
message(STATUS "kvxfer info\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvxfer info exited with ${rc}")
endif()
if(NOT out MATCHES "\nlibrary: ([^\n]+)\n")
  message(FATAL_ERROR "kvxfer info printed no 'library:' line")
endif()
set(printed "${CMAKE_MATCH_1}")
file(REAL_PATH "${printed}" printed_real)
file(REAL_PATH "${LIBRARY}" expected_real)
if(NOT printed_real STREQUAL expected_real)
  message(FATAL_ERROR "library: ${printed} (${printed_real}), expected ${expected_real}")
endif()
