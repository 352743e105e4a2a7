#pragma once

/// \file
/// The environment `torchrun` gives each process: rank, world size, where
/// the ranks meet.

#include <c10/util/Optional.h>

#include <string>

namespace lamp {
namespace distributed {

/// What `torchrun` (torch.distributed.run) sets in each process it starts.
struct Environment {
  /// The largest WORLD_SIZE from_env() accepts (2^20 ranks).
  static constexpr int kMaxWorldSize = 1 << 20;
  /// RANK: this process's global rank, 0 <= rank < world_size.
  int rank = 0;
  /// WORLD_SIZE: the number of processes in the job.
  int world_size = 1;
  /// LOCAL_RANK: the rank among the processes on this machine, which picks
  /// its CUDA device; 0 <= local_rank < local_world_size.
  int local_rank = 0;
  /// LOCAL_WORLD_SIZE: the number of processes on this machine.
  int local_world_size = 1;
  /// MASTER_ADDR: the host of the TCPStore where the ranks meet.
  std::string master_addr = "127.0.0.1";
  /// MASTER_PORT: the TCPStore's port.
  int master_port = 29500;
  /// torchrun's agent already serves the TCPStore at master_addr:port
  /// (TORCHELASTIC_USE_AGENT_STORE=True); otherwise rank 0 serves it.
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: the key prefix of this attempt in the
  /// agent's store.
  int restart_count = 0;

  /// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
  /// MASTER_PORT (and torchrun's agent-store variables). Without RANK and
  /// WORLD_SIZE: nullopt (a plain single-process run). A partial or
  /// malformed set (RANK without WORLD_SIZE, RANK >= WORLD_SIZE, LOCAL_RANK
  /// >= LOCAL_WORLD_SIZE, or >= WORLD_SIZE without it, a port that is not a
  /// number, ...) throws, naming the variable.
  static c10::optional<Environment> from_env();
};

} // namespace distributed
} // namespace lamp
