# lamp_gtest_suites(<target> [TEST_PREFIX <prefix>] [TIMEOUT <s>] [LABELS <l>...])
#
# Registers a googletest program's tests with ctest one suite per process,
# not one test per process as gtest_discover_tests does: each process loads
# LibTorch first (about 1 s on a 2-core machine, more for a CUDA-built
# wheel), which with one process per test was most of the gtest tests' time.
# After each build the program lists its tests (--gtest_list_tests) and
# tests/cmake/gtest_suites_list.cmake writes, per suite S:
#   <prefix>S        its tests but those ending in _CUDA
#   <prefix>S._CUDA  its tests ending in _CUDA (the GPU tests, which skip
#                    without a GPU)
# each run as `<program> --gtest_filter=...`; a process whose every test
# skipped exits with 77 (tests/gtest_main.cpp), which ctest reports as
# skipped. A failing test fails its suite; its name is in the output's
# "[  FAILED  ]" lines. LAMP_CTEST_PER_TEST=ON registers one test per process
# instead (gtest_discover_tests), which scripts/mutate.py's hinted runs need
# (a mutant names the tests that catch it).
option(LAMP_CTEST_PER_TEST
       "ctest runs each googletest test in its own process (default: one process per suite)"
       OFF)

function(lamp_gtest_suites target)
  cmake_parse_arguments(arg "" "TEST_PREFIX;TIMEOUT" "LABELS" ${ARGN})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()
  if(LAMP_CTEST_PER_TEST)
    set(_props TIMEOUT ${arg_TIMEOUT})
    if(arg_LABELS)
      list(APPEND _props LABELS "${arg_LABELS}")
    endif()
    gtest_discover_tests(${target} TEST_PREFIX "${arg_TEST_PREFIX}"
                         DISCOVERY_TIMEOUT 120 PROPERTIES ${_props})
    return()
  endif()
  set(_list "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  set(_include "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}"
      "-DPROGRAM=$<TARGET_FILE:${target}>"
      "-DOUT=${_list}"
      "-DTEST_PREFIX=${arg_TEST_PREFIX}"
      "-DTIMEOUT=${arg_TIMEOUT}"
      "-DLABELS=${arg_LABELS}"
      -P "${lamp_SOURCE_DIR}/tests/cmake/gtest_suites_list.cmake"
    BYPRODUCTS "${_list}"
    VERBATIM)
  # ctest reads this file; until the program is built there is nothing to
  # list, and a stand-in test says so.
  file(WRITE "${_include}"
    "if(EXISTS \"${_list}\")\n"
    "  include(\"${_list}\")\n"
    "else()\n"
    "  add_test(${arg_TEST_PREFIX}${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${_include}")
endfunction()
