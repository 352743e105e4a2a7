#pragma once

/// \file
/// lamp::keep_host_memory: keeps the host memory a CPU training step frees
/// for the next step, instead of returning it to the system and taking it
/// back page by page.
///
/// LibTorch's CPU tensors come from the C library's malloc. With glibc's
/// defaults a block of a few MiB or more is mapped fresh on each allocation
/// and unmapped on free, and free memory at the top of the heap is handed
/// back once it passes a small threshold; every step then zero-fills its
/// activations' pages again in page faults. On a small GPT on one CPU
/// thread that was about 8,800 faults a step and 5% to 10% of the step
/// (docs/backends.md, "Host memory"). Python processes often escape it by
/// accident (an early large free raises glibc's adaptive thresholds); C++
/// programs do not.

#include <cstddef>
#include <string>

namespace lamp {

/// The two glibc malloc settings keep_host_memory() applies.
struct HostMemoryOptions {
  /// Blocks up to this size come from the heap, not a fresh mapping
  /// (glibc's M_MMAP_THRESHOLD; at most 32 MiB on 64-bit glibc).
  std::size_t mmap_threshold_bytes = std::size_t{32} << 20;
  /// Free memory kept at the top of the heap before any is returned
  /// (glibc's M_TRIM_THRESHOLD): the memory a process may hold beyond what
  /// its tensors use.
  std::size_t trim_threshold_bytes = std::size_t{256} << 20;
};

/// What keep_host_memory() did.
enum class HostMemoryTuning {
  kApplied,          ///< glibc's thresholds are now the options'.
  kSetByEnvironment, ///< GLIBC_TUNABLES or MALLOC_*_ set them: left alone.
  kUnsupported,      ///< not glibc's malloc (or it refused): nothing done.
};

/// "applied", "set by the environment", "unsupported".
std::string to_string(HostMemoryTuning tuning);

/// Sets glibc's mmap and trim thresholds for the whole process, so the
/// memory a training step frees serves the next one. The process keeps up
/// to `trim_threshold_bytes` of freed memory. Leaves malloc as it is where
/// the user tuned it (GLIBC_TUNABLES naming glibc.malloc.mmap_threshold or
/// glibc.malloc.trim_threshold, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_)
/// or where the C library is not glibc. Call it once at the start of a
/// program, before the model is built; lamp's programs do. Errors name an
/// mmap threshold above 32 MiB, which glibc refuses.
HostMemoryTuning keep_host_memory(const HostMemoryOptions& options = {});

} // namespace lamp
