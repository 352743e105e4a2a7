#pragma once

/// \file
/// Running out of memory in lamp's large allocations (master weights,
/// dataset reads, training steps) as an error that says what was being
/// allocated, how much, and what to do, instead of a bare std::bad_alloc.

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <new>
#include <string>

namespace lamp {

/// Whether `error` is an allocator's out-of-memory error: LibTorch's CUDA
/// allocator (c10::OutOfMemoryError) or its CPU allocator ("not enough
/// memory").
bool is_out_of_memory(const c10::Error& error);

/// Throws the c10::Error of with_memory_context(): "lamp: out of memory
/// while allocating `what` (`bytes` as MiB): `cause`." and what to do (a
/// smaller batch or model, more memory, a higher `ulimit -v`). `bytes` < 0:
/// size unknown, left out.
[[noreturn]] void throw_out_of_memory(const std::string& what, int64_t bytes,
                                      const std::string& cause);

/// The memory tensors on `device` can occupy at most, in bytes: the GPU's
/// total memory for a CUDA device, the machine's physical memory for the
/// CPU; 0 where unknown (another device type, no CUDA).
uint64_t device_memory_bytes(const c10::Device& device);

/// Refuses an allocation that cannot succeed before it is tried: throws a
/// c10::Error when `bytes` are more than device_memory_bytes(`device`),
/// "lamp: `what` needs at least 1.2 TiB (...), more than the 23.4 GiB (...)
/// of memory of cpu; `fix`." Nothing where the memory is unknown. A size
/// that fits may still fail later (other allocations share the memory);
/// this catches the sizes that never fit, such as a mistyped flag.
void check_fits_in_memory(uint64_t bytes, const c10::Device& device,
                          const std::string& what, const std::string& fix);

/// Runs `allocate` and returns its result; std::bad_alloc or an allocator's
/// out-of-memory error (is_out_of_memory()) becomes throw_out_of_memory()'s
/// error naming `what` and `bytes`. Other errors pass unchanged. `what` is
/// anything a std::string is made from, made only on failure: a string
/// literal costs nothing on the way through (TrainStep::step runs in it).
///
/// Example:
/// \code
///   auto buffer = lamp::with_memory_context(
///       "the input buffer", n * 4, [&] { return torch::empty({n}); });
/// \endcode
template <typename What, typename Allocate>
auto with_memory_context(const What& what, int64_t bytes, Allocate&& allocate)
    -> decltype(allocate()) {
  try {
    return allocate();
  } catch (const std::bad_alloc& e) {
    throw_out_of_memory(std::string(what), bytes, e.what());
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e)) {
      throw;
    }
    throw_out_of_memory(std::string(what), bytes, e.what_without_backtrace());
  }
}

} // namespace lamp
