#include "amp/graph_step.h"

#include <sstream>

#include "lamp/platform/backends.h"

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
                           const torch::Tensor& target, const Hooks& hooks,
                           const std::vector<torch::Tensor>& grad_owners) {
  const auto key = shape_key(input, target);
  auto& entry = graphs_[key];
  if (entry.eager_steps < warmup_steps_) {
    ++entry.eager_steps;
    StepResult result;
    run_on_side_stream(device_, [&] { result = hooks.eager(input, target); });
    return result;
  }
  if (!entry.graph) {
    // On the device: the captured step reads them there; each replay copies
    // the caller's batch in first (from wherever it is).
    entry.input = input.to(device_).clone();
    entry.target = target.to(device_).clone();
    hooks.before_capture();
    capturing_ = true;
    try {
      entry.graph = capture_graph(device_, pool_, [&] {
        const auto result = hooks.eager(entry.input, entry.target);
        entry.loss = result.loss;
        entry.found_inf = result.found_inf;
        entry.scale = result.scale;
        entry.grad_norm = result.grad_norm; // undefined without clipping
      });
    } catch (...) {
      capturing_ = false;
      graphs_.erase(key);
      throw;
    }
    capturing_ = false;
    ++captures_;
    // Held here, so that no later capture in the shared pool reuses their
    // memory: the parameters' `.grad` are set back to them after each replay.
    entry.grads.clear();
    for (const auto& owner : grad_owners) {
      entry.grads.push_back(owner.grad());
    }
    // The warm-up ran eagerly, outside the pool: its activations are cached
    // blocks the replays never use (as much again as the pool, for a large
    // batch), and so are the pools of graphs forgotten before. Blocks of
    // live tensors and of live graphs' pools stay.
    release_cached_device_memory();
  }
  entry.input.copy_(input, /*non_blocking=*/true);
  entry.target.copy_(target, /*non_blocking=*/true);
  hooks.before_replay();
  entry.graph->replay();
  // The gradients this replay wrote, wherever the last capture of another
  // shape left `.grad`.
  TORCH_INTERNAL_ASSERT(entry.grads.size() == grad_owners.size());
  for (size_t i = 0; i < grad_owners.size(); ++i) {
    grad_owners[i].mutable_grad() = entry.grads[i];
  }
  StepResult result;
  result.loss = entry.loss.clone();
  result.found_inf = entry.found_inf.clone();
  result.scale = entry.scale.clone();
  if (entry.grad_norm.defined()) {
    result.grad_norm = entry.grad_norm.clone();
  }
  result.cycle_ended = true;
  return result;
}

bool GraphStep::captured() const {
  for (const auto& item : graphs_) {
    if (item.second.graph) {
      return true;
    }
  }
  return false;
}

GraphPoolMemory GraphStep::pool_memory() const {
  return captured() ? graph_pool_memory(device_, pool_) : GraphPoolMemory{};
}

void GraphStep::clear() {
  if (graphs_.empty()) {
    return;
  }
  synchronize(device_);
  graphs_.clear();
  // A pool whose graphs are all gone cannot be captured into again while a
  // tensor still holds its memory (the caching allocator asserts); the next
  // capture's release_cached_device_memory() returns it to the device.
  pool_ = new_graph_pool();
}

} // namespace detail
} // namespace lamp
