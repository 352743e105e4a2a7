#pragma once

// The checks lamp::ops' fused operations share at their boundary.

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <initializer_list>
#include <utility>

namespace lamp {
namespace detail {

/// Each defined tensor of `named` ({name, tensor}) must be floating point
/// and on x's device; the error begins with `who` and names the tensor.
/// Undefined tensors (absent biases) are skipped.
inline void check_floating_on_device(
    const char* who, const torch::Tensor& x,
    std::initializer_list<std::pair<const char*, torch::Tensor>> named) {
  for (const auto& [name, t] : named) {
    if (!t.defined()) {
      continue;
    }
    TORCH_CHECK(t.is_floating_point(), who, ": ", name,
                " must be floating point, got ", t.scalar_type(), ".");
    TORCH_CHECK(t.device() == x.device(), who, ": ", name, " (", t.device(),
                ") must be on x's device (", x.device(), ").");
  }
}

} // namespace detail
} // namespace lamp
