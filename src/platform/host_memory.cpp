#include "lamp/platform/host_memory.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace lamp {

namespace {

// Whether the environment already sets either threshold.
bool set_by_environment() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr &&
      (std::strstr(tunables, "glibc.malloc.mmap_threshold") != nullptr ||
       std::strstr(tunables, "glibc.malloc.trim_threshold") != nullptr)) {
    return true;
  }
  return std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
         std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr;
}

} // namespace

std::string to_string(HostMemoryTuning tuning) {
  switch (tuning) {
    case HostMemoryTuning::kApplied:
      return "applied";
    case HostMemoryTuning::kSetByEnvironment:
      return "set by the environment";
    case HostMemoryTuning::kUnsupported:
      return "unsupported";
  }
  return "unknown";
}

HostMemoryTuning keep_host_memory(const HostMemoryOptions& options) {
  constexpr std::size_t kMaxMmapThreshold = std::size_t{32} << 20;
  TORCH_CHECK(options.mmap_threshold_bytes <= kMaxMmapThreshold,
              "lamp::keep_host_memory: mmap_threshold_bytes ",
              options.mmap_threshold_bytes,
              " is above glibc's limit of 32 MiB (33554432); give at most "
              "that.");
  if (set_by_environment()) {
    return HostMemoryTuning::kSetByEnvironment;
  }
#if defined(__GLIBC__)
  // mallopt takes an int; the trim threshold is capped at INT_MAX.
  const auto as_int = [](std::size_t bytes) {
    constexpr std::size_t kMax = 2147483647;
    return static_cast<int>(bytes < kMax ? bytes : kMax);
  };
  // The trim threshold first: setting either turns glibc's adaptive
  // thresholds off, and the pair must not trim in between.
  if (mallopt(M_TRIM_THRESHOLD, as_int(options.trim_threshold_bytes)) == 1 &&
      mallopt(M_MMAP_THRESHOLD, as_int(options.mmap_threshold_bytes)) == 1) {
    return HostMemoryTuning::kApplied;
  }
#endif
  return HostMemoryTuning::kUnsupported;
}

} // namespace lamp
