#pragma once

// The fused ops' CUDA-graph tests: a step warmed up, captured, its inputs
// given new values, and the graph replayed, so that what the replay wrote
// can be held against a reference computed from the new values.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>

#include "platform/cuda_graph.h"

namespace lamp_test {

/// Runs `step` once on a side stream (as a captured step is warmed up),
/// captures it into a CUDA graph on `device`, runs `refill` without grad
/// mode (new values into the captured inputs), replays the graph and waits
/// for it.
inline void capture_refill_replay(const torch::Device& device,
                                  const std::function<void()>& step,
                                  const std::function<void()>& refill) {
  lamp::detail::run_on_side_stream(device, step);
  const auto graph =
      lamp::detail::capture_graph(device, lamp::detail::new_graph_pool(), step);
  {
    torch::NoGradGuard no_grad;
    refill();
  }
  graph->replay();
  torch::cuda::synchronize();
}

} // namespace lamp_test
