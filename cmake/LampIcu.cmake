# Whether lamp splits text as GPT-2 does (lamp::data::BytePairEncoding's
# encode(), train_gpt --tokenizer with GPT-2's tokenizer files) with ICU's
# character classes: Debian's libicu-dev, found by CMake's FindICU.
#
#   LAMP_WITH_ICU  AUTO (default): where ICU is found; ON: fail at configure
#                  time without it; OFF: never (encode() then throws, naming
#                  the package to install; decoding needs no ICU)
#
# Sets LAMP_ICU_FOUND (ON when lamp links ICU's common library, ICU::uc,
# privately). The installed lampConfig.cmake finds it again for the
# consumer, and lamp.pc lists -licuuc (a static lamp brings its
# dependencies to every program).
include(${CMAKE_CURRENT_LIST_DIR}/LampAutoOption.cmake)
lamp_auto_option(LAMP_WITH_ICU
                 "Split text as GPT-2 does with ICU's character classes: AUTO (where ICU is found), ON or OFF")

function(lamp_find_icu)
  lamp_auto_option_mode(LAMP_WITH_ICU "use ICU where libicu-dev is found" _mode)
  set(LAMP_ICU_FOUND OFF PARENT_SCOPE)
  if(_mode STREQUAL "OFF")
    message(STATUS "lamp: GPT-2's text split (ICU): off (LAMP_WITH_ICU=OFF)")
    return()
  endif()
  find_package(ICU QUIET COMPONENTS uc)
  if(NOT ICU_FOUND)
    if(_mode STREQUAL "ON")
      message(FATAL_ERROR
        "lamp: LAMP_WITH_ICU=ON but ICU was not found. Install it (apt-get "
        "install libicu-dev), or pass -DLAMP_WITH_ICU=AUTO or OFF to build "
        "without GPT-2's text split.")
    endif()
    message(STATUS "lamp: GPT-2's text split (ICU): off, ICU was not found; "
                   "install libicu-dev for train_gpt --tokenizer with GPT-2's "
                   "tokenizer files")
    return()
  endif()
  message(STATUS "lamp: GPT-2's text split (ICU): on, ICU ${ICU_VERSION}")
  set(LAMP_ICU_FOUND ON PARENT_SCOPE)
endfunction()
