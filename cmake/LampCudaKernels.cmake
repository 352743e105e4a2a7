# lamp's own CUDA kernels (src/ops/*.cu) and cuBLASLt calls: built where LibTorch has CUDA and a
# CUDA compiler is found, unless LAMP_CUDA_KERNELS is OFF. Without them the
# ops that have kernels run their ATen ops (and say why,
# lamp::ops::add_norm_path).
#
# Included at file scope (enable_language must be), after the target `lamp`
# exists: adds the kernels' sources to it and sets LAMP_CUDA_KERNELS_BUILT.
#
# The architectures: CMAKE_CUDA_ARCHITECTURES where given, else
# TORCH_CUDA_ARCH_LIST's (a CMake variable or the environment's, as
# PyTorch's extensions read it: "8.0;9.0", "9.0+PTX", "8.6 9.0a"), else
# Ampere and Hopper (80;90, each with its PTX, which later GPUs compile at
# load). LibTorch's CMake config appends the architectures it was told or
# guessed to CMAKE_CUDA_FLAGS (with no GPU present, a list reaching back to
# compute_50, which CUDA 13 refuses): those are dropped here, in lamp's
# folder, so that the one list above decides.

# "8.0;9.0+PTX" or "8.6 9.0a" -> "80;90" or "86;90a" in <out>.
function(lamp_cuda_arch_list_to_cmake list out)
  string(REPLACE " " ";" _items "${list}")
  set(_archs "")
  foreach(_item IN LISTS _items)
    if(_item STREQUAL "")
      continue()
    endif()
    string(REPLACE "+PTX" "" _arch "${_item}")
    string(REPLACE "." "" _arch "${_arch}")
    list(APPEND _archs "${_arch}")
  endforeach()
  set(${out} "${_archs}" PARENT_SCOPE)
endfunction()

set(LAMP_CUDA_KERNELS_BUILT OFF)
if(LAMP_WITH_CUDA AND LAMP_CUDA_KERNELS)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(LAMP_GIVEN_CUDA_ARCHITECTURES)
      set(_lamp_archs "${LAMP_GIVEN_CUDA_ARCHITECTURES}")
    else()
      set(_lamp_arch_list "${TORCH_CUDA_ARCH_LIST}")
      if(_lamp_arch_list STREQUAL "" AND DEFINED ENV{TORCH_CUDA_ARCH_LIST})
        set(_lamp_arch_list "$ENV{TORCH_CUDA_ARCH_LIST}")
      endif()
      if(_lamp_arch_list STREQUAL "")
        set(_lamp_archs 80 90)
      else()
        lamp_cuda_arch_list_to_cmake("${_lamp_arch_list}" _lamp_archs)
      endif()
    endif()
    enable_language(CUDA)
    string(REGEX REPLACE "-gencode[= ]+arch=[^ ]+" "" CMAKE_CUDA_FLAGS
           "${CMAKE_CUDA_FLAGS}")
    target_sources(lamp PRIVATE src/nn/float8_cast_cuda.cpp
                                src/nn/float8_cast_kernels.cu
                                src/nn/float8_scale_cuda.cpp
                                src/nn/float8_scale_kernels.cu
                                src/ops/add_norm_cuda.cpp
                                src/ops/add_norm_kernels.cu
                                src/ops/channel_affine_cuda.cpp
                                src/ops/channel_affine_kernels.cu
                                src/ops/cublaslt.cpp
                                src/ops/gelu_mlp_cuda.cpp
                                src/ops/linear_bgrad_cuda.cpp)
    # The epilogues of gelu_mlp and linear_bgrad call the cuBLASLt LibTorch
    # loaded, found with dlopen (src/ops/cublaslt.cpp): nothing of cuBLAS is
    # linked.
    target_link_libraries(lamp PRIVATE ${CMAKE_DL_LIBS})
    # The kernels include no LibTorch header: no precompiled <torch/torch.h>.
    set_source_files_properties(src/nn/float8_cast_kernels.cu
                                src/nn/float8_scale_kernels.cu
                                src/ops/add_norm_kernels.cu
                                src/ops/channel_affine_kernels.cu PROPERTIES
                                SKIP_PRECOMPILE_HEADERS ON)
    # The CUDA runtime LibTorch loads, not a static copy of it beside.
    set_target_properties(lamp PROPERTIES CUDA_STANDARD 17
                          CUDA_STANDARD_REQUIRED ON CUDA_RUNTIME_LIBRARY Shared
                          CUDA_ARCHITECTURES "${_lamp_archs}")
    set(LAMP_CUDA_KERNELS_BUILT ON)
    message(STATUS "lamp: CUDA kernels built for architectures "
                   "${_lamp_archs} (${CMAKE_CUDA_COMPILER})")
  else()
    message(STATUS "lamp: no CUDA compiler found; lamp's CUDA kernels are not "
                   "built (their ops run ATen ops)")
  endif()
endif()
