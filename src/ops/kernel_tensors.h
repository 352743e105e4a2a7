#pragma once

// The tensor side of lamp's CUDA kernels' plain-pointer interfaces
// (src/ops/*_kernels.h): the element types they take, their codes, and a
// tensor's pointer or null. For the *_cuda.cpp files, which include
// LibTorch; the kernels' own sources do not.

#include <torch/types.h>

#include "ops/add_norm_kernels.h" // kernels::Dtype

namespace lamp {
namespace detail {

/// Whether the kernels take `dtype`: FP32, FP16 and BF16.
inline bool kernel_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
}

/// The kernels' code for a dtype kernel_dtype() takes.
inline kernels::Dtype kernel_code(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return kernels::Dtype::kHalf;
    case at::kBFloat16:
      return kernels::Dtype::kBFloat16;
    default:
      TORCH_INTERNAL_ASSERT(dtype == at::kFloat, "lamp kernel dtype ", dtype);
      return kernels::Dtype::kFloat;
  }
}

/// The tensor's data, or null where it is undefined (a step left out).
inline const void* data_or_null(const torch::Tensor& t) {
  return t.defined() ? t.data_ptr() : nullptr;
}

} // namespace detail
} // namespace lamp
