#pragma once

// An optimizer's state and param group options as they are, to put back
// when a load must be undone: one that threw after it had changed part of
// them (LibTorch's load sets the groups' options one group at a time), or
// one that succeeded here while another rank's failed (TrainStep::load and
// ShardedOptimizer::load agree on it).

#include <torch/optim/optimizer.h>

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace lamp {
namespace optim {
namespace internal {

class StateSnapshot {
 public:
  /// Takes the state entries (the same tensors, not copies: a load
  /// replaces them rather than writing into them, as LibTorch's and lamp's
  /// loads do) and a copy of every group's options. lamp's optimizers write
  /// the step counts they keep on the device into the state first.
  explicit StateSnapshot(torch::optim::Optimizer& optimizer);
  StateSnapshot(const StateSnapshot&) = delete;
  StateSnapshot& operator=(const StateSnapshot&) = delete;

  /// Puts the state and the options back as they were taken; once.
  void restore();

 private:
  torch::optim::Optimizer& optimizer_;
  std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>
      state_;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options_;
};

} // namespace internal
} // namespace optim
} // namespace lamp
