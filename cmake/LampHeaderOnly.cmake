# lamp_header_only_package(PACKAGE TARGET HEADER HINT_VAR DEBIAN_PACKAGE)
# Makes TARGET available: from PACKAGE's CMake config when installed, else from
# the folder in the cache variable HINT_VAR that holds HEADER (for machines
# without a package manager, where the headers are carried along).
function(lamp_header_only_package package target header hint_var debian_package)
  # A plain variable of an including project keeps its value (see
  # lamp_auto_option: CMP0126).
  if(NOT DEFINED ${hint_var} OR DEFINED CACHE{${hint_var}})
    set(${hint_var} "" CACHE PATH "${package} headers, when no ${package} package is installed")
  endif()
  find_package(${package} CONFIG QUIET)
  if(TARGET ${target})
    return()
  endif()
  find_path(_lamp_${package}_dir ${header} HINTS ${${hint_var}})
  if(NOT _lamp_${package}_dir)
    message(FATAL_ERROR
      "lamp: ${package} not found. Install it (apt-get install ${debian_package}), "
      "or point ${hint_var} at its headers.")
  endif()
  add_library(${target} INTERFACE IMPORTED GLOBAL)
  target_include_directories(${target} INTERFACE ${_lamp_${package}_dir})
endfunction()
