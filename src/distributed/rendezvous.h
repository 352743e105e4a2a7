#pragma once

// The meeting of the ranks before a process group's backend starts, and the
// message helpers that ProcessGroup shares with it. Private to src/.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "lamp/distributed/environment.h"
#include "lamp/distributed/process_group.h"

namespace lamp {
namespace detail {

/// The error's own text, without a backtrace or the closing full stop that
/// the message around it adds.
std::string error_text(const std::exception& error);

/// Seconds, as messages show them ("1.5 s").
std::string seconds(std::chrono::milliseconds d);

/// "1, 3, 4" (at most 8, then "..."), for messages.
std::string rank_list(const std::vector<int>& ranks);

/// Joins the rendezvous at `address` (MASTER_ADDR:MASTER_PORT): rank 0 (or
/// torchrun's agent) serves a TCPStore there, every rank connects and signs
/// in under its rank. While it waits it says for what (every
/// options.wait_report_interval()); when options.timeout() ends the wait, the
/// error names the ranks that never came. Returns the store, prefixed for
/// this group.
c10::intrusive_ptr<c10d::Store> join_rendezvous(
    const distributed::Environment& env,
    const distributed::ProcessGroupOptions& options,
    const std::string& address);

} // namespace detail
} // namespace lamp
