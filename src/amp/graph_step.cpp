#include "amp/graph_step.h"

#include <sstream>

namespace lamp {
namespace detail {
namespace {

std::string shape_key(const torch::Tensor& input, const torch::Tensor& target) {
  std::ostringstream key;
  key << input.sizes() << input.scalar_type() << input.device() << '/'
      << target.sizes() << target.scalar_type() << target.device();
  return key.str();
}

} // namespace

GraphStep::GraphStep(const torch::Device& device, int64_t warmup_steps)
    : device_(device), warmup_steps_(warmup_steps), pool_(new_graph_pool()) {
  TORCH_INTERNAL_ASSERT(warmup_steps_ >= 1);
}

GraphStep::~GraphStep() = default;

StepResult GraphStep::step(const torch::Tensor& input,
                           const torch::Tensor& target, const EagerStep& eager,
                           const std::function<void()>& before_capture,
                           const std::function<void()>& before_replay) {
  const auto key = shape_key(input, target);
  auto& entry = graphs_[key];
  if (entry.eager_steps < warmup_steps_) {
    ++entry.eager_steps;
    StepResult result;
    run_on_side_stream(device_, [&] { result = eager(input, target); });
    return result;
  }
  if (!entry.graph) {
    // On the device: the captured step reads them there; each replay copies
    // the caller's batch in first (from wherever it is).
    entry.input = input.to(device_).clone();
    entry.target = target.to(device_).clone();
    before_capture();
    capturing_ = true;
    try {
      entry.graph = capture_graph(device_, pool_, [&] {
        const auto result = eager(entry.input, entry.target);
        entry.loss = result.loss;
        entry.found_inf = result.found_inf;
        entry.scale = result.scale;
      });
    } catch (...) {
      capturing_ = false;
      graphs_.erase(key);
      throw;
    }
    capturing_ = false;
  }
  entry.input.copy_(input, /*non_blocking=*/true);
  entry.target.copy_(target, /*non_blocking=*/true);
  before_replay();
  entry.graph->replay();
  StepResult result;
  result.loss = entry.loss.clone();
  result.found_inf = entry.found_inf.clone();
  result.scale = entry.scale.clone();
  result.cycle_ended = true;
  return result;
}

int64_t GraphStep::pool_bytes() const {
  return graphs_.empty() ? 0 : graph_pool_held_bytes(device_, pool_);
}

} // namespace detail
} // namespace lamp
