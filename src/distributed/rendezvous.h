#pragma once

// The meeting of the ranks before a process group's backend starts, and the
// message helpers that ProcessGroup shares with it. Private to src/.

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "lamp/distributed/environment.h"
#include "lamp/distributed/process_group.h"
#include "platform/worker_threads.h"

namespace lamp {
namespace detail {

/// The error's own text, without a backtrace or the closing full stop that
/// the message around it adds.
std::string error_text(const std::exception& error);

/// Seconds, as messages show them ("1.5 s").
std::string seconds(std::chrono::milliseconds d);

/// "1, 3, 4" (at most 8, then "..."), for messages.
std::string rank_list(const std::vector<int>& ranks);

/// Whether something accepts TCP connections at host:port now, trying for
/// at most a second: "" when it does, else what a connection finds ("nothing
/// listens there (connection refused)", "the host name ... does not
/// resolve", the system's words), for a waiting rank's line.
std::string listener_at(const std::string& host, int port);

/// `call()`'s result, computed on a thread of its own that is left behind
/// (detached) if the caller stops waiting: a store call can block forever,
/// and std::async's future would wait for it on destruction. Never throws:
/// where the system will not start the thread, the future holds the error
/// (thread_refused()'s words for `purpose`), as it holds the call's own, so
/// that a caller on the watch's thread or in an error's report goes on as
/// for a call that failed.
template <typename F>
auto detached(F call, const char* purpose = "ask the ranks' store")
    -> std::future<decltype(call())> {
  auto result = std::make_shared<std::promise<decltype(call())>>();
  auto future = result->get_future();
  try {
    std::thread([call = std::move(call), result] {
      try {
        result->set_value(call());
      } catch (...) {
        result->set_exception(std::current_exception());
      }
    }).detach();
  } catch (const std::system_error& error) {
    try {
      TORCH_CHECK(false, thread_refused(purpose, error));
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  }
  return future;
}

/// The rendezvous's store, under the keys of one process group.
struct RendezvousStore {
  c10::intrusive_ptr<c10d::Store> store;
  /// Another client connection to the same store under the same keys: for
  /// a thread that must not wait behind `store`'s calls (a TCPStore client
  /// serves one call at a time).
  std::function<c10::intrusive_ptr<c10d::Store>()> connect_again;
  /// Whether rank 0, which serves the store, has gone, for the message of
  /// a collective that failed or waits: "" while something accepts
  /// connections at the store's address, else what a connection finds and
  /// what that means. Empty on rank 0 and where torchrun's agent serves
  /// the store (it outlives the ranks).
  std::function<std::string()> server_gone;
};

/// Joins the rendezvous at `address` (MASTER_ADDR:MASTER_PORT): rank 0 (or
/// torchrun's agent) serves a TCPStore there, every rank connects and signs
/// in under its rank. While it waits it says for what (every
/// options.wait_report_interval()); when options.timeout() ends the wait, the
/// error names the ranks that never came. Returns the store, prefixed for
/// this group, and the way to connect to it again.
RendezvousStore join_rendezvous(const distributed::Environment& env,
                                const distributed::ProcessGroupOptions& options,
                                const std::string& address);

} // namespace detail
} // namespace lamp
