// Built only when the LibTorch found has CUDA: CUDA graphs for TrainStep.
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "platform/cuda_graph.h"

namespace lamp {
namespace detail {
namespace {

class CudaGraph : public CapturedGraph {
 public:
  at::cuda::CUDAGraph graph;
  void replay() override { graph.replay(); }
};

// Makes `waiter` wait for the work queued so far on `producer`.
void wait_for(const c10::cuda::CUDAStream& producer,
              const c10::cuda::CUDAStream& waiter) {
  at::cuda::CUDAEvent event;
  event.record(producer);
  event.block(waiter);
}

} // namespace

GraphPool new_graph_pool() {
  const auto id = at::cuda::graph_pool_handle();
  return {id.first, id.second};
}

void run_on_side_stream(const torch::Device& device,
                        const std::function<void()>& body) {
  TORCH_CHECK(device.is_cuda(), "lamp: a side stream needs a CUDA device, got ",
              device, ".");
  c10::cuda::CUDAGuard device_guard(device);
  const auto current = c10::cuda::getCurrentCUDAStream();
  const auto side = c10::cuda::getStreamFromPool(false, current.device_index());
  wait_for(current, side);
  // The current stream waits for the side stream's work however `body`
  // ends: a body that throws part-way (out of memory in the optimizer) has
  // queued kernels there that later work on the current stream, and the
  // caching allocator's reuse of its blocks, must not overtake.
  try {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    body();
  } catch (...) {
    wait_for(side, current);
    throw;
  }
  wait_for(side, current);
}

std::unique_ptr<CapturedGraph> capture_graph(
    const torch::Device& device, GraphPool pool,
    const std::function<void()>& body) {
  TORCH_CHECK(device.is_cuda(), "lamp: CUDA graphs need a CUDA device, got ",
              device, ".");
  c10::cuda::CUDAGuard device_guard(device);
  auto captured = std::make_unique<CudaGraph>();
  const auto current = c10::cuda::getCurrentCUDAStream();
  // Capture is not allowed on the legacy default stream.
  const auto side = c10::cuda::getStreamFromPool(false, current.device_index());
  wait_for(current, side);
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    captured->graph.capture_begin({pool.first, pool.second});
    try {
      body();
    } catch (const std::exception& e) {
      try {
        captured->graph.capture_end();
      } catch (...) {
        // The capture is invalid anyway; report what the step did.
      }
      TORCH_CHECK(
          false,
          "lamp::TrainStep: the training step could not be captured in a CUDA graph: ",
          e.what(),
          " A captured step must not wait for the GPU: no .item(), printing of tensors or host copies in the loss function, no GradScaler diagnose_overflow. Use TrainStepOptions::cuda_graph kOff (or kAuto where they apply) for such a step.");
    }
    captured->graph.capture_end();
  }
  wait_for(side, current);
  return captured;
}

GraphPoolMemory graph_pool_memory(const torch::Device& device, GraphPool pool) {
  TORCH_CHECK(device.is_cuda(), "lamp: graph pools live on CUDA devices, got ",
              device, ".");
  const auto index =
      device.has_index() ? device.index() : c10::cuda::current_device();
  GraphPoolMemory memory;
  for (const auto& segment :
       c10::cuda::CUDACachingAllocator::snapshot().segments) {
    if (segment.device == index &&
        segment.owner_private_pool_id.first == pool.first &&
        segment.owner_private_pool_id.second == pool.second) {
      memory.reserved += static_cast<int64_t>(segment.total_size);
      memory.allocated += static_cast<int64_t>(segment.allocated_size);
    }
  }
  return memory;
}

bool stream_capturing(const torch::Device& device) {
  if (!device.is_cuda()) {
    return false;
  }
  c10::cuda::CUDAGuard device_guard(device);
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() !=
         c10::cuda::CaptureStatus::None;
}

} // namespace detail
} // namespace lamp
