# Whether lamp's text readers (read_text_bytes(), write_token_files(),
# train_gpt --data, prepare_tokens) read zstd-compressed files (The Pile's
# and SlimPajama's .jsonl.zst) with libzstd: Debian's libzstd-dev, found
# with pkg-config. gzip files are read with zlib, which lamp always links.
#
#   LAMP_WITH_ZSTD  AUTO (default): where libzstd is found; ON: fail at
#                   configure time without it; OFF: never (a zstd file is
#                   then refused, naming the package to install)
#
# Sets LAMP_ZSTD_FOUND (ON when lamp links libzstd privately, by its name,
# so that a static lamp's consumers link -lzstd from the system's library
# folder), LAMP_ZSTD_VERSION and LAMP_ZSTD_INCLUDE_DIRS.
include(${CMAKE_CURRENT_LIST_DIR}/LampAutoOption.cmake)
lamp_auto_option(LAMP_WITH_ZSTD
                 "Read zstd-compressed text with libzstd: AUTO (where libzstd is found), ON or OFF")

function(lamp_find_zstd)
  lamp_auto_option_mode(LAMP_WITH_ZSTD "read zstd files where libzstd-dev is found" _mode)
  set(LAMP_ZSTD_FOUND OFF PARENT_SCOPE)
  set(LAMP_ZSTD_VERSION "" PARENT_SCOPE)
  set(LAMP_ZSTD_INCLUDE_DIRS "" PARENT_SCOPE)
  if(_mode STREQUAL "OFF")
    message(STATUS "lamp: zstd-compressed text: off (LAMP_WITH_ZSTD=OFF)")
    return()
  endif()
  find_package(PkgConfig QUIET)
  set(lamp_zstd_FOUND OFF)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(lamp_zstd QUIET libzstd)
  endif()
  if(NOT lamp_zstd_FOUND)
    if(NOT PKG_CONFIG_FOUND)
      set(_where "pkg-config was not found")
    else()
      set(_where "pkg-config knows no module 'libzstd'")
    endif()
    if(_mode STREQUAL "ON")
      message(FATAL_ERROR
        "lamp: LAMP_WITH_ZSTD=ON but libzstd was not found (${_where}). "
        "Install it (apt-get install libzstd-dev pkg-config), or pass "
        "-DLAMP_WITH_ZSTD=AUTO or OFF to build without zstd.")
    endif()
    message(STATUS "lamp: zstd-compressed text: off, libzstd was not found "
                   "(${_where}); install libzstd-dev for .zst corpora")
    return()
  endif()
  message(STATUS "lamp: zstd-compressed text: on, libzstd ${lamp_zstd_VERSION}")
  set(LAMP_ZSTD_FOUND ON PARENT_SCOPE)
  set(LAMP_ZSTD_VERSION "${lamp_zstd_VERSION}" PARENT_SCOPE)
  set(LAMP_ZSTD_INCLUDE_DIRS "${lamp_zstd_INCLUDE_DIRS}" PARENT_SCOPE)
endfunction()
