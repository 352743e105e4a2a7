#pragma once

// Work that may fail on some ranks only, agreed on before any rank goes on
// to a collective the failed ones would never reach: the sharded
// checkpoints' writes and reads (Trainer) and ShardedOptimizer::load's
// checks.

#include <functional>
#include <memory>
#include <string>

#include "lamp/distributed/process_group.h"

namespace lamp {
namespace distributed {
namespace detail {

/// Runs `work` on this rank, then agrees with the others (one all-reduce
/// on the group's device): when it threw on any rank (any exception, a
/// std::bad_alloc as well as a c10::Error), every rank throws, a failed
/// rank its own error (a c10::Error's message without its backtrace, any
/// other exception as it was thrown), the others a c10::Error that names
/// the failed ranks and the first one's message (its first 1000 bytes), so
/// that rank 0, which the user reads, says why. `what` names the work ("reading
/// the checkpoint's shards"). A collective: every rank calls it at the same
/// point. One process: `work`, its error as it is.
void on_every_rank(ProcessGroup& group, const std::string& what,
                   const std::function<void()>& work);

/// on_every_rank() where there may be no group (a Trainer without one):
/// then `work` alone, its error as it is.
inline void on_every_rank(const std::shared_ptr<ProcessGroup>& group,
                          const std::string& what,
                          const std::function<void()>& work) {
  if (group) {
    on_every_rank(*group, what, work);
  } else {
    work();
  }
}

} // namespace detail
} // namespace distributed
} // namespace lamp
