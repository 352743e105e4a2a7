#pragma once

/// \file
/// A process group on LibTorch's own distributed engine (c10d, the layer
/// under Python's torch.distributed), set up from torchrun's environment,
/// with the collectives data-parallel training needs.

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>

#include "lamp/distributed/environment.h"

namespace lamp {
namespace detail {
struct ProcessGroupSeam;
} // namespace detail

namespace distributed {

/// Whether this lamp was built with c10d's Gloo backend (CPU collectives).
/// CMake builds it where Gloo's headers are found (LAMP_WITH_GLOO=AUTO, the
/// default): Debian's libgloo-dev has them, PyPI's torch wheel does not.
/// Without Gloo, ProcessGroup::create() refuses backend "gloo", and "auto" on
/// the CPU for more than one process, with an error saying so; NCCL (CUDA)
/// and single-process runs work as usual.
bool gloo_available();

/// How the process group is set up.
struct ProcessGroupOptions {
  /// "auto" (NCCL for a CUDA device, Gloo for the CPU), "gloo" or "nccl".
  /// Gloo needs a lamp built with it (gloo_available()).
  TORCH_ARG(std::string, backend) = "auto";
  /// How long a collective or the rendezvous waits for the other ranks
  /// before failing with an error (instead of hanging on a dead rank); the
  /// programs' --dist-timeout SECONDS. A rendezvous that times out names the
  /// ranks that never came; a collective, the rank that stopped answering.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(10);
  /// How often a rendezvous that is still waiting says so ("waiting for N
  /// of M ranks at HOST:PORT"), the first time after this long.
  TORCH_ARG(std::chrono::milliseconds,
            wait_report_interval) = std::chrono::seconds(5);
  /// How long a collective (an all-reduce, a broadcast, check_same) waits
  /// for the other ranks before this rank says so, and for whom ("rank 0 of
  /// 2 has waited 30 s in the gradient all-reduce ... for rank 1, which has
  /// not reached it; giving up after 600 s"), then again each time as long
  /// again; 0: a quarter of the timeout, at most 30 s. A thread of the group
  /// watches: a step in which nothing waits pays no host sync and no store
  /// traffic for it.
  TORCH_ARG(std::chrono::milliseconds,
            collective_wait_report) = std::chrono::milliseconds(0);
  /// Where those lines, and the rendezvous's, go; nullptr: standard error.
  TORCH_ARG(std::function<void(const std::string&)>, wait_report) = nullptr;
  /// Read every 100 ms while the rendezvous waits (to reach the store, or
  /// for the other ranks): true ends the wait with an error saying that a
  /// stop was asked for. lamp's programs pass their signal flag, so that the
  /// first Ctrl-C stops a rank that waits for the others. nullptr: never.
  TORCH_ARG(std::function<bool()>, stop_requested) = nullptr;
};

/// One named value that every rank must have the same of (a flag and its
/// value, a parameter and its shape), for ProcessGroup::check_same().
using RankSetting = std::pair<std::string, std::string>;

/// The reduction of all_reduce_(): kSum adds the ranks' values, kMax and
/// kMin take their elementwise maximum or minimum.
enum class ReduceOp { kSum, kMax, kMin };

/// One process's handle on a group of `world_size()` processes (ranks).
///
/// Made from torchrun's environment (from_environment) or explicitly
/// (create). A group of one process runs no communication: every collective
/// returns its input, so a program is written once and runs unchanged alone
/// or under torchrun. Collectives are called by every rank in the same
/// order; tensors live on the group's device (CUDA for NCCL, CPU for Gloo).
///
/// Example:
/// \code
///   auto group = lamp::distributed::ProcessGroup::from_environment(
///       torch::kCPU);
///   torch::Tensor correct = torch::tensor({hits}, torch::kDouble);
///   group->all_reduce_(correct);  // summed over ranks
///   if (group->rank() == 0) std::cout << correct.item<double>() << "\n";
/// \endcode
class ProcessGroup {
 public:
  /// A single-process group (rank 0 of 1) on `device`.
  explicit ProcessGroup(torch::Device device = torch::kCPU);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// From Environment::from_env(); a single-process group when torchrun's
  /// variables are absent. For a CUDA `device` without an index the device
  /// becomes cuda:LOCAL_RANK; a LOCAL_RANK above the largest device index
  /// (127, c10::DeviceIndex) is refused.
  static std::shared_ptr<ProcessGroup> from_environment(
      torch::Device device, ProcessGroupOptions options = {});

  /// Rendezvous through a TCPStore at env.master_addr:env.master_port, then
  /// the Gloo or NCCL backend. Fails with an error naming the address, the
  /// ranks and the timeout when the other ranks do not arrive in time.
  static std::shared_ptr<ProcessGroup> create(const Environment& env,
                                              torch::Device device,
                                              ProcessGroupOptions options = {});

  /// This process's rank, 0 <= rank() < world_size().
  int rank() const { return rank_; }
  /// Number of processes in the group (1 for a single process).
  int world_size() const { return world_size_; }
  /// This process's rank among those on its machine (torchrun's LOCAL_RANK):
  /// the CUDA device index it uses.
  int local_rank() const { return local_rank_; }
  /// More than one rank.
  bool is_distributed() const { return world_size_ > 1; }
  /// Rank 0: the one that prints, logs and writes checkpoints.
  bool is_main() const { return rank_ == 0; }
  /// The device the collectives' tensors live on.
  const torch::Device& device() const { return device_; }
  /// "gloo", "nccl", or "none" for a single process.
  const std::string& backend() const { return backend_name_; }
  /// ProcessGroupOptions::timeout of the group; 0 for a single process.
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// In-place reduction of a dense tensor over all ranks; blocks until done.
  /// `purpose` names it in the reports of a collective that waits long
  /// ("the evaluation's all-reduce"); empty: "all_reduce_".
  void all_reduce_(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                   const std::string& purpose = {});
  /// In place: every rank gets `root`'s values.
  void broadcast_(torch::Tensor& tensor, int root = 0,
                  const std::string& purpose = {});
  /// Broadcasts several tensors of any dtypes (flattened per dtype into one
  /// message each).
  void broadcast_(std::vector<torch::Tensor> tensors, int root = 0,
                  const std::string& purpose = {});
  /// Waits until every rank has called barrier().
  void barrier(const std::string& purpose = {});

  /// Every rank's `shard` side by side in `flat`: rank r's at elements
  /// [r n, (r + 1) n) of the 1-D `flat`, where n is `shard`'s numel, the
  /// same on every rank; `flat` has world_size() n elements and `shard`'s
  /// dtype. A copy of bits (any dtype). Blocks until done. The weights'
  /// gather of sharded optimizer state (ZeRO).
  void all_gather_(torch::Tensor& flat, const torch::Tensor& shard,
                   const std::string& purpose = {});
  /// Sums the 1-D `flat` (world_size() n elements) over the ranks and puts
  /// this rank's slice of the sum, elements [rank n, (rank + 1) n), in
  /// `shard` (n elements, `flat`'s dtype). BF16 is summed in FP32 on Gloo.
  /// Where the backend has no reduce-scatter (Gloo in LibTorch 1.13) it
  /// all-reduces the whole of `flat` and keeps the slice: the same result
  /// for world_size() times the traffic. `flat`'s contents afterwards are
  /// unspecified.
  /// has_reduce_scatter() says which. Blocks until done.
  void reduce_scatter_(torch::Tensor& shard, torch::Tensor& flat,
                       const std::string& purpose = {});
  /// Whether reduce_scatter_() runs the backend's own reduce-scatter (true
  /// for NCCL, Gloo from LibTorch 2.x and a single process) rather than the
  /// all-reduce fallback. Known after the first reduce_scatter_().
  bool has_reduce_scatter() const { return has_reduce_scatter_; }

  /// Checks that every rank passed the same `settings` (the same names with
  /// the same values; the order of names does not matter), through the
  /// rendezvous store, before a collective could fail on mismatched sizes
  /// or, worse, succeed on different runs. A collective: every rank calls
  /// it at the same point. Throws the same c10::Error on every rank when
  /// they differ, naming `what`, the first setting that differs (in rank
  /// 0's order) and its value on each rank, then `advice`. Cheap: one store
  /// round trip of the settings' text; nothing for a single process.
  void check_same(const std::string& what,
                  const std::vector<RankSetting>& settings,
                  const std::string& advice = "");

  /// Runs `work` on this rank, then agrees with the others on whether it
  /// succeeded everywhere (one all-reduce on the group's device), so that a
  /// failure on some ranks (one node's missing file, a damaged copy of a
  /// checkpoint) stops every rank at once instead of leaving the others
  /// waiting in their next collective until the timeout. When `work` threw
  /// on any rank (any exception, not c10::Error alone), every rank throws: a
  /// rank that failed its own error (a c10::Error's message without its
  /// backtrace, any other exception as it was thrown), the others a
  /// c10::Error that names the failed ranks and the first one's message (its
  /// first 1000 bytes): "lamp: rank 1 failed in reading the data: ... (rank
  /// 0 stops too)." `what` names the work. A collective: every rank calls it
  /// at the same point. One process: `work`, its error as it is.
  ///
  /// \code
  ///   group->agree("reading the data", [&] { data = read_my_data(path); });
  /// \endcode
  void agree(const std::string& what, const std::function<void()>& work);

  /// Before this rank stops on an error of its own that the others do not
  /// share (an exception in its training step, a file it cannot write), tells
  /// them why: another rank's collective that then fails ("Connection closed
  /// by peer") or waits past its report interval names it, "rank 1 stopped:
  /// ...", on rank 0, whose output the user reads. Trainer::fit calls it
  /// with its error. Best effort, through the rendezvous store: at most 2 s,
  /// and nothing where the store does not answer (outside torchrun rank 0
  /// serves it, so rank 0's own reason reaches no one once it has exited).
  /// Nothing for a single process, nor once a collective of this rank has
  /// failed (its error is then another rank's stop, not a reason of its
  /// own). An empty `why` takes back the reason this rank left before (a
  /// trainer that caught its error and goes on with the group; fit() does
  /// so as it starts); without one it costs nothing.
  void leave_word(const std::string& why) const;

  /// An all-reduce (sum) that runs in the background; wait() blocks until it
  /// is done and rethrows its error. Used for overlapping gradient buckets.
  class Work {
   public:
    virtual ~Work() = default;
    /// Blocks until the all-reduce is done and its sum is in the tensor;
    /// throws the collective's error (a failed or timed-out rank). A second
    /// call does nothing.
    virtual void wait() = 0;
  };
  /// Starts summing `tensor` over all ranks, in place, and returns at once;
  /// `tensor` holds the sum once Work::wait() returns, and must not be used
  /// before. BF16 is reduced in FP32 on Gloo. A single process gets a Work
  /// that is already done. `purpose` as for all_reduce_().
  std::unique_ptr<Work> all_reduce_async_(torch::Tensor& tensor,
                                          const std::string& purpose = {});
  /// reduce_scatter_() that returns at once: `shard` holds this rank's
  /// slice of the sum once Work::wait() returns, and neither tensor may be
  /// used before. Without the backend's reduce-scatter (has_reduce_scatter()
  /// false: Gloo in LibTorch 1.13) `flat` is all-reduced and wait() copies
  /// the slice. ZeRO stage 2's gradient buckets.
  std::unique_ptr<Work> reduce_scatter_async_(torch::Tensor& shard,
                                              torch::Tensor& flat,
                                              const std::string& purpose = {});

 private:
  [[noreturn]] void fail_collective(const char* what,
                                    const std::exception& error) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  torch::Device device_;
  std::string backend_name_ = "none";
  std::chrono::milliseconds timeout_{0};
  // Where the ranks met ("HOST:PORT"), for messages.
  std::string address_;
  // check_same() calls so far: each has its own store keys.
  int64_t checks_ = 0;
  // Cleared when the backend refuses reduce-scatter.
  bool has_reduce_scatter_ = true;

  // The tests' way in (src/distributed/process_group_seam.h).
  friend struct lamp::detail::ProcessGroupSeam;
};

/// A GradScaler found-inf reduction (GradScaler::set_found_inf_reduction)
/// that takes the maximum of the overflow flag over `group`'s ranks, so that
/// every rank skips or steps together; nullptr (no reduction) for a
/// one-process group or nullptr.
///
/// \code
///   scaler.set_found_inf_reduction(
///       lamp::distributed::found_inf_reduction(group));
/// \endcode
std::function<void(torch::Tensor&)> found_inf_reduction(
    std::shared_ptr<ProcessGroup> group);

} // namespace distributed
} // namespace lamp
