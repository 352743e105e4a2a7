# lamp's options for an optional dependency (LAMP_WITH_GLOO,
# LAMP_WITH_SENTENCEPIECE, LAMP_WITH_ICU): AUTO (where it is found), ON
# (fail at configure time without it) or OFF.
include_guard(GLOBAL)

# lamp_auto_option(OPTION DOC): the cache variable OPTION, AUTO by default;
# a plain variable of the project that includes lamp (set(OPTION OFF)
# before FetchContent_MakeAvailable) decides instead, from the first
# configure on (with policy CMP0126 OLD, creating the cache entry would drop
# it that once).
macro(lamp_auto_option option doc)
  if(NOT DEFINED ${option} OR DEFINED CACHE{${option}})
    set(${option} AUTO CACHE STRING "${doc}")
    set_property(CACHE ${option} PROPERTY STRINGS AUTO ON OFF)
  endif()
endmacro()

# lamp_auto_option_mode(OPTION AUTO_MEANS OUT): OPTION's value upper-cased
# into OUT (AUTO, ON or OFF, written in any case); any other value stops
# the configure, saying what AUTO means (AUTO_MEANS).
function(lamp_auto_option_mode option auto_means out)
  string(TOUPPER "${${option}}" _mode)
  if(NOT _mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR
      "lamp: ${option}='${${option}}' is not AUTO, ON or OFF. Pass "
      "-D${option}=AUTO (${auto_means}), ON or OFF.")
  endif()
  set(${out} "${_mode}" PARENT_SCOPE)
endfunction()
