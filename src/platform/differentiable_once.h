#pragma once

// lamp's custom autograd Functions compute their gradients by kernels, or
// from tensors their forward saved without autograd history: first
// derivatives only. Each backward refuses a create_graph=true pass (the
// engine runs a backward with grad mode on only then) instead of returning
// higher-order gradients that would silently miss terms.

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace lamp {
namespace detail {

/// Throws, naming `who` and what to use instead (the parts of a sentence,
/// formatted only when it throws), inside a backward that autograd asked to
/// build a graph (create_graph=true).
template <typename... Instead>
void refuse_higher_order_gradients(const char* who, const Instead&... instead) {
  TORCH_CHECK(!at::GradMode::is_enabled(), who,
              " is differentiable once: its backward cannot build a graph "
              "for higher-order gradients (backward or grad with "
              "create_graph=true). ",
              instead...);
}

} // namespace detail
} // namespace lamp
