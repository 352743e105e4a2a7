# Facts about the LibTorch that find_package(Torch) found, for the rest of the build:
#   LAMP_TORCH_VERSION  e.g. 1.13.0 or 2.11.0, as its headers say (TORCH_VERSION)
#   LAMP_TORCH_PACKAGE  the Debian package holding it and that package's version,
#                       e.g. "libtorch-dev 1.13.1+dfsg-4"; empty when it is not
#                       a Debian package's. Debian's libtorch-dev 1.13.1 has
#                       headers that say 1.13.0.
#   LAMP_TORCH_REALPATH its install prefix with symbolic links resolved
#   LAMP_WITH_CUDA      ON when that LibTorch was built with CUDA
# lamp_version_from_header(<header> <PREFIX> <out>): "MAJOR.MINOR.PATCH" from
# the header's #define <PREFIX>_MAJOR/_MINOR/_PATCH, or "" when it has none.
function(lamp_version_from_header header prefix out)
  set(_version "")
  file(STRINGS "${header}" _lines REGEX "#define ${prefix}_(MAJOR|MINOR|PATCH) ")
  if(_lines)
    string(REGEX REPLACE ".*MAJOR ([0-9]+).*" "\\1" _major "${_lines}")
    string(REGEX REPLACE ".*MINOR ([0-9]+).*" "\\1" _minor "${_lines}")
    string(REGEX REPLACE ".*PATCH ([0-9]+).*" "\\1" _patch "${_lines}")
    set(_version "${_major}.${_minor}.${_patch}")
  endif()
  set(${out} "${_version}" PARENT_SCOPE)
endfunction()

# lamp_debian_package(<file> <out>): "<package> <version>" of the Debian
# package that installed <file>, or "" (not Debian's, or no dpkg-query).
function(lamp_debian_package file out)
  set(_package "")
  find_program(LAMP_DPKG_QUERY dpkg-query)
  mark_as_advanced(LAMP_DPKG_QUERY)
  if(LAMP_DPKG_QUERY AND EXISTS "${file}")
    get_filename_component(_real "${file}" REALPATH)
    execute_process(COMMAND "${LAMP_DPKG_QUERY}" -S "${_real}"
                    OUTPUT_VARIABLE _owner ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND _owner MATCHES "^([^:, ]+)(:[^:, ]+)?: ")
      set(_name "${CMAKE_MATCH_1}")
      execute_process(COMMAND "${LAMP_DPKG_QUERY}" -W "-f=\${Version}" "${_name}"
                      OUTPUT_VARIABLE _version ERROR_QUIET RESULT_VARIABLE _rc)
      if(_rc EQUAL 0 AND NOT _version STREQUAL "")
        set(_package "${_name} ${_version}")
      endif()
    endif()
  endif()
  set(${out} "${_package}" PARENT_SCOPE)
endfunction()

function(lamp_torch_info)
  set(_version "")
  foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
    foreach(_candidate "${_dir}/torch/headeronly/version.h" "${_dir}/torch/version.h")
      if(NOT _version AND EXISTS "${_candidate}")
        lamp_version_from_header("${_candidate}" TORCH_VERSION _version)
      endif()
    endforeach()
  endforeach()
  if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
    set(_cuda ON)
  else()
    set(_cuda OFF)
  endif()
  # TorchConfig finds c10 with find_library, which searches the system before
  # the LibTorch's own lib/ folder: with two LibTorch builds on one machine a
  # wheel's torch would silently link the system's c10.
  foreach(_lib IN LISTS TORCH_LIBRARIES)
    if(IS_ABSOLUTE "${_lib}" AND EXISTS "${_lib}")
      get_filename_component(_real_lib "${_lib}" REALPATH)
      get_filename_component(_real_prefix "${TORCH_INSTALL_PREFIX}" REALPATH)
      string(FIND "${_real_lib}" "${_real_prefix}/" _at)
      if(NOT _at EQUAL 0 AND NOT _lib MATCHES "cuda|nvrtc|nvToolsExt")
        message(FATAL_ERROR
          "lamp: the LibTorch at ${TORCH_INSTALL_PREFIX} was found, but its "
          "library ${_lib} comes from another LibTorch. Put the LibTorch's own "
          "folder first in CMAKE_PREFIX_PATH, e.g. "
          "-DCMAKE_PREFIX_PATH=\"${TORCH_INSTALL_PREFIX};${TORCH_INSTALL_PREFIX}/share/cmake\" "
          "(scripts/test.sh does this), and start from an empty build folder.")
      endif()
    endif()
  endforeach()
  get_filename_component(_realpath "${TORCH_INSTALL_PREFIX}" REALPATH)
  set(_package "")
  if(_realpath MATCHES "^/usr(/|$)")
    lamp_debian_package("${Torch_DIR}/TorchConfig.cmake" _package)
  endif()
  set(LAMP_TORCH_VERSION "${_version}" PARENT_SCOPE)
  set(LAMP_TORCH_PACKAGE "${_package}" PARENT_SCOPE)
  set(LAMP_TORCH_REALPATH "${_realpath}" PARENT_SCOPE)
  set(LAMP_WITH_CUDA ${_cuda} PARENT_SCOPE)
  if(_package)
    set(_described "${_version} (version in its headers; Debian package ${_package})")
  else()
    set(_described "${_version} (version in its headers)")
  endif()
  message(STATUS "lamp: LibTorch ${_described} at ${TORCH_INSTALL_PREFIX}, CUDA: ${_cuda}")
endfunction()

# lamp_torch_link_libraries(<out>): what lamp links for LibTorch, as imported
# targets only. TORCH_LIBRARIES mixes TorchConfig's targets (torch,
# torch_library) with absolute paths it found with find_library (libc10.so,
# libc10_cuda.so, and for a CUDA wheel the toolkit's libnvrtc.so); linked as
# they are, those paths would be written into the installed lampTargets.cmake
# and tie every consumer to this machine's files. An absolute path is replaced
# by the imported target (from Caffe2Targets.cmake) for the same file; one with
# no such target is left out, as lamp's code calls nothing in it (NVRTC is
# loaded by LibTorch itself when its JIT needs it). A consumer's
# find_package(Torch) (lampConfig.cmake) defines the same targets for its own
# LibTorch.
function(lamp_torch_link_libraries out)
  set(_targets "")
  set(_left_out "")
  foreach(_lib IN LISTS TORCH_LIBRARIES)
    if(TARGET "${_lib}")
      list(APPEND _targets "${_lib}")
      continue()
    endif()
    set(_found "")
    if(IS_ABSOLUTE "${_lib}" AND _lib MATCHES "/lib([^/]+)\\.(so|a|dylib)[^/]*$")
      set(_name "${CMAKE_MATCH_1}")
      if(TARGET "${_name}")
        set(_found "${_name}")
      endif()
    endif()
    if(_found)
      list(APPEND _targets "${_found}")
    else()
      list(APPEND _left_out "${_lib}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _targets)
  if(NOT "torch" IN_LIST _targets)
    message(FATAL_ERROR
      "lamp: the LibTorch at ${TORCH_INSTALL_PREFIX} defines no imported target "
      "'torch' (TORCH_LIBRARIES='${TORCH_LIBRARIES}'); lamp needs a LibTorch "
      "whose TorchConfig.cmake loads Caffe2Targets.cmake (LibTorch 1.13 or later).")
  endif()
  if(_left_out)
    list(JOIN _left_out ", " _left_out)
    message(STATUS "lamp: links LibTorch as ${_targets}; not linked from TORCH_LIBRARIES "
                   "(no imported target, unused by lamp): ${_left_out}")
  endif()
  set(${out} "${_targets}" PARENT_SCOPE)
endfunction()
