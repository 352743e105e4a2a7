#pragma once

// The tests' way into ProcessGroup's private state. Private to lamp.

#include "lamp/distributed/process_group.h"

namespace lamp::detail {

struct ProcessGroupSeam {
  // From now on `group`'s reduce_scatter_() takes its all-reduce fallback,
  // what runs where the backend has no reduce-scatter (Gloo in LibTorch
  // 1.13), so that the tests check that path on every LibTorch.
  static void use_all_reduce_for_reduce_scatter(
      distributed::ProcessGroup& group) {
    group.has_reduce_scatter_ = false;
  }
};

} // namespace lamp::detail
