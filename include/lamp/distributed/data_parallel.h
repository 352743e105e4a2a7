#pragma once

/// \file
/// Data-parallel gradient averaging with DDP's semantics
/// (DistributedDataParallel), the lamp::GradientSync that TrainStep uses for
/// training over a process group.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include "lamp/amp/gradient_sync.h"
#include "lamp/distributed/process_group.h"

namespace lamp {
namespace distributed {

/// How DataParallel synchronises gradients.
struct DataParallelOptions {
  /// The largest bucket_cap_mb DataParallel accepts: 2^20 MiB (1 TiB), more
  /// than any device holds, far below where the size in bytes overflows.
  static constexpr int64_t kMaxBucketCapMb = int64_t{1} << 20;
  /// Gradient bucket size in MiB (DDP's bucket_cap_mb): all-reduces of about
  /// this size start as soon as their gradients are ready during backward.
  /// Finite, positive and at most kMaxBucketCapMb.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Broadcast rank 0's buffers (BatchNorm running statistics) before every
  /// forward, as DDP's broadcast_buffers=True does. Off: each rank keeps its
  /// own statistics (they then differ between ranks).
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Communicate FP32 gradients in this dtype (kHalf or kBFloat16: half the
  /// bytes), cast and then averaged, restored to FP32 after, in the order
  /// of Python's fp16_compress_hook / bf16_compress_hook: a gradient beyond
  /// kHalf's range (65504, which a GradScaler's scale can reach) becomes
  /// inf, and the scaler skips the step and backs off. nullopt: in their
  /// own dtype.
  TORCH_ARG(c10::optional<torch::Dtype>, communication_dtype) = c10::nullopt;
  /// Shard the optimizer state over the ranks (ZeRO, as DeepSpeed's stages
  /// and PyTorch's ZeroRedundancyOptimizer). 0: every rank keeps all of it
  /// (DDP). 1: gradients are averaged as with 0, then each rank keeps and
  /// steps only its shard of the FP32 master weights and the optimizer
  /// state (1/N of each, lamp::distributed::optimizer_sharding()) and the
  /// updated weights are all-gathered in the model's dtype: in mixed
  /// precision with Adam, 16 bytes per parameter per rank become 4 + 12/N.
  /// TrainStep's checkpoints then hold each rank's shard (TrainStep::save),
  /// and TrainStep::load_resharded() resumes them on another number of
  /// ranks (one included).
  /// The optimizer must act on each element alone (SGD, Adam, AdamW).
  /// Stage 2 also shards the gradients: each (param group, dtype) is laid
  /// out in runs of at most bucket_cap_mb, and as the backward fills a run
  /// it is reduce-scattered straight into this rank's FP32 shard gradient
  /// (an all-reduce and a slice on LibTorch 1.13's Gloo, which has no
  /// reduce-scatter); the parameters' own gradients are released as their
  /// run takes them, and the run's buffer after its reduce-scatter. Every
  /// trainable parameter must be in the optimizer; communication_dtype is
  /// refused.
  TORCH_ARG(int, zero_stage) = 0;
};

/// Data-parallel gradient averaging for one model replica per rank, with
/// DDP's semantics:
///  1. construction checks that every rank has the same model (parameter
///     and buffer names, shapes, dtypes, which are trained) and the same
///     options, refusing on every rank with the first difference, then
///     broadcasts rank 0's parameters (frozen ones too) and buffers, so
///     every rank starts from the same weights;
///  2. before each forward (before_forward()), rank 0's buffers are
///     broadcast (broadcast_buffers);
///  3. during backward, a hook after each parameter's gradient accumulation
///     copies the gradient (divided by the world size) into its bucket;
///     a full bucket's all-reduce starts at once, in the same bucket order on
///     every rank, overlapping the rest of backward;
///  4. finish_gradient_sync() waits for the buckets and writes the averaged
///     gradients back into the parameters' .grad. A parameter that got no
///     gradient in this backward counts with the .grad it holds (what it
///     accumulated in the micro-batches before, under set_sync(false)), or
///     as zero where it has none, so that every rank steps identically (it
///     then has a zero .grad after the sync).
/// Buckets hold parameters of one dtype and device, filled in reverse
/// registration order (roughly the order backward produces gradients).
/// With gradient accumulation, call set_sync(false) for the micro-steps
/// whose gradients only accumulate (DDP's no_sync()). A weight tied
/// between two submodules is one parameter: one hook, one slot
/// (lamp::unique_parameters()).
///
/// Thread safety: one thread at a time per object calls its methods (and
/// runs the backward); the gradient hooks, which the autograd engine may run
/// on its own threads, take a lock. Different DataParallels on different
/// threads are fine.
///
/// Example (TrainStep does all of this when given
/// `gradient_sync(lamp::distributed::data_parallel(group))`):
/// \code
///   lamp::distributed::DataParallel dp(model.ptr(), group);
///   dp.before_forward();
///   loss.backward();
///   dp.finish_gradient_sync();
///   optimizer.step();
/// \endcode
class DataParallel final : public GradientSync {
 public:
  /// Registers the gradient hooks on `model`'s trainable parameters and
  /// broadcasts rank 0's parameters and buffers: a collective, so every rank
  /// constructs its DataParallel at the same point. Every parameter is
  /// broadcast, frozen ones (requires_grad false) too; only the trainable
  /// ones are hooked and averaged. TORCH_CHECK error for a null model or
  /// group, a bucket_cap_mb that is not finite, positive and at most
  /// DataParallelOptions::kMaxBucketCapMb, a
  /// communication_dtype other than kHalf, kBFloat16 or kFloat, a
  /// trainable parameter that is not on the group's device, or a model or
  /// options that differ between the ranks (on every rank, naming the first
  /// parameter, buffer or option that differs and its value on each rank).
  DataParallel(std::shared_ptr<torch::nn::Module> model,
               std::shared_ptr<ProcessGroup> group,
               DataParallelOptions options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Broadcasts rank 0's buffers when broadcast_buffers is on, and hooks
  /// again a parameter whose data was replaced since the last call
  /// (Module::load): call it before each forward.
  void before_forward() override;
  /// Whether the next backward synchronises (true by default).
  void set_sync(bool sync) override;
  /// Waits for every bucket and writes the averaged gradients; a no-op after
  /// a backward with set_sync(false).
  void finish_gradient_sync() override;
  /// The maximum of `found_inf` over the ranks (found_inf_reduction()).
  void reduce_found_inf(torch::Tensor& found_inf) override;
  /// The maximum of each element over the ranks, in one all-reduce.
  void reduce_max_(torch::Tensor& values) override;
  /// ProcessGroup::check_same() over the group.
  void check_same_settings(
      const std::string& what,
      const std::vector<std::pair<std::string, std::string>>& settings)
      override;
  /// The process group's device.
  torch::Device device() const override { return group_->device(); }
  /// optimizer_sharding(group()) with zero_stage 1; nullptr with 0.
  std::unique_ptr<OptimizerSharding> optimizer_sharding() override;

  /// Number of gradient buckets (each one all-reduce per backward), from
  /// the parameters' sizes, dtypes and bucket_cap_mb.
  int64_t bucket_count() const;
  /// The process group the gradients are averaged over.
  const ProcessGroup& group() const { return *group_; }

 private:
  struct Impl;
  // Hooks parameter k's gradient accumulator.
  static void hook(const std::shared_ptr<Impl>& impl, size_t k);
  // Shared with the gradient hooks, which outlive this object on the
  // model's parameters and check that it is still there.
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<ProcessGroup> group_;
  // found_inf_reduction(group_); empty for a one-process group.
  std::function<void(torch::Tensor&)> reduce_found_inf_;
};

/// TrainStep's GradientSync over `group`: a DataParallel with `options`
/// for the model, or none (plain training) for nullptr or a one-process
/// group, except with a zero_stage: a one-process group then shards over
/// its one rank (the same flat FP32 masters and checkpoints as N ranks, so
/// that TrainStep::load_resharded() moves a run between one rank and many).
///
/// \code
///   lamp::TrainStep step(model, make_optimizer,
///       lamp::TrainStepOptions(lamp::Precision::kAMP)
///           .gradient_sync(lamp::distributed::data_parallel(group)));
/// \endcode
GradientSyncFactory data_parallel(std::shared_ptr<ProcessGroup> group,
                                  DataParallelOptions options = {});

} // namespace distributed
} // namespace lamp
