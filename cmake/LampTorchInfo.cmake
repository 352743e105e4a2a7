# Facts about the LibTorch that find_package(Torch) found, for the rest of the build:
#   LAMP_TORCH_VERSION  e.g. 1.13.0 or 2.11.0
#   LAMP_WITH_CUDA      ON when that LibTorch was built with CUDA
function(lamp_torch_info)
  set(_version "")
  foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
    foreach(_candidate "${_dir}/torch/headeronly/version.h" "${_dir}/torch/version.h")
      if(NOT _version AND EXISTS "${_candidate}")
        file(STRINGS "${_candidate}" _lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
        if(_lines)
          string(REGEX REPLACE ".*MAJOR ([0-9]+).*" "\\1" _major "${_lines}")
          string(REGEX REPLACE ".*MINOR ([0-9]+).*" "\\1" _minor "${_lines}")
          string(REGEX REPLACE ".*PATCH ([0-9]+).*" "\\1" _patch "${_lines}")
          set(_version "${_major}.${_minor}.${_patch}")
        endif()
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
  set(LAMP_TORCH_VERSION "${_version}" PARENT_SCOPE)
  set(LAMP_WITH_CUDA ${_cuda} PARENT_SCOPE)
  message(STATUS "lamp: LibTorch ${_version} at ${TORCH_INSTALL_PREFIX}, CUDA: ${_cuda}")
endfunction()
