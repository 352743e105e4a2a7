# packaging.pkg_config: installs lamp into a scratch prefix, builds
# tests/consumer/main.cpp with `<CXX> main.cpp $(pkg-config --cflags --libs
# lamp)` (PKG_CONFIG_PATH naming that prefix), and runs it.
#
#   cmake -DLAMP_SOURCE_DIR=<src> -DLAMP_BINARY_DIR=<build> -DWORK_DIR=<scratch>
#         -DPKG_CONFIG=<pkg-config> -DCXX=<compiler> -P pkg_config.cmake

cmake_minimum_required(VERSION 3.18)
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

if(NOT PKG_CONFIG OR NOT EXISTS "${PKG_CONFIG}")
  lamp_packaging_skip("no pkg-config on this machine (apt-get install pkg-config)")
endif()

set(_prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
lamp_install_into("${_prefix}")
file(GLOB_RECURSE _pc "${_prefix}/*/pkgconfig/lamp.pc")
list(LENGTH _pc _count)
if(NOT _count EQUAL 1)
  message(FATAL_ERROR "expected one pkgconfig/lamp.pc under ${_prefix}, found: '${_pc}'")
endif()
get_filename_component(_pc_dir "${_pc}" DIRECTORY)
set(ENV{PKG_CONFIG_PATH} "${_pc_dir}")

# The version is the headers' (and CMake's project version).
file(READ "${LAMP_SOURCE_DIR}/include/lamp/version.h" _version_h)
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "#define LAMP_VERSION_${_part} ([0-9]+)" _ "${_version_h}")
  list(APPEND _version "${CMAKE_MATCH_1}")
endforeach()
list(JOIN _version "." _version)
lamp_step("pkg-config --modversion lamp" "${PKG_CONFIG}" --modversion lamp)
string(STRIP "${lamp_step_output}" _modversion)
if(NOT _modversion STREQUAL _version)
  message(FATAL_ERROR "pkg-config --modversion lamp says '${_modversion}', the headers ${_version}")
endif()

lamp_step("pkg-config --cflags --libs lamp" "${PKG_CONFIG}" --cflags --libs lamp)
string(STRIP "${lamp_step_output}" _flags)
message(STATUS "pkg-config --cflags --libs lamp: ${_flags}")
separate_arguments(_flags UNIX_COMMAND "${_flags}")

set(_program "${WORK_DIR}/lamp_pkg_config_consumer")
lamp_step("building the consumer with pkg-config's flags"
  "${CXX}" -O1 "${LAMP_SOURCE_DIR}/tests/consumer/main.cpp" -o "${_program}" ${_flags})
lamp_step("running the consumer" "${_program}")
if(NOT lamp_step_output MATCHES "lamp consumer OK")
  message(FATAL_ERROR "the consumer did not report success:\n${lamp_step_output}")
endif()
string(STRIP "${lamp_step_output}" lamp_step_output)
message(STATUS "${lamp_step_output}")
