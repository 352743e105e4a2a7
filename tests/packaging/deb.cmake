# packaging.deb: makes the Debian packages with cpack -G DEB (packages in a
# scratch folder), checks their fields (dpkg-deb -f), unpacks them (dpkg-deb
# -x) into a scratch root, builds and runs tests/consumer against that root's
# usr/ with find_package(lamp) (tests/consumer/run.cmake), and runs the
# unpacked programs' --version. cpack first brings the build folder up to
# date (its preinstall step), as for a user: a target that does not build
# fails this test too.
#
#   cmake -DLAMP_SOURCE_DIR=<src> -DLAMP_BINARY_DIR=<build> -DWORK_DIR=<scratch>
#         -DDPKG_DEB=<dpkg-deb> -DCPACK=<cpack> -DTORCH_PACKAGE=<"name version">
#         -DVERSION=<lamp's version> [-DCMAKE_BUILD_TYPE=Release]
#         [-DCMAKE_CXX_COMPILER=<compiler>] -P deb.cmake
#
# The maintainer and the programs lamp-tools must hold come from the build's
# CPackConfig.cmake (LAMP_PACKAGE_MAINTAINER; CPACK_LAMP_TOOLS, empty where
# the programs are not built, and then there is no lamp-tools).
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
include("${LAMP_BINARY_DIR}/CPackConfig.cmake")
set(MAINTAINER "${CPACK_DEBIAN_PACKAGE_MAINTAINER}")
set(TOOLS "${CPACK_LAMP_TOOLS}")
set(_expected "liblamp-dev_${VERSION}_[a-z0-9]+\\.deb")
if(TOOLS)
  set(_expected "(${_expected}|lamp-tools_${VERSION}_[a-z0-9]+\\.deb)")
  set(_expected_count 2)
else()
  set(_expected_count 1)
endif()
list(LENGTH _debs _count)
set(_names "")
foreach(_deb IN LISTS _debs)
  get_filename_component(_name "${_deb}" NAME)
  list(APPEND _names "${_name}")
  if(NOT _name MATCHES "^${_expected}$")
    message(FATAL_ERROR "a package is named ${_name}, expected liblamp-dev_${VERSION}_<arch>.deb"
                        " or lamp-tools_${VERSION}_<arch>.deb:\n${lamp_step_output}")
  endif()
endforeach()
if(NOT _count EQUAL _expected_count)
  message(FATAL_ERROR "expected ${_expected_count} .deb files in ${WORK_DIR}/packages, "
                      "found '${_names}':\n${lamp_step_output}")
endif()

set(_problems "")
# _lamp_expect(<value> MATCHES|NOT_MATCHES <regex> <problem>): adds
# "<package file>: <problem>" to _problems unless the value does (not) match.
function(_lamp_expect value mode regex problem)
  if("${value}" MATCHES "${regex}")
    set(_matches ON)
  else()
    set(_matches OFF)
  endif()
  if((mode STREQUAL "MATCHES") AND NOT _matches OR (mode STREQUAL "NOT_MATCHES") AND _matches)
    list(APPEND _problems "${_name}: ${problem}")
    set(_problems "${_problems}" PARENT_SCOPE)
  endif()
endfunction()
# _lamp_field(<deb> <field> <var>): a control field of a package.
function(_lamp_field deb name out)
  lamp_step("dpkg-deb -f ${name}" "${DPKG_DEB}" -f "${deb}" "${name}")
  string(STRIP "${lamp_step_output}" _value)
  set(${out} "${_value}" PARENT_SCOPE)
endfunction()
execute_process(COMMAND dpkg --print-architecture OUTPUT_VARIABLE _dpkg_arch
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(_root "${WORK_DIR}/root")
foreach(_deb IN LISTS _debs)
  get_filename_component(_name "${_deb}" NAME)
  lamp_step("dpkg-deb -I" "${DPKG_DEB}" -I "${_deb}")
  message(STATUS "dpkg-deb -I ${_name}:\n${lamp_step_output}")
  foreach(_field Package Version Depends Section Architecture Maintainer Description)
    string(TOLOWER "_${_field}" _var)
    _lamp_field("${_deb}" ${_field} ${_var})
  endforeach()
  _lamp_expect("${_version}" MATCHES "^${VERSION}$" "Version is '${_version}', expected ${VERSION}")
  if(_dpkg_arch)
    _lamp_expect("${_architecture}" MATCHES "^${_dpkg_arch}$"
                 "Architecture is '${_architecture}', dpkg says ${_dpkg_arch}")
  endif()
  string(REGEX REPLACE "([][+.*()^$?|\\\\])" "\\\\\\1" _maintainer_regex "${MAINTAINER}")
  _lamp_expect("${_maintainer}" MATCHES "^${_maintainer_regex}$"
               "Maintainer is '${_maintainer}', LAMP_PACKAGE_MAINTAINER is '${MAINTAINER}'")
  _lamp_expect("${_maintainer}" NOT_MATCHES "example\\.(org|com|net)"
               "Maintainer is a placeholder: '${_maintainer}'")
  _lamp_expect("${_description}" MATCHES "^LibTorch Automatic Mixed Precision \\((C\\+\\+ development files|training and benchmark programs)\\)\n"
               "Description does not start with its package's summary: '${_description}'")
  # Each package's own files, then all unpacked into one root.
  lamp_step("dpkg-deb -c" "${DPKG_DEB}" -c "${_deb}")
  set(_contents "${lamp_step_output}")
  lamp_step("dpkg-deb -x" "${DPKG_DEB}" -x "${_deb}" "${_root}")
  if(_package STREQUAL "liblamp-dev")
    set(_dev_depends "${_depends}")
    _lamp_expect("${_depends}" MATCHES "(^|, )${_torch_deb} \\(>= [0-9]"
                 "Depends is '${_depends}', expected ${_torch_deb} (>= ...) in it")
    _lamp_expect("${_depends}" MATCHES "(^|, )zlib1g-dev(,|$| )"
                 "Depends is '${_depends}', expected zlib1g-dev in it")
    if(CPACK_LAMP_WITH_SENTENCEPIECE)
      _lamp_expect("${_depends}" MATCHES "(^|, )libsentencepiece0(,|$| )"
                   "Depends is '${_depends}', expected libsentencepiece0 in it (its SentencePiece module links it)")
      _lamp_expect("${_contents}" MATCHES "usr/lib[^ ]*/lamp/liblamp_sentencepiece[.]so"
                   "holds no SentencePiece module (lib/lamp/liblamp_sentencepiece.so)")
    endif()
    _lamp_expect("${_section}" MATCHES "^libdevel$" "Section is '${_section}', expected libdevel")
    _lamp_expect("${_contents}" NOT_MATCHES "usr/bin/" "holds programs; they belong in lamp-tools")
  elseif(_package STREQUAL "lamp-tools")
    set(_tools_depends "${_depends}")
    # The runtime libraries of LibTorch (libtorch1.13 ...), not its headers,
    # and not lamp's library package (the programs link lamp statically).
    _lamp_expect("${_depends}" MATCHES "(^|, )libtorch[0-9.]+( |,|$)"
                 "Depends is '${_depends}', expected LibTorch's runtime package (libtorch<version>) in it")
    _lamp_expect("${_depends}" NOT_MATCHES "libtorch-dev|liblamp-dev"
                 "Depends is '${_depends}': the programs need no development package")
    _lamp_expect("${_contents}" NOT_MATCHES "usr/include/" "holds headers; they belong in liblamp-dev")
  else()
    list(APPEND _problems "${_name}: Package is '${_package}', expected liblamp-dev or lamp-tools")
  endif()
endforeach()

# Contents: everything below /usr, with the files a consumer needs.
file(GLOB_RECURSE _all RELATIVE "${_root}" "${_root}/*")
foreach(_file IN LISTS _all)
  if(NOT _file MATCHES "^usr/")
    list(APPEND _problems "the packages install ${_file}, outside /usr")
  endif()
endforeach()
set(_patterns
    "usr/include/lamp/lamp.h" "usr/include/lamp/version.h" "usr/lib*/liblamp.*"
    "usr/lib*/cmake/lamp/lampConfig.cmake" "usr/lib*/cmake/lamp/lampTargets.cmake"
    "usr/lib*/pkgconfig/lamp.pc" "usr/share/doc/*/LICENSE" "usr/share/doc/*/README.md")
foreach(_program IN LISTS TOOLS)
  list(APPEND _patterns "usr/bin/${_program}")
endforeach()
foreach(_pattern IN LISTS _patterns)
  file(GLOB_RECURSE _found "${_root}/${_pattern}")
  if(NOT _found)
    list(APPEND _problems "the packages have no ${_pattern}")
  endif()
endforeach()
# The unpacked programs run (their libraries are the system's, as the
# package's dependencies promise) and say lamp's version.
foreach(_program IN LISTS TOOLS)
  execute_process(COMMAND "${_root}/usr/bin/${_program}" --version
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0 OR NOT _out MATCHES "lamp ${VERSION}")
    list(APPEND _problems "usr/bin/${_program} --version: exit ${_rc}, '${_out}', expected lamp ${VERSION}")
  endif()
endforeach()
if(_problems)
  list(JOIN _problems "\n  " _problems)
  message(FATAL_ERROR "${_names}:\n  ${_problems}")
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
message(STATUS "${_names}: liblamp-dev Depends: ${_dev_depends}; lamp-tools Depends: ${_tools_depends}\n${lamp_step_output}")
