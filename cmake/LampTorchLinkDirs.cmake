# lamp_torch_rpath_link_options(<out>): linker options that make the link
# of a program against a torch wheel's LibTorch resolve libtorch_cuda's own
# libraries (NCCL, cuDNN, cuBLAS, ...) from the wheel.
#
# A torch wheel keeps those in site-packages/nvidia/<name>/lib and
# libtorch_cuda.so finds them through its RPATH ($ORIGIN/../../nvidia/...).
# The linker, resolving libtorch_cuda's dependencies, searches the
# program's own -rpath folders before that RPATH; CUDA::cudart puts the CUDA
# toolkit's lib folder there, and a toolkit's libnccl.so.2 older than the
# wheel's leaves NCCL symbols undefined (LibTorch 2.15 with NCCL 2.30 against
# CUDA 13.0's NCCL 2.28: ncclCommGrow, ncclCommSuspend, ...). -rpath-link
# folders come first in that search and change nothing at run time, where
# libtorch_cuda's RPATH is used as before.
function(lamp_torch_rpath_link_options out)
  set(_options "")
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND TARGET torch_cuda)
    get_filename_component(_site "${TORCH_INSTALL_PREFIX}/.." REALPATH)
    file(GLOB _dirs LIST_DIRECTORIES true "${_site}/nvidia/*/lib")
    list(SORT _dirs)
    foreach(_dir IN LISTS _dirs)
      if(IS_DIRECTORY "${_dir}")
        list(APPEND _options "LINKER:-rpath-link,${_dir}")
      endif()
    endforeach()
  endif()
  set(${out} "${_options}" PARENT_SCOPE)
endfunction()
