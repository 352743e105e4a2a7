# Whether lamp builds c10d's Gloo backend (multi-process training on the CPU).
# c10d's ProcessGroupGloo.hpp includes Gloo's own headers (gloo/*.h): Debian's
# LibTorch uses those of libgloo-dev, PyPI's torch wheel ships none.
#
#   LAMP_WITH_GLOO         AUTO (default): build Gloo where its headers are
#                          found; ON: fail at configure time without them;
#                          OFF: never (NCCL only)
#   LAMP_GLOO_INCLUDE_DIR  a folder holding gloo/ to use when the LibTorch has
#                          none (found in the system paths by default)
#
# Sets LAMP_GLOO_FOUND (ON when Gloo is built) and, when it is,
# LAMP_GLOO_INCLUDE_DIR_USED (the folder holding gloo/).
include(${CMAKE_CURRENT_LIST_DIR}/LampAutoOption.cmake)
lamp_auto_option(LAMP_WITH_GLOO
                 "Build lamp's Gloo backend: AUTO (where gloo/*.h is found), ON or OFF")

function(lamp_find_gloo)
  # The Gloo headers c10d's ProcessGroupGloo.hpp includes.
  set(_headers gloo/algorithm.h gloo/common/error.h gloo/context.h
               gloo/rendezvous/store.h gloo/transport/device.h)
  lamp_auto_option_mode(LAMP_WITH_GLOO "build Gloo where its headers are found" _mode)
  set(LAMP_GLOO_FOUND OFF PARENT_SCOPE)
  set(LAMP_GLOO_INCLUDE_DIR_USED "" PARENT_SCOPE)
  if(_mode STREQUAL "OFF")
    message(STATUS "lamp: Gloo backend: off (LAMP_WITH_GLOO=OFF); "
                   "multi-process runs need NCCL (CUDA)")
    return()
  endif()

  # The LibTorch's own include folders first: their Gloo is the one it was
  # built with. Then LAMP_GLOO_INCLUDE_DIR, or the system's.
  set(_dir "")
  foreach(_candidate IN LISTS TORCH_INCLUDE_DIRS)
    if(NOT _dir AND EXISTS "${_candidate}/gloo/algorithm.h")
      set(_dir "${_candidate}")
      set(_from "the LibTorch's include folders")
    endif()
  endforeach()
  if(NOT _dir)
    find_path(LAMP_GLOO_INCLUDE_DIR gloo/algorithm.h
              DOC "Folder holding Gloo's headers (gloo/*.h) for lamp's Gloo backend")
    if(LAMP_GLOO_INCLUDE_DIR)
      set(_dir "${LAMP_GLOO_INCLUDE_DIR}")
      set(_from "outside the LibTorch")
    endif()
  endif()
  set(_missing "")
  foreach(_header IN LISTS _headers)
    if(NOT _dir OR NOT EXISTS "${_dir}/${_header}")
      list(APPEND _missing "${_header}")
    endif()
  endforeach()

  if(_missing)
    list(JOIN _missing ", " _missing)
    if(_dir)
      set(_where "${_dir} lacks ${_missing}")
    else()
      list(JOIN TORCH_INCLUDE_DIRS ", " _torch_dirs)
      set(_where "no gloo/algorithm.h in the LibTorch's include folders (${_torch_dirs}) nor in the system's")
    endif()
    if(_mode STREQUAL "ON")
      message(FATAL_ERROR
        "lamp: LAMP_WITH_GLOO=ON but Gloo's headers were not found: ${_where}. "
        "Install them (apt-get install libgloo-dev), point "
        "-DLAMP_GLOO_INCLUDE_DIR=<folder holding gloo/> at a copy of the Gloo "
        "this LibTorch was built with, or pass -DLAMP_WITH_GLOO=AUTO or OFF to "
        "build without Gloo (NCCL only).")
    endif()
    message(STATUS "lamp: Gloo backend: off, its headers were not found (${_where}); "
                   "multi-process runs need NCCL (CUDA). Install libgloo-dev "
                   "for multi-process CPU runs.")
    return()
  endif()

  set(_version "")
  if(EXISTS "${_dir}/gloo/config.h")
    lamp_version_from_header("${_dir}/gloo/config.h" GLOO_VERSION _version)  # LampTorchInfo.cmake
  endif()
  if(_version)
    set(_version " ${_version}")
  endif()
  lamp_debian_package("${_dir}/gloo/algorithm.h" _package)  # LampTorchInfo.cmake
  if(_package)
    set(_from "${_from}, Debian package ${_package}")
  endif()
  message(STATUS "lamp: Gloo backend: on, headers${_version} from ${_dir} (${_from})")
  if(_from STREQUAL "outside the LibTorch")
    message(WARNING
      "lamp: Gloo's headers come from ${_dir}, not from the LibTorch at "
      "${TORCH_INSTALL_PREFIX}, which ships none: their version may differ "
      "from the Gloo that LibTorch was built with, and lamp's Gloo backend "
      "compiled against them may misbehave. Point -DLAMP_GLOO_INCLUDE_DIR at "
      "the Gloo sources of this LibTorch's version, or pass "
      "-DLAMP_WITH_GLOO=OFF to build without Gloo (NCCL only).")
  endif()
  set(LAMP_GLOO_FOUND ON PARENT_SCOPE)
  set(LAMP_GLOO_INCLUDE_DIR_USED "${_dir}" PARENT_SCOPE)
endfunction()
