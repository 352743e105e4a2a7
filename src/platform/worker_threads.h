#pragma once

// Worker threads that start as far as the system lets them. std::thread's
// constructor throws std::system_error where a thread cannot start (a
// process or thread limit, `ulimit -v` leaving no room for its stack), and a
// std::vector<std::thread> destroyed with a started thread in it ends the
// process (std::terminate). Work that threads pull from a shared queue is
// all done by however many started; where none did, by the caller.

#include <cstdint>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace lamp {
namespace detail {

/// The message for a thread the system would not start (`error`, from
/// std::thread's constructor) to do `purpose` ("watch its collectives"):
/// the system's words, the limit and the fix, in place of the bare
/// "Resource temporarily unavailable".
std::string thread_refused(const std::string& purpose,
                           const std::system_error& error);

class Workers {
 public:
  Workers() = default;
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  // Joins every thread started: no exception leaves one behind.
  ~Workers() { join(); }

  // Starts `count` threads running work(0) ... work(count - 1), or fewer:
  // the first that cannot start ends the starting, and those before it run.
  // Returns how many started (0 for count <= 0). Call join() before
  // starting again.
  int64_t start(int64_t count, const std::function<void(int64_t)>& work);
  // Waits for every thread started. Idempotent.
  void join();

  // The system's words for the first thread of the last start() that did
  // not start ("Resource temporarily unavailable"); "" where all did.
  const std::string& refused() const { return refused_; }

 private:
  std::vector<std::thread> threads_;
  std::string refused_;
};

} // namespace detail
} // namespace lamp
