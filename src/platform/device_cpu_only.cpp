// The CUDA queries of lamp/platform/backends.h for a LibTorch built without
// CUDA.
#include "lamp/platform/backends.h"
#include "lamp/platform/out_of_memory.h"
#include "platform/cuda_name.h"
#include "platform/memory.h"

namespace lamp {

bool cuda_available() {
  return false;
}

std::string cuda_versions() {
  return "";
}

int64_t peak_device_memory(const torch::Device&) {
  return 0;
}

void reset_peak_device_memory(const torch::Device&) {}

int64_t allocated_device_memory(const torch::Device&) {
  return 0;
}

int64_t reserved_device_memory(const torch::Device&) {
  return 0;
}

void release_cached_device_memory() {}

uint64_t device_memory_bytes(const c10::Device& device) {
  return device.is_cpu() ? detail::cpu_memory_bytes() : 0;
}

void synchronize(const torch::Device&) {}

namespace detail {
std::string cuda_device_name(const torch::Device&) {
  return "no CUDA";
}

std::pair<int, int> cuda_compute_capability(const torch::Device&) {
  return {0, 0};
}
} // namespace detail

} // namespace lamp

// CUDA graphs need CUDA.
#include "platform/cuda_graph.h"

namespace lamp {
namespace detail {

namespace {
[[noreturn]] void no_cuda_graphs() {
  TORCH_CHECK(
      false,
      "lamp::TrainStep: cuda_graph needs a LibTorch built with CUDA and a CUDA device; this LibTorch has no CUDA. Use cuda_graph(false).");
}
} // namespace

GraphPool new_graph_pool() {
  no_cuda_graphs();
}

void run_on_side_stream(const torch::Device&, const std::function<void()>&) {
  no_cuda_graphs();
}

std::unique_ptr<CapturedGraph> capture_graph(const torch::Device&, GraphPool,
                                             const std::function<void()>&) {
  no_cuda_graphs();
}

GraphPoolMemory graph_pool_memory(const torch::Device&, GraphPool) {
  return {};
}

bool stream_capturing(const torch::Device&) {
  return false;
}

} // namespace detail
} // namespace lamp
