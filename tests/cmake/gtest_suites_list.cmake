# Writes OUT: ctest's add_test calls for PROGRAM's googletest suites, one
# process per suite and a second one for the suite's _CUDA tests
# (tests/cmake/LampGtestSuites.cmake says why).
#   cmake -DPROGRAM=<exe> -DOUT=<file> [-DTEST_PREFIX=<p>] [-DTIMEOUT=<s>]
#         [-DLABELS=<a;b>] -P gtest_suites_list.cmake
execute_process(COMMAND "${PROGRAM}" --gtest_list_tests
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 120)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} --gtest_list_tests failed (${_rc}):\n${_out}${_err}")
endif()

# The listing: "Suite." lines, each followed by "  Test" lines; value- and
# type-parameterised ones carry "  # GetParam() = ..." comments.
string(REPLACE ";" "\\;" _out "${_out}")
string(REPLACE "\n" ";" _lines "${_out}")
set(_suites "")
set(_suite "")
foreach(_line IN LISTS _lines)
  string(REGEX REPLACE " +#.*$" "" _line "${_line}")
  if(_line MATCHES "^([^ ].*)\\.$")
    set(_suite "${CMAKE_MATCH_1}")
    list(APPEND _suites "${_suite}")
    set(_cpu_${_suite} 0)
    set(_cuda_${_suite} 0)
  elseif(_line MATCHES "^  +([^ ]+)$" AND NOT _suite STREQUAL "")
    if(CMAKE_MATCH_1 MATCHES "_CUDA(/[0-9]+)?$")
      math(EXPR _cuda_${_suite} "${_cuda_${_suite}} + 1")
    else()
      math(EXPR _cpu_${_suite} "${_cpu_${_suite}} + 1")
    endif()
  endif()
endforeach()
if(NOT _suites)
  message(FATAL_ERROR "${PROGRAM} --gtest_list_tests listed no suite:\n${_out}")
endif()

set(_props "SKIP_RETURN_CODE 77 TIMEOUT ${TIMEOUT} ENVIRONMENT LAMP_GTEST_ALL_SKIPPED_EXIT=77")
if(NOT "${LABELS}" STREQUAL "")
  string(APPEND _props " LABELS [==[${LABELS}]==]")
endif()
set(_text "# Written by tests/cmake/gtest_suites_list.cmake from ${PROGRAM} --gtest_list_tests.\n")
foreach(_suite IN LISTS _suites)
  # A parameterised suite's name has "/" (e.g. "/NetworkToHalfDtype" for an
  # empty prefix): the ctest name drops a leading one.
  string(REGEX REPLACE "^/" "" _name "${TEST_PREFIX}${_suite}")
  if(_cpu_${_suite} GREATER 0)
    string(APPEND _text
      "add_test([==[${_name}]==] [==[${PROGRAM}]==] [==[--gtest_filter=${_suite}.*-${_suite}.*_CUDA:${_suite}.*_CUDA/*]==])\n"
      "set_tests_properties([==[${_name}]==] PROPERTIES ${_props})\n")
  endif()
  if(_cuda_${_suite} GREATER 0)
    string(APPEND _text
      "add_test([==[${_name}._CUDA]==] [==[${PROGRAM}]==] [==[--gtest_filter=${_suite}.*_CUDA:${_suite}.*_CUDA/*]==])\n"
      "set_tests_properties([==[${_name}._CUDA]==] PROPERTIES ${_props})\n")
  endif()
endforeach()
file(WRITE "${OUT}" "${_text}")
