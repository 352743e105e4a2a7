# lamp.pc (cmake/lamp.pc.in) for pkg-config, installed to <libdir>/pkgconfig.
# Its LibTorch flags come from the LibTorch find_package(Torch) found: the
# include folders of TORCH_INCLUDE_DIRS, TORCH_CXX_FLAGS, and -l for each
# LibTorch library target lamp links (torch, torch_cpu, c10, and torch_cuda,
# c10_cuda and the CUDA runtime for a CUDA build), linked as TorchConfig's
# torch_library does: --no-as-needed, so that libtorch_cuda's kernels register
# even though no symbol of it is used.

# The path of <path> below <base> as "${<var>}/<rest>", or <path> itself.
function(_lamp_pc_path path base var out)
  get_filename_component(_real "${path}" REALPATH)
  get_filename_component(_base "${base}" REALPATH)
  if(_real STREQUAL _base)
    set(${out} "\${${var}}" PARENT_SCOPE)
    return()
  endif()
  string(FIND "${_real}/" "${_base}/" _at)
  if(_at EQUAL 0)
    file(RELATIVE_PATH _rel "${_base}" "${_real}")
    set(${out} "\${${var}}/${_rel}" PARENT_SCOPE)
  else()
    set(${out} "${_real}" PARENT_SCOPE)
  endif()
endfunction()

function(lamp_write_pkg_config out_file)
  # lamp's own folders, relative to ${pcfiledir} (<libdir>/pkgconfig) when the
  # install folders are relative, as GNUInstallDirs makes them by default.
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(LAMP_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
    set(LAMP_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
    set(LAMP_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
  else()
    set(_up "")
    string(REPLACE "/" ";" _parts "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
    foreach(_part IN LISTS _parts)
      if(NOT _part STREQUAL "" AND NOT _part STREQUAL ".")
        string(APPEND _up "/..")
      endif()
    endforeach()
    set(LAMP_PC_PREFIX "\${pcfiledir}${_up}")
    set(LAMP_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
    set(LAMP_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  endif()

  get_filename_component(LAMP_PC_TORCH_PREFIX "${TORCH_INSTALL_PREFIX}" REALPATH)
  get_filename_component(_torch_libdir "${TORCH_LIBRARY}" DIRECTORY)
  _lamp_pc_path("${_torch_libdir}" "${LAMP_PC_TORCH_PREFIX}" torch_prefix LAMP_PC_TORCH_LIBDIR)

  set(_cflags "")
  foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
    _lamp_pc_path("${_dir}" "${LAMP_PC_TORCH_PREFIX}" torch_prefix _flag)
    list(APPEND _cflags "-I${_flag}")
  endforeach()
  separate_arguments(_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  list(APPEND _cflags ${_torch_cxx_flags})
  # The C++ standard the LibTorch's headers demand (LibTorch 2.15's ATen.h
  # refuses anything below C++20; its target says cxx_std_20), when it is
  # above lamp's own C++17: CMake consumers get it from the target, pkg-config
  # ones from here.
  get_target_property(_torch_features torch INTERFACE_COMPILE_FEATURES)
  set(_std 17)
  foreach(_feature IN LISTS _torch_features)
    if(_feature MATCHES "^cxx_std_([0-9]+)$" AND CMAKE_MATCH_1 GREATER _std)
      set(_std "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if(_std GREATER 17)
    list(APPEND _cflags "-std=c++${_std}")
  endif()
  list(REMOVE_DUPLICATES _cflags)

  # Kept in the program even where no symbol of theirs is used, as
  # torch_library does; then the libraries lamp's code calls.
  set(_kept "")
  foreach(_name torch torch_cpu torch_cuda)
    if(TARGET ${_name})
      list(APPEND _kept "-l${_name}")
    endif()
  endforeach()
  set(_called "")
  foreach(_name c10 c10_cuda)
    if(TARGET ${_name})
      list(APPEND _called "-l${_name}")
    endif()
  endforeach()
  set(_libs "-L\${torch_libdir}")
  # A LibTorch outside the linker's own folders (a torch wheel) is found at run
  # time through the program's RUNPATH, as CMake's build tree does.
  get_filename_component(_torch_libdir_real "${_torch_libdir}" REALPATH)
  set(_system_dirs "")
  foreach(_dir IN LISTS CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
    get_filename_component(_dir "${_dir}" REALPATH)
    list(APPEND _system_dirs "${_dir}")
  endforeach()
  if(NOT _torch_libdir_real IN_LIST _system_dirs)
    list(APPEND _libs "-Wl,-rpath,\${torch_libdir}")
  endif()
  # A torch wheel's CUDA libraries before any -rpath folder at link time
  # (LampTorchLinkDirs.cmake), written below ${torch_prefix}.
  lamp_torch_rpath_link_options(_rpath_link)
  foreach(_option IN LISTS _rpath_link)
    string(REGEX REPLACE "^LINKER:-rpath-link," "" _dir "${_option}")
    get_filename_component(_parent "${_dir}" DIRECTORY)
    get_filename_component(_name "${_parent}" NAME)
    list(APPEND _libs "-Wl,-rpath-link,\${torch_prefix}/../nvidia/${_name}/lib")
  endforeach()
  list(APPEND _libs "-Wl,--no-as-needed" ${_kept} "-Wl,--as-needed" ${_called})

  # lamp's CUDA sources call the CUDA runtime (a torch wheel's CUDA build).
  set(LAMP_PC_CUDA_COMMENT "")
  set(LAMP_PC_CUDA_LIBDIR_LINE "")
  if(LAMP_WITH_CUDA AND TARGET CUDA::cudart)
    get_target_property(_cudart CUDA::cudart IMPORTED_LOCATION)
    if(_cudart)
      get_filename_component(_cuda_libdir "${_cudart}" DIRECTORY)
      set(LAMP_PC_CUDA_LIBDIR_LINE "cuda_libdir=${_cuda_libdir}\n")
      string(CONCAT LAMP_PC_CUDA_COMMENT
        "\n# This LibTorch was built with CUDA: cuda_libdir is the CUDA runtime's"
        "\n# folder on the machine that built lamp (--define-variable to move it).")
      list(APPEND _libs "-L\${cuda_libdir}")
      get_filename_component(_cuda_libdir_real "${_cuda_libdir}" REALPATH)
      if(NOT _cuda_libdir_real IN_LIST _system_dirs)
        list(APPEND _libs "-Wl,-rpath,\${cuda_libdir}")
      endif()
      list(APPEND _libs "-lcudart")
    endif()
  endif()

  # A static lamp brings its own dependencies (zlib, ICU's common library
  # and libzstd where it was built with them) to every program.
  set(_private "-lz")
  if(LAMP_ICU_FOUND)
    list(APPEND _private "-licuuc")
  endif()
  if(LAMP_ZSTD_FOUND)
    list(APPEND _private "-lzstd")
  endif()
  get_target_property(_type lamp TYPE)
  if(_type STREQUAL "STATIC_LIBRARY")
    list(APPEND _libs ${_private})
    set(LAMP_PC_LIBS_PRIVATE_LINE "")
  else()
    list(JOIN _private " " _private)
    set(LAMP_PC_LIBS_PRIVATE_LINE "Libs.private: ${_private}\n")
  endif()

  list(JOIN _cflags " " LAMP_PC_CFLAGS)
  list(JOIN _libs " " LAMP_PC_LIBS)
  configure_file("${PROJECT_SOURCE_DIR}/cmake/lamp.pc.in" "${out_file}" @ONLY)
endfunction()
