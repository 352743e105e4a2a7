#pragma once

// The CUDA-graph primitives TrainStep's cuda_graph mode uses. Implemented in
// src/platform/*_cuda.cpp (the only sources that include CUDA headers); a
// LibTorch without CUDA gets versions that refuse with a clear message.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

namespace lamp {
namespace detail {

/// A memory pool that several graphs share (ATen's MempoolId_t).
using GraphPool = std::pair<uint64_t, uint64_t>;

/// One captured CUDA graph.
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
  /// Launches the captured work on the current stream.
  virtual void replay() = 0;
};

/// A new pool id for graphs that share memory.
GraphPool new_graph_pool();

/// Runs `body` on a side stream of `device` that first waits for the current
/// stream, then makes the current stream wait for it (the warm-up PyTorch
/// recommends before capturing: lazy initialisations happen off the capture).
void run_on_side_stream(const torch::Device& device,
                        const std::function<void()>& body);

/// Captures what `body` launches on `device` (on a side stream, in `pool`)
/// into a graph. A failure inside the capture is rethrown with what to change.
std::unique_ptr<CapturedGraph> capture_graph(const torch::Device& device,
                                             GraphPool pool,
                                             const std::function<void()>& body);

/// Device memory that `pool` holds beyond live tensors: what the captures in
/// it freed (their intermediates), which replays reuse. The caching
/// allocator counts it as reserved, not allocated, so peak_device_memory()
/// misses it after the capture.
int64_t graph_pool_held_bytes(const torch::Device& device, GraphPool pool);

} // namespace detail
} // namespace lamp
