# Whether lamp builds its SentencePiece tokenizer (lamp::data::SentencePiece,
# train_gpt --tokenizer and --train-tokenizer) on the SentencePiece library:
# Debian's libsentencepiece-dev (0.1.97 in Debian 12), found with pkg-config.
#
#   LAMP_WITH_SENTENCEPIECE  AUTO (default): build it where the library is
#                            found; ON: fail at configure time without it;
#                            OFF: never (the tokenizer's functions then
#                            throw, naming the package to install)
#
# Sets LAMP_SENTENCEPIECE_FOUND (ON when it is built), LAMP_SENTENCEPIECE_VERSION
# and LAMP_SENTENCEPIECE_LDFLAGS (its -l flags, for lamp.pc), and with it
# pkg-config's imported target PkgConfig::lamp_sentencepiece, which lamp links
# privately. The installed lampConfig.cmake defines the same target for the
# consumer (a static lamp brings its dependencies to every program).
include(${CMAKE_CURRENT_LIST_DIR}/LampAutoOption.cmake)
lamp_auto_option(LAMP_WITH_SENTENCEPIECE
                 "Build lamp's SentencePiece tokenizer: AUTO (where libsentencepiece is found), ON or OFF")

function(lamp_find_sentencepiece)
  lamp_auto_option_mode(LAMP_WITH_SENTENCEPIECE
                        "build the tokenizer where libsentencepiece-dev is found" _mode)
  set(LAMP_SENTENCEPIECE_FOUND OFF PARENT_SCOPE)
  set(LAMP_SENTENCEPIECE_VERSION "" PARENT_SCOPE)
  set(LAMP_SENTENCEPIECE_LDFLAGS "" PARENT_SCOPE)
  if(_mode STREQUAL "OFF")
    message(STATUS "lamp: SentencePiece tokenizer: off (LAMP_WITH_SENTENCEPIECE=OFF)")
    return()
  endif()
  find_package(PkgConfig QUIET)
  set(lamp_sentencepiece_FOUND OFF)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(lamp_sentencepiece QUIET IMPORTED_TARGET GLOBAL sentencepiece)
  endif()
  if(NOT lamp_sentencepiece_FOUND)
    if(NOT PKG_CONFIG_FOUND)
      set(_where "pkg-config was not found")
    else()
      set(_where "pkg-config knows no module 'sentencepiece'")
    endif()
    if(_mode STREQUAL "ON")
      message(FATAL_ERROR
        "lamp: LAMP_WITH_SENTENCEPIECE=ON but SentencePiece was not found "
        "(${_where}). Install it (apt-get install libsentencepiece-dev "
        "pkg-config), or pass -DLAMP_WITH_SENTENCEPIECE=AUTO or OFF to build "
        "without the tokenizer.")
    endif()
    message(STATUS "lamp: SentencePiece tokenizer: off, the library was not "
                   "found (${_where}); install libsentencepiece-dev for "
                   "train_gpt --tokenizer")
    return()
  endif()
  message(STATUS "lamp: SentencePiece tokenizer: on, SentencePiece "
                 "${lamp_sentencepiece_VERSION} (${lamp_sentencepiece_LINK_LIBRARIES})")
  set(LAMP_SENTENCEPIECE_FOUND ON PARENT_SCOPE)
  set(LAMP_SENTENCEPIECE_VERSION "${lamp_sentencepiece_VERSION}" PARENT_SCOPE)
  set(LAMP_SENTENCEPIECE_LDFLAGS "${lamp_sentencepiece_LDFLAGS}" PARENT_SCOPE)
endfunction()
