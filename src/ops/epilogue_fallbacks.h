#pragma once

// How many times in this process a product that was to run cuBLASLt's
// epilogues (gelu_mlp, linear_bgrad on CUDA) ran the ATen ops instead,
// decided before the call or refused by cuBLASLt during it. The warnings
// say so once per process and site; this counts every time, so that a test
// can tell whether its own calls took the epilogues.

#include <atomic>
#include <cstdint>

namespace lamp {
namespace detail {

inline std::atomic<int64_t>& epilogue_fallback_count() {
  static std::atomic<int64_t> count{0};
  return count;
}

inline void note_epilogue_fallback() {
  epilogue_fallback_count().fetch_add(1, std::memory_order_relaxed);
}

} // namespace detail
} // namespace lamp
