#pragma once

/// \file
/// The process's address-space limit (`ulimit -v`, RLIMIT_AS) against what a
/// run needs. Under a tight limit LibTorch's dependencies do not fail
/// cleanly: OpenBLAS retries its work buffer's allocation forever (the run
/// hangs at its first matrix product on a new thread), oneDNN may crash.
/// lamp's own allocations fail with an error (out_of_memory.h), theirs do
/// not; so a run whose limit leaves too little room is refused before it
/// starts, with the limit and the fix named.

#include <cstdint>
#include <string>

namespace lamp {

/// The address-space limit and what the process maps now.
struct AddressSpace {
  /// RLIMIT_AS's soft limit in bytes (`ulimit -v` shows KiB); -1: none.
  int64_t limit = -1;
  /// The address space the process maps now (VmSize), in bytes; 0 where
  /// unknown (no /proc).
  int64_t mapped = 0;
};

/// This process's AddressSpace.
AddressSpace address_space();

/// Address space each CPU compute thread after the first needs beyond what
/// the process maps at start: OpenBLAS's work buffer (128 MiB on x86-64,
/// taken on the thread's first matrix product; the first thread's is taken
/// when the library loads), its stack and oneDNN's scratch. Measured with
/// train_mnist on LibTorch 1.13 and OpenBLAS: the peak mapping grows by
/// about 200 MB from one thread to two.
constexpr int64_t kAddressSpacePerThread = int64_t{160} << 20;
/// Address space a run needs beyond its threads' for the tensors of a
/// small model's step (a larger model needs more; its own allocations then
/// fail with lamp's out-of-memory error, not in a library).
constexpr int64_t kAddressSpaceForTensors = int64_t{128} << 20;

/// What a run with `threads` compute threads (at::get_num_threads()) and
/// `tensor_bytes` of its own tensors still to allocate (weights, gradients,
/// optimizer state) needs beyond what is mapped.
int64_t address_space_needed(int threads, int64_t tensor_bytes);

/// Throws a c10::Error when `space` has a limit that leaves less than
/// `needed` bytes beyond what is mapped, naming the limit in `ulimit -v`'s
/// KiB, what is mapped, what `who` ("training") needs and the fix: "raise
/// the limit to at least N KiB (ulimit -v N) or remove it (ulimit -v
/// unlimited)". Nothing without a limit.
void check_address_space(const AddressSpace& space, int64_t needed,
                         const std::string& who);

} // namespace lamp
