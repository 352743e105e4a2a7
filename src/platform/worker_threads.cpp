#include "platform/worker_threads.h"

#include <system_error>

namespace lamp {
namespace detail {

std::string thread_refused(const std::string& purpose,
                           const std::system_error& error) {
  return "the system would not start a thread to " + purpose + " (" +
         error.code().message() +
         "): a limit on the processes' threads or memory is reached (ulimit "
         "-u, ulimit -v, a container's pids limit); raise it, or run fewer "
         "processes or threads.";
}

int64_t Workers::start(int64_t count,
                       const std::function<void(int64_t)>& work) {
  join();
  refused_.clear();
  for (int64_t i = 0; i < count; ++i) {
    try {
      threads_.emplace_back(work, i);
    } catch (const std::system_error& error) {
      refused_ = error.code().message();
      break;
    }
  }
  return static_cast<int64_t>(threads_.size());
}

void Workers::join() {
  for (auto& thread : threads_) {
    if (thread.joinable()) {
      thread.join();
    }
  }
  threads_.clear();
}

} // namespace detail
} // namespace lamp
