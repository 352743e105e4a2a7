#pragma once

/// \file
/// Refusing concurrent use of an object that is used by one thread at a
/// time (TrainStep, GradScaler): a clear error instead of a data race.

#include <c10/util/Exception.h>

#include <atomic>
#include <thread>

namespace lamp {
namespace detail {

/// Which thread is inside a guarded method of the object that holds it. A
/// copy is not in use.
class InUseFlag {
 public:
  InUseFlag() = default;
  InUseFlag(const InUseFlag& /*other*/) {}
  InUseFlag& operator=(const InUseFlag& /*other*/) { return *this; }

 private:
  friend class InUseGuard;
  std::atomic<std::thread::id> owner_{std::thread::id()};
};

/// Marks `flag` in use by this thread while it lives. Constructed while
/// another thread holds the flag: a c10::Error that names `method` and says
/// that the object is used by one thread at a time; while this thread holds
/// it (a call from inside the method, say from a callback): an error saying
/// so. One atomic exchange each way; it never waits.
class InUseGuard {
 public:
  InUseGuard(InUseFlag& flag, const char* method) : flag_(flag) {
    auto owner = std::thread::id();
    const auto self = std::this_thread::get_id();
    if (flag_.owner_.compare_exchange_strong(owner, self,
                                             std::memory_order_acquire)) {
      return;
    }
    TORCH_CHECK(
        owner != self, method,
        " called again from inside a call on the same object (from a callback such as the loss function); return from the first call before the next.");
    TORCH_CHECK(
        false, method,
        " called from two threads at once: another thread is inside a call on the same object. Each object is used by one thread at a time; give each thread its own, or serialise the calls.");
  }
  ~InUseGuard() {
    flag_.owner_.store(std::thread::id(), std::memory_order_release);
  }
  InUseGuard(const InUseGuard&) = delete;
  InUseGuard& operator=(const InUseGuard&) = delete;

 private:
  InUseFlag& flag_;
};

} // namespace detail
} // namespace lamp
