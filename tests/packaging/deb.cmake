# packaging.deb: makes the Debian package with cpack -G DEB (packages in a
# scratch folder), checks its fields (dpkg-deb -f), unpacks it (dpkg-deb -x)
# into a scratch root, and builds and runs tests/consumer against that root's
# usr/ with find_package(lamp) (tests/consumer/run.cmake). cpack first brings
# the build folder up to date (its preinstall step), as for a user: a target
# that does not build fails this test too.
#
#   cmake -DLAMP_SOURCE_DIR=<src> -DLAMP_BINARY_DIR=<build> -DWORK_DIR=<scratch>
#         -DDPKG_DEB=<dpkg-deb> -DCPACK=<cpack> -DTORCH_PACKAGE=<"name version">
#         -DVERSION=<lamp's version> [-DCMAKE_BUILD_TYPE=Release]
#         [-DCMAKE_CXX_COMPILER=<compiler>] -P deb.cmake
#
# Skipped without dpkg-deb (not Debian) and when TORCH_PACKAGE is empty (a
# LibTorch that no Debian package holds, for which cpack refuses the .deb).
# With -DEXPECT_REFUSED=ON (such a LibTorch) it checks that refusal instead:
# cpack -G DEB fails at once, saying why, and makes no package.

cmake_minimum_required(VERSION 3.18)
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

if(NOT DPKG_DEB OR NOT EXISTS "${DPKG_DEB}")
  lamp_packaging_skip("no dpkg-deb: not a Debian system")
endif()
if(EXPECT_REFUSED)
  file(REMOVE_RECURSE "${WORK_DIR}")
  file(MAKE_DIRECTORY "${WORK_DIR}")
  execute_process(COMMAND "${CPACK}" -G DEB
                  --config "${LAMP_BINARY_DIR}/CPackConfig.cmake" -B "${WORK_DIR}/packages"
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  string(REGEX REPLACE "[ \t\r\n]+" " " _flat "${_out}")
  file(GLOB _debs "${WORK_DIR}/packages/*.deb")
  if(_rc EQUAL 0 OR _debs OR NOT _flat MATCHES "liblamp-dev must depend on the package of its LibTorch")
    message(FATAL_ERROR "cpack -G DEB should have refused this lamp's package (exit ${_rc}, "
                        "packages '${_debs}'):\n${_out}")
  endif()
  message(STATUS "cpack -G DEB refused, as expected")
  return()
endif()
if("${TORCH_PACKAGE}" STREQUAL "")
  lamp_packaging_skip("lamp was built with a LibTorch that no Debian package holds (a torch wheel); cpack refuses its .deb")
endif()
if(NOT DEFINED CMAKE_BUILD_TYPE OR CMAKE_BUILD_TYPE STREQUAL "")
  set(CMAKE_BUILD_TYPE Release)
endif()
string(REGEX REPLACE " .*" "" _torch_deb "${TORCH_PACKAGE}")

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
lamp_step("cpack -G DEB"
  "${CPACK}" -G DEB -C "${CMAKE_BUILD_TYPE}"
  --config "${LAMP_BINARY_DIR}/CPackConfig.cmake" -B "${WORK_DIR}/packages")
file(GLOB _debs "${WORK_DIR}/packages/*.deb")
list(LENGTH _debs _count)
if(NOT _count EQUAL 1)
  message(FATAL_ERROR "expected one .deb in ${WORK_DIR}/packages, found '${_debs}':\n${lamp_step_output}")
endif()
get_filename_component(_name "${_debs}" NAME)
if(NOT _name MATCHES "^liblamp-dev_${VERSION}_[a-z0-9]+\\.deb$")
  message(FATAL_ERROR "the package is named ${_name}, expected liblamp-dev_${VERSION}_<arch>.deb")
endif()

lamp_step("dpkg-deb -I" "${DPKG_DEB}" -I "${_debs}")
message(STATUS "dpkg-deb -I ${_name}:\n${lamp_step_output}")

# Fields.
set(_problems "")
function(_lamp_field name out)
  lamp_step("dpkg-deb -f ${name}" "${DPKG_DEB}" -f "${_debs}" "${name}")
  string(STRIP "${lamp_step_output}" _value)
  set(${out} "${_value}" PARENT_SCOPE)
endfunction()
_lamp_field(Package _package)
_lamp_field(Version _version)
_lamp_field(Depends _depends)
_lamp_field(Section _section)
_lamp_field(Architecture _arch)
_lamp_field(Maintainer _maintainer)
_lamp_field(Description _description)
if(NOT _package STREQUAL "liblamp-dev")
  list(APPEND _problems "Package is '${_package}', expected liblamp-dev")
endif()
if(NOT _version STREQUAL VERSION)
  list(APPEND _problems "Version is '${_version}', expected ${VERSION}")
endif()
if(NOT _depends MATCHES "(^|, )${_torch_deb} \\(>= [0-9]")
  list(APPEND _problems "Depends is '${_depends}', expected ${_torch_deb} (>= ...) in it")
endif()
if(NOT _depends MATCHES "(^|, )zlib1g-dev(,|$| )")
  list(APPEND _problems "Depends is '${_depends}', expected zlib1g-dev in it")
endif()
if(NOT _section STREQUAL "libdevel")
  list(APPEND _problems "Section is '${_section}', expected libdevel")
endif()
execute_process(COMMAND dpkg --print-architecture OUTPUT_VARIABLE _dpkg_arch
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(_dpkg_arch AND NOT _arch STREQUAL _dpkg_arch)
  list(APPEND _problems "Architecture is '${_arch}', dpkg says ${_dpkg_arch}")
endif()
foreach(_field Maintainer Description)
  string(TOLOWER "_${_field}" _var)
  if("${${_var}}" STREQUAL "")
    list(APPEND _problems "the field ${_field} is empty")
  endif()
endforeach()

# Contents: everything below /usr, with the files a consumer needs.
set(_root "${WORK_DIR}/root")
lamp_step("dpkg-deb -x" "${DPKG_DEB}" -x "${_debs}" "${_root}")
file(GLOB_RECURSE _all RELATIVE "${_root}" "${_root}/*")
foreach(_file IN LISTS _all)
  if(NOT _file MATCHES "^usr/")
    list(APPEND _problems "the package installs ${_file}, outside /usr")
  endif()
endforeach()
foreach(_pattern
    "usr/include/lamp/lamp.h" "usr/include/lamp/version.h" "usr/lib*/liblamp.*"
    "usr/lib*/cmake/lamp/lampConfig.cmake" "usr/lib*/cmake/lamp/lampTargets.cmake"
    "usr/lib*/pkgconfig/lamp.pc" "usr/share/doc/*/LICENSE" "usr/share/doc/*/README.md")
  file(GLOB_RECURSE _found "${_root}/${_pattern}")
  if(NOT _found)
    list(APPEND _problems "the package has no ${_pattern}")
  endif()
endforeach()
if(_problems)
  list(JOIN _problems "\n  " _problems)
  message(FATAL_ERROR "${_name}:\n  ${_problems}")
endif()

# A consumer with find_package(lamp) against the unpacked package; LibTorch
# is the system's (the package's dependency).
lamp_step("the consumer against the unpacked package"
  "${CMAKE_COMMAND}"
    "-DLAMP_SOURCE_DIR=${LAMP_SOURCE_DIR}"
    "-DLAMP_PREFIX=${_root}/usr"
    "-DWORK_DIR=${WORK_DIR}/consumer"
    "-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}"
    "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
    -P "${LAMP_SOURCE_DIR}/tests/consumer/run.cmake")
string(STRIP "${lamp_step_output}" lamp_step_output)
message(STATUS "${_name}: ${_package} ${_version}, Depends: ${_depends}\n${lamp_step_output}")
