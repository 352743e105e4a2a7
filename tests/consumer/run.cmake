# The find-package test: installs a built lamp into a prefix, builds the
# consumer project (LAMP_SOURCE_DIR/tests/consumer) against it with
# find_package(lamp), and runs the program.
#
#   cmake -DLAMP_SOURCE_DIR=<lamp source> -DLAMP_BINARY_DIR=<lamp build>
#         -DWORK_DIR=<scratch folder> [-DTORCH_PREFIX_PATH=<list>]
#         [-DCMAKE_BUILD_TYPE=Release] [-DCMAKE_CXX_COMPILER=<lamp's compiler>]
#         -P run.cmake
#
# With -DLAMP_PREFIX=<folder> (instead of LAMP_BINARY_DIR) the consumer uses
# the lamp already installed there (e.g. an unpacked Debian package's usr/).
#
# With -DFETCH_CONTENT=FULL (instead of LAMP_BINARY_DIR) nothing is
# installed: the consumer in tests/consumer/fetch_content builds lamp from
# LAMP_SOURCE_DIR itself with FetchContent (SOURCE_DIR, no download), links
# lamp::lamp and runs. With -DFETCH_CONTENT=COMPILE that project is only
# configured (lamp's CMakeLists running as its subproject) and its object
# library lamp_consumer_compile built: the consumer's source compiled with
# lamp::lamp's usage requirements, lamp itself not compiled.
# [-DCOMPILER_LAUNCHER=ccache] [-DPARALLEL=N] [-DDISABLE_PRECOMPILE_HEADERS=ON]
# are passed on to that build.
#
# TORCH_PREFIX_PATH is the `;`-separated CMAKE_PREFIX_PATH lamp was configured
# with (empty for Debian's LibTorch; "<torch>;<torch>/share/cmake" for the
# wheel's), so the consumer finds the same LibTorch.
#
# With -DOTHER_TORCH_DIR=<folder holding another LibTorch's TorchConfig.cmake>
# the consumer is configured with that LibTorch instead (Torch_DIR), and
# find_package(lamp) must refuse it with a message naming both LibTorchs.
# OTHER_TORCH_DIR=NONE, or a folder without TorchConfig.cmake: the test
# prints "lamp consumer test skipped" (ctest's SKIP_REGULAR_EXPRESSION).

cmake_minimum_required(VERSION 3.18)

set(_required LAMP_SOURCE_DIR WORK_DIR)
if(NOT DEFINED FETCH_CONTENT OR FETCH_CONTENT STREQUAL "")
  set(FETCH_CONTENT OFF)
elseif(NOT FETCH_CONTENT MATCHES "^(FULL|COMPILE|OFF)$")
  message(FATAL_ERROR "run.cmake: FETCH_CONTENT must be FULL, COMPILE or OFF, got '${FETCH_CONTENT}'.")
endif()
if(NOT DEFINED LAMP_PREFIX AND FETCH_CONTENT STREQUAL "OFF")
  list(APPEND _required LAMP_BINARY_DIR)
endif()
foreach(_var IN LISTS _required)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: pass -D${_var}=<path>.")
  endif()
endforeach()
if(NOT DEFINED CMAKE_BUILD_TYPE OR CMAKE_BUILD_TYPE STREQUAL "")
  set(CMAKE_BUILD_TYPE Release)
endif()

if(DEFINED OTHER_TORCH_DIR AND NOT EXISTS "${OTHER_TORCH_DIR}/TorchConfig.cmake")
  message("lamp consumer test skipped: no other LibTorch on this machine "
          "(OTHER_TORCH_DIR='${OTHER_TORCH_DIR}')")
  return()
endif()

set(_prefix "${WORK_DIR}/prefix")
set(_build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Runs one step; on failure, stops with the step's whole output.
function(_lamp_consumer_step name)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "lamp consumer test: ${name} failed (${_rc}):\n${_out}")
  endif()
  set(_lamp_consumer_output "${_out}" PARENT_SCOPE)
endfunction()

set(_consumer_source "${LAMP_SOURCE_DIR}/tests/consumer")
if(NOT FETCH_CONTENT STREQUAL "OFF")
  set(_consumer_source "${LAMP_SOURCE_DIR}/tests/consumer/fetch_content")
elseif(DEFINED LAMP_PREFIX)
  set(_prefix "${LAMP_PREFIX}")
else()
  _lamp_consumer_step("installing lamp"
    "${CMAKE_COMMAND}" --install "${LAMP_BINARY_DIR}" --prefix "${_prefix}")
endif()

# The prefix path is a list; passed through execute_process as one -D argument
# it would be split at its semicolons, so it goes in an initial-cache file.
set(_prefix_path "${_prefix}")
if(NOT "${TORCH_PREFIX_PATH}" STREQUAL "")
  list(APPEND _prefix_path ${TORCH_PREFIX_PATH})
endif()
file(WRITE "${WORK_DIR}/initial-cache.cmake"
  "set(CMAKE_PREFIX_PATH [==[${_prefix_path}]==] CACHE STRING \"\")\n"
  "set(CMAKE_BUILD_TYPE [==[${CMAKE_BUILD_TYPE}]==] CACHE STRING \"\")\n")
if(NOT "${CMAKE_CXX_COMPILER}" STREQUAL "")
  file(APPEND "${WORK_DIR}/initial-cache.cmake"
    "set(CMAKE_CXX_COMPILER [==[${CMAKE_CXX_COMPILER}]==] CACHE FILEPATH \"\")\n")
endif()
if(NOT FETCH_CONTENT STREQUAL "OFF")
  file(APPEND "${WORK_DIR}/initial-cache.cmake"
    "set(LAMP_SOURCE_DIR [==[${LAMP_SOURCE_DIR}]==] CACHE PATH \"\")\n"
    "set(CMAKE_CXX_COMPILER_LAUNCHER [==[${COMPILER_LAUNCHER}]==] CACHE STRING \"\")\n"
    "set(CMAKE_DISABLE_PRECOMPILE_HEADERS [==[${DISABLE_PRECOMPILE_HEADERS}]==] CACHE BOOL \"\")\n")
endif()
set(_parallel "")
if(PARALLEL)
  set(_parallel --parallel "${PARALLEL}")
endif()


if(DEFINED OTHER_TORCH_DIR)
  # Only lamp's prefix, and the other LibTorch by its Torch_DIR. A torch
  # wheel's TorchConfig looks for the CUDA toolkit (nvcc), as in lib.sh.
  file(WRITE "${WORK_DIR}/initial-cache.cmake"
    "set(CMAKE_PREFIX_PATH [==[${_prefix}]==] CACHE STRING \"\")\n"
    "set(Torch_DIR [==[${OTHER_TORCH_DIR}]==] CACHE PATH \"\")\n")
  find_program(_nvcc nvcc)
  if(NOT _nvcc AND EXISTS /usr/local/cuda/bin/nvcc)
    set(ENV{PATH} "/usr/local/cuda/bin:$ENV{PATH}")
  endif()
  execute_process(COMMAND "${CMAKE_COMMAND}" -C "${WORK_DIR}/initial-cache.cmake"
                  -S "${LAMP_SOURCE_DIR}/tests/consumer" -B "${_build}"
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  # CMake wraps long messages: compare with the line breaks taken out.
  string(REGEX REPLACE "[ \t\r\n]+" " " _flat "${_out}")
  # A CUDA wheel's CMake config needs the CUDA toolkit before lamp's config
  # is reached: without a CUDA compiler here, nothing can be refused.
  find_program(_nvcc_now nvcc)
  if(NOT _rc EQUAL 0 AND NOT _nvcc_now AND
     NOT _flat MATCHES "lamp was built with LibTorch" AND
     _flat MATCHES "CUDA")
    message(STATUS "lamp consumer test skipped: the LibTorch at "
                   "${OTHER_TORCH_DIR} is CUDA-built and its CMake config "
                   "needs a CUDA toolkit (nvcc), which this machine lacks")
    return()
  endif()
  if(_rc EQUAL 0 OR NOT _flat MATCHES "lamp was built with LibTorch .* but find_package\\(Torch\\) found LibTorch"
     OR NOT _flat MATCHES "CMAKE_PREFIX_PATH")
    message(FATAL_ERROR
      "lamp consumer test: configuring the consumer with the LibTorch at "
      "${OTHER_TORCH_DIR} should have failed with lamp's message naming both "
      "LibTorchs (exit ${_rc}):\n${_out}")
  endif()
  string(REGEX MATCH "lamp was built with LibTorch .* rebuild lamp against the LibTorch at [^ ]*" _line "${_flat}")
  message(STATUS "refused as expected: ${_line}")
  return()
endif()

_lamp_consumer_step("configuring the consumer"
  "${CMAKE_COMMAND}" -C "${WORK_DIR}/initial-cache.cmake"
  -S "${_consumer_source}" -B "${_build}")
if(FETCH_CONTENT STREQUAL "COMPILE")
  _lamp_consumer_step("compiling the consumer against lamp::lamp"
    "${CMAKE_COMMAND}" --build "${_build}" --config "${CMAKE_BUILD_TYPE}"
    --target lamp_consumer_compile ${_parallel})
  # Only the consumer's object: lamp's own sources must not have compiled
  # (the point of this mode), so no object of lamp's may be in the tree.
  file(GLOB_RECURSE _lamp_objects "${_build}/_deps/*.o" "${_build}/_deps/*.obj")
  if(_lamp_objects)
    list(GET _lamp_objects 0 _first)
    message(FATAL_ERROR "lamp consumer test: compiling the consumer alone also compiled lamp (e.g. ${_first}); lamp_consumer_compile should not depend on lamp's build")
  endif()
  message(STATUS "lamp consumer compiled against lamp::lamp from FetchContent "
                 "(lamp itself not built: -DLAMP_TEST_FETCH_CONTENT=ON builds, links and runs it)")
  return()
endif()
_lamp_consumer_step("building the consumer"
  "${CMAKE_COMMAND}" --build "${_build}" --config "${CMAKE_BUILD_TYPE}" ${_parallel})

# Single-config generators put the program in the build folder, multi-config
# ones in a per-configuration subfolder.
set(_program "${_build}/lamp_consumer")
if(NOT EXISTS "${_program}" AND EXISTS "${_build}/${CMAKE_BUILD_TYPE}/lamp_consumer")
  set(_program "${_build}/${CMAKE_BUILD_TYPE}/lamp_consumer")
endif()
_lamp_consumer_step("running the consumer" "${_program}")
if(NOT _lamp_consumer_output MATCHES "lamp consumer OK")
  message(FATAL_ERROR
    "lamp consumer test: the program did not report success:\n${_lamp_consumer_output}")
endif()
string(STRIP "${_lamp_consumer_output}" _lamp_consumer_output)
message(STATUS "${_lamp_consumer_output}")
