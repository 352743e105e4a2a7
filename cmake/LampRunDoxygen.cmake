# Runs Doxygen on lamp's configured Doxyfile; cmake/LampDocs.cmake's docs
# target and docs.api_warnings test call it:
#   cmake -DDOXYGEN_EXECUTABLE=<doxygen> -DDOXYFILE=<build>/docs/Doxyfile
#         -DWARN_LOG=<its WARN_LOGFILE> -DOUTPUT_DIR=<its output folder>
#         -DSTRICT=ON|OFF -P LampRunDoxygen.cmake
# Doxygen writes its warnings to WARN_LOG only (QUIET, WARN_LOGFILE). They
# are printed; with STRICT=ON any warning fails the run.
cmake_minimum_required(VERSION 3.18)
foreach(_var DOXYGEN_EXECUTABLE DOXYFILE WARN_LOG OUTPUT_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "LampRunDoxygen.cmake: -D${_var}=... is required")
  endif()
endforeach()

# A stale log must not pass (or fail) this run.
file(REMOVE "${WARN_LOG}")
file(MAKE_DIRECTORY "${OUTPUT_DIR}")
execute_process(COMMAND "${DOXYGEN_EXECUTABLE}" "${DOXYFILE}"
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "doxygen ${DOXYFILE} failed (exit ${_rc}):\n${_out}${_err}")
endif()
if(_err)
  # Messages about the configuration itself go to stderr, not to WARN_LOG.
  message("${_err}")
endif()

set(_log "")
if(EXISTS "${WARN_LOG}")
  file(READ "${WARN_LOG}" _log)
endif()
string(STRIP "${_log}" _log)
if(_log STREQUAL "" AND NOT _err)
  message(STATUS "API reference: ${OUTPUT_DIR}/html/index.html (no warnings)")
  return()
endif()

string(REGEX MATCHALL ": warning: " _warnings "${_log}")
list(LENGTH _warnings _count)
# Unformatted (message(WARNING) and FATAL_ERROR rewrap long lines), so that
# each warning stays one "file:line: warning: text" line.
message("${_log}")
set(_summary "Doxygen: ${_count} warning(s) for lamp's public headers (log: ${WARN_LOG})")
if(_err)
  string(APPEND _summary ", and messages on its standard error (above)")
endif()
if(STRICT)
  message(FATAL_ERROR "${_summary}. Document every public name in include/lamp "
                      "with a /// comment on its declaration.")
else()
  message(WARNING "${_summary}")
  message(STATUS "API reference: ${OUTPUT_DIR}/html/index.html")
endif()
