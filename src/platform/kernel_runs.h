#pragma once

// How many times in this process each of lamp's own GPU paths ran: a kernel
// of lamp's launched, or a cuBLASLt product with its epilogue done. The
// ATen ops these paths fall back to meet the same bounds in the _CUDA
// tests, so a test tells from these counts that its calls took the path it
// tests. Counted on the host as the launch is queued (once at a CUDA
// graph's capture, not at its replays).

#include <array>
#include <atomic>
#include <cstdint>

namespace lamp {
namespace detail {

enum class KernelPath {
  kAddNorm,          // ops/add_norm: the forward or the backward kernel
  kLtEpilogue,       // ops/cublaslt: a product with its epilogue
  kFloat8Cast,       // nn/float8: the one-pass cast (+ amax, + transpose)
  kFloat8ScaleUpdate // nn/float8: delayed scaling's update, many layers
};
constexpr size_t kKernelPaths = 4;

inline std::atomic<int64_t>& kernel_runs(KernelPath path) {
  static std::array<std::atomic<int64_t>, kKernelPaths> runs{};
  return runs[static_cast<size_t>(path)];
}

inline void note_kernel_run(KernelPath path) {
  kernel_runs(path).fetch_add(1, std::memory_order_relaxed);
}

} // namespace detail
} // namespace lamp
