# packaging.no_build_paths: installs lamp into a scratch prefix and reads the
# exported targets (lampTargets*.cmake), lampConfig.cmake and lamp.pc.
#  - lampTargets*.cmake: no absolute path at all (lamp's files are relative
#    to the file, LibTorch is named by its imported targets);
#  - lamp.pc: absolute paths only in the variables it documents as the
#    LibTorch's and CUDA's folders (torch_prefix, cuda_libdir), the rest built
#    from ${pcfiledir} and those variables; torch_prefix is the LibTorch's;
#  - none of them names the source tree, the build tree or the install prefix.
#
#   cmake -DLAMP_SOURCE_DIR=<src> -DLAMP_BINARY_DIR=<build> -DWORK_DIR=<scratch>
#         -DTORCH_PREFIX=<LibTorch's folder, real path> -P no_build_paths.cmake

cmake_minimum_required(VERSION 3.18)
include("${CMAKE_CURRENT_LIST_DIR}/common.cmake")

set(_prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
lamp_install_into("${_prefix}")

file(GLOB_RECURSE _targets "${_prefix}/*/lampTargets*.cmake")
file(GLOB_RECURSE _configs "${_prefix}/*/lampConfig.cmake")
file(GLOB_RECURSE _pcs "${_prefix}/*/pkgconfig/lamp.pc")
if(NOT _targets OR NOT _configs OR NOT _pcs)
  message(FATAL_ERROR "the install into ${_prefix} lacks lampTargets*.cmake, "
                      "lampConfig.cmake or pkgconfig/lamp.pc")
endif()

set(_problems "")
get_filename_component(_source_real "${LAMP_SOURCE_DIR}" REALPATH)
get_filename_component(_binary_real "${LAMP_BINARY_DIR}" REALPATH)
set(_forbidden "${LAMP_SOURCE_DIR}" "${_source_real}" "${LAMP_BINARY_DIR}"
               "${_binary_real}" "${_prefix}")
list(REMOVE_DUPLICATES _forbidden)

foreach(_file IN LISTS _targets _configs _pcs)
  file(READ "${_file}" _text)
  foreach(_path IN LISTS _forbidden)
    string(FIND "${_text}" "${_path}" _at)
    if(NOT _at EQUAL -1)
      list(APPEND _problems "${_file} names ${_path}")
    endif()
  endforeach()
endforeach()

# An absolute path: '/' and a character, at the start of a value or after a
# quote, ';', ',', '=', a space or -I/-L.
set(_absolute "(^|[\";,= ]|-[IL])(/[^\";, ]+)")
# Records an absolute path in `line` of `file` as a problem.
# (A function: a macro would expand the ${...} that the line holds.)
function(_lamp_check_line file line)
  if(line MATCHES "${_absolute}")
    list(APPEND _problems "${file}: absolute path ${CMAKE_MATCH_2} in: ${line}")
    set(_problems "${_problems}" PARENT_SCOPE)
  endif()
endfunction()

foreach(_file IN LISTS _targets)
  file(STRINGS "${_file}" _lines)
  foreach(_line IN LISTS _lines)
    if(_line MATCHES "^[ \t]*#")
      continue()
    endif()
    _lamp_check_line("${_file}" "${_line}")
  endforeach()
endforeach()

foreach(_file IN LISTS _pcs)
  file(STRINGS "${_file}" _lines)
  set(_torch_prefix "")
  foreach(_line IN LISTS _lines)
    if(_line MATCHES "^[ \t]*#" OR _line MATCHES "^cuda_libdir=")
      continue()
    endif()
    if(_line MATCHES "^torch_prefix=(.*)$")
      set(_torch_prefix "${CMAKE_MATCH_1}")
      continue()
    endif()
    _lamp_check_line("${_file}" "${_line}")
  endforeach()
  if(NOT _torch_prefix STREQUAL TORCH_PREFIX)
    list(APPEND _problems
      "${_file}: torch_prefix is '${_torch_prefix}', expected the LibTorch's folder ${TORCH_PREFIX}")
  endif()
endforeach()

if(_problems)
  list(JOIN _problems "\n  " _problems)
  message(FATAL_ERROR "installed files name paths of this machine:\n  ${_problems}")
endif()
list(LENGTH _targets _n)
message(STATUS "no build machine paths in ${_n} lampTargets*.cmake, lampConfig.cmake's "
               "targets and lamp.pc (torch_prefix=${TORCH_PREFIX})")
