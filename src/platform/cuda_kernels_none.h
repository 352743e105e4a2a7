#pragma once

// Why an op runs ATen ops where lamp's CUDA kernels would: for the
// *_cuda_none.cpp files, which CMakeLists.txt compiles with LAMP_WITH_CUDA
// (whether the LibTorch has CUDA) where the kernels are not built.

#include <string>

namespace lamp {
namespace detail {

inline std::string cuda_kernels_missing_reason() {
#if LAMP_WITH_CUDA
  return "this lamp was built without its CUDA kernels: no CUDA compiler was "
         "found at configure time, or LAMP_CUDA_KERNELS was OFF. Reconfigure "
         "with nvcc on PATH (or -DCMAKE_CUDA_COMPILER=<nvcc>)";
#else
  return "this lamp was built against a LibTorch without CUDA";
#endif
}

} // namespace detail
} // namespace lamp
