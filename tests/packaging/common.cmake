# Shared by the packaging test scripts (included, never run on its own).

foreach(_var LAMP_SOURCE_DIR LAMP_BINARY_DIR WORK_DIR)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "${CMAKE_SCRIPT_MODE_FILE}: pass -D${_var}=<path>.")
  endif()
endforeach()

# Prints the reason and ends the script; ctest's SKIP_REGULAR_EXPRESSION
# reports the test as skipped.
macro(lamp_packaging_skip reason)
  message("lamp packaging test skipped: ${reason}")
  return()
endmacro()

# Runs a command; on failure, stops with its whole output. The output is left
# in lamp_step_output.
function(lamp_step name)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${_rc}): ${ARGN}\n${_out}")
  endif()
  set(lamp_step_output "${_out}" PARENT_SCOPE)
endfunction()

# Installs the build into <prefix> (emptied first).
function(lamp_install_into prefix)
  file(REMOVE_RECURSE "${prefix}")
  lamp_step("installing lamp" "${CMAKE_COMMAND}" --install "${LAMP_BINARY_DIR}" --prefix "${prefix}")
endfunction()
