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

/// The device memory of one graph pool.
struct GraphPoolMemory {
  /// What the pool reserves from the device (its segments).
  int64_t reserved = 0;
  /// What live tensors hold of it (gradients, static inputs and outputs).
  int64_t allocated = 0;
};

/// The memory of `pool` on `device`. `reserved - allocated` is what the
/// captures in it freed (their intermediates), which replays reuse: the
/// caching allocator counts it as reserved, not allocated, so
/// peak_device_memory() misses it after the capture.
GraphPoolMemory graph_pool_memory(const torch::Device& device, GraphPool pool);

/// Whether work launched now on `device`'s current stream is being captured
/// into a CUDA graph (never on a CPU device): state made then would be made
/// again, zero-filled, by every replay.
bool stream_capturing(const torch::Device& device);

} // namespace detail
} // namespace lamp
