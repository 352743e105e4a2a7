#pragma once

/// \file
/// Data-parallel training on LibTorch's own distributed engine (c10d, the
/// layer under Python's DistributedDataParallel): a process group set up
/// from the environment that `torchrun` gives each process, and a gradient
/// synchroniser with DDP's semantics. TrainStep and ClassifierTrainer use
/// them when given a process group of more than one rank.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <c10/util/Optional.h>
#include <torch/arg.h>

namespace lamp {
namespace distributed {

/// What `torchrun` (torch.distributed.run) sets in each process it starts.
struct Environment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
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
  /// malformed set (RANK without WORLD_SIZE, RANK >= WORLD_SIZE, a port that
  /// is not a number, ...) throws, naming the variable.
  static c10::optional<Environment> from_env();
};

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
  /// before failing with an error (instead of hanging on a dead rank).
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(10);
};

/// The reduction of all_reduce_().
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
///   auto group =
///   lamp::distributed::ProcessGroup::from_environment(torch::kCPU);
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
  /// becomes cuda:LOCAL_RANK.
  static std::shared_ptr<ProcessGroup> from_environment(
      torch::Device device, ProcessGroupOptions options = {});

  /// Rendezvous through a TCPStore at env.master_addr:env.master_port, then
  /// the Gloo or NCCL backend. Fails with an error naming the address, the
  /// ranks and the timeout when the other ranks do not arrive in time.
  static std::shared_ptr<ProcessGroup> create(const Environment& env,
                                              torch::Device device,
                                              ProcessGroupOptions options = {});

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  /// More than one rank.
  bool is_distributed() const { return world_size_ > 1; }
  /// Rank 0: the one that prints, logs and writes checkpoints.
  bool is_main() const { return rank_ == 0; }
  const torch::Device& device() const { return device_; }
  /// "gloo", "nccl", or "none" for a single process.
  const std::string& backend() const { return backend_name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// In-place reduction of a dense tensor over all ranks; blocks until done.
  void all_reduce_(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  /// In place: every rank gets `root`'s values.
  void broadcast_(torch::Tensor& tensor, int root = 0);
  /// Broadcasts several tensors of any dtypes (flattened per dtype into one
  /// message each).
  void broadcast_(std::vector<torch::Tensor> tensors, int root = 0);
  /// Waits until every rank has called barrier().
  void barrier();

  /// An all-reduce (sum) that runs in the background; wait() blocks until it
  /// is done and rethrows its error. Used for overlapping gradient buckets.
  class Work {
   public:
    virtual ~Work() = default;
    virtual void wait() = 0;
  };
  std::unique_ptr<Work> all_reduce_async_(torch::Tensor& tensor);

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
};

/// How DataParallel synchronises gradients.
struct DataParallelOptions {
  /// Gradient bucket size in MiB (DDP's bucket_cap_mb): all-reduces of about
  /// this size start as soon as their gradients are ready during backward.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Broadcast rank 0's buffers (BatchNorm running statistics) before every
  /// forward, as DDP's broadcast_buffers=True does. Off: each rank keeps its
  /// own statistics (they then differ between ranks).
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Communicate FP32 gradients in this dtype (kHalf or kBFloat16: half the
  /// bytes), averaged before the cast, restored to FP32 after (Python's
  /// fp16_compress_hook / bf16_compress_hook). nullopt: in their own dtype.
  TORCH_ARG(c10::optional<torch::Dtype>, communication_dtype) = c10::nullopt;
};

/// Data-parallel gradient averaging for one model replica per rank, with
/// DDP's semantics:
///  1. construction broadcasts rank 0's parameters and buffers, so every
///     rank starts from the same weights;
///  2. before each forward (before_forward()), rank 0's buffers are
///     broadcast (broadcast_buffers);
///  3. during backward, a hook after each parameter's gradient accumulation
///     copies the gradient (divided by the world size) into its bucket;
///     a full bucket's all-reduce starts at once, in the same bucket order on
///     every rank, overlapping the rest of backward;
///  4. finish_gradient_sync() waits for the buckets and writes the averaged
///     gradients back into the parameters' .grad. A parameter that got no
///     gradient in this backward counts as zero, so that every rank steps
///     identically (it then has a zero .grad after the sync).
/// Buckets hold parameters of one dtype and device, filled in reverse
/// registration order (roughly the order backward produces gradients).
/// With gradient accumulation, call set_sync(false) for the micro-steps
/// whose gradients only accumulate (DDP's no_sync()).
///
/// Example (TrainStep does all of this when given a process group):
/// \code
///   lamp::distributed::DataParallel dp(model.ptr(), group);
///   dp.before_forward();
///   loss.backward();
///   dp.finish_gradient_sync();
///   optimizer.step();
/// \endcode
class DataParallel {
 public:
  DataParallel(std::shared_ptr<torch::nn::Module> model,
               std::shared_ptr<ProcessGroup> group,
               DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Broadcasts rank 0's buffers when broadcast_buffers is on.
  void before_forward();
  /// Whether the next backward synchronises (true by default).
  void set_sync(bool sync);
  /// Waits for every bucket and writes the averaged gradients; a no-op after
  /// a backward with set_sync(false).
  void finish_gradient_sync();

  int64_t bucket_count() const;
  const ProcessGroup& group() const { return *group_; }

 private:
  struct Impl;
  // Shared with the gradient hooks, which outlive this object on the
  // model's parameters and check that it is still there.
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<ProcessGroup> group_;
};

} // namespace distributed
} // namespace lamp
