#pragma once

// The machine's physical memory, for the readers that load a whole file:
// a file (or a decompressed stream) larger than it is corrupt, not data, and
// refusing it up front replaces std::bad_alloc or an allocator failure deep
// inside ATen.

#include <unistd.h>

#include <cstdint>
#include <limits>

namespace lamp {
namespace detail {

/// Physical memory in bytes, or the largest uint64_t when the system does not
/// say.
inline uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) {
    return std::numeric_limits<uint64_t>::max();
  }
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

/// physical_memory_bytes() for the CPU of device_memory_bytes(): 0 where the
/// system does not say.
inline uint64_t cpu_memory_bytes() {
  const uint64_t bytes = physical_memory_bytes();
  return bytes == std::numeric_limits<uint64_t>::max() ? 0 : bytes;
}

} // namespace detail
} // namespace lamp
