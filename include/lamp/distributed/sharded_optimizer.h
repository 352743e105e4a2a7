#pragma once

/// \file
/// Optimizer state sharded across ranks (ZeRO stage 1, as PyTorch's
/// ZeroRedundancyOptimizer and DeepSpeed's stage 1): each rank keeps the
/// FP32 master weights, their gradient and the optimizer state of one
/// shard of the parameters, steps only that, and gathers the updated
/// weights from the others.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "lamp/amp/grad_scaler.h"
#include "lamp/amp/optimizer_sharding.h"
#include "lamp/distributed/process_group.h"
#include "lamp/distributed/shard_layout.h"

namespace lamp {
namespace distributed {

/// ZeRO stage 1 for a loop of your own, after the gradients are averaged
/// over the ranks (DataParallel::finish_gradient_sync(), or the same data
/// on every rank):
///
/// \code
///   lamp::distributed::DataParallel dp(model.ptr(), group);
///   lamp::distributed::ShardedOptimizer opt(
///       model->parameters(),
///       [](std::vector<torch::Tensor> shard) {
///         return std::make_unique<torch::optim::AdamW>(
///             std::move(shard), torch::optim::AdamWOptions(3e-4));
///       },
///       group);
///   for (...) {
///     opt.zero_grad();
///     dp.before_forward();
///     loss_of(model, batch).backward();
///     dp.finish_gradient_sync();
///     opt.step();  // this rank's shard, then every rank's weights
///   }
/// \endcode
///
/// Each parameter once: for a model with a weight tied between two modules
/// (a GPT's embedding and head), which Module::parameters() lists twice,
/// give lamp::unique_parameters(*model); a tensor given twice is refused.
///
/// The parameters of each dtype lie end to end in a ShardLayout over the
/// group's ranks; rank r's shard of each is one FP32 tensor (the master
/// weights, exact for FP16/BF16 models as MasterWeights is) with its
/// gradient, and the optimizer that `make_optimizer` builds steps those
/// tensors only. step() copies this rank's part of the (averaged) gradients
/// into them, steps, casts the updated shard to the parameters' dtype and
/// all-gathers it (ProcessGroup::all_gather_) into every rank's
/// parameters. Per rank that keeps 1/N of the FP32 weights, gradients and
/// optimizer state (state_bytes()), plus fewer than N elements of padding
/// per dtype.
///
/// Param groups (weight decay on the matrices only, as GPT recipes split
/// them; a learning rate per group): build the optimizer over the
/// parameters yourself and hand it over, before its first step:
///
/// \code
///   std::vector<torch::Tensor> decay, no_decay;
///   for (const auto& p : model->parameters()) {
///     (p.dim() >= 2 ? decay : no_decay).push_back(p);
///   }
///   auto adamw = std::make_unique<torch::optim::AdamW>(
///       std::vector<torch::optim::OptimizerParamGroup>{
///           {decay, std::make_unique<torch::optim::AdamWOptions>(
///                       torch::optim::AdamWOptions(6e-4).weight_decay(0.1))},
///           {no_decay, std::make_unique<torch::optim::AdamWOptions>(
///                          torch::optim::AdamWOptions(6e-4).weight_decay(0))}},
///       torch::optim::AdamWOptions(6e-4));
///   lamp::distributed::ShardedOptimizer opt(model->parameters(),
///                                           std::move(adamw), group);
/// \endcode
///
/// Inside TrainStep the same sharding runs with DataParallelOptions::zero_stage
/// 1, param groups included (optimizer_sharding()).
///
/// The optimizer must act on each element alone (SGD, Adam, AdamW, their
/// momentum, weight decay and step counts): one that looks across a
/// tensor (LAMB's trust ratio, a per-tensor norm) would see shards, not
/// parameters. A parameter without a gradient in a step counts as a zero
/// gradient, as DataParallel does.
///
/// Loss scaling and clipping act on this rank's shard of the gradients, as
/// PyTorch's sequence does on the whole:
///
/// \code
///   scaler.scale(loss).backward();
///   dp.finish_gradient_sync();
///   opt.unscale_(scaler);          // this rank's shard; the ranks agree
///   opt.clip_grad_norm_(1.0);      // the norm over every rank's shard
///   opt.step(scaler);              // every rank steps, or every rank skips
///   scaler.update();
/// \endcode
///
/// save() and load() checkpoint this rank's shards and optimizer state; the
/// model's weights are the parameters (for FP32 parameters the masters
/// themselves, for BF16/FP16 ones their rounding). load_resharded() resumes
/// them on another number of ranks.
class ShardedOptimizer {
 public:
  /// Builds the optimizer of this rank's shard from its FP32 tensors (one
  /// per parameter dtype).
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::Tensor>)>;

  /// `params` (the same list, in the same order, of the same shapes and
  /// dtypes on every rank, checked through the group; their values equal
  /// on every rank, as DataParallel's broadcast leaves them) are the
  /// parameters to train, on the group's device.
  ShardedOptimizer(std::vector<torch::Tensor> params, Factory make_optimizer,
                   std::shared_ptr<ProcessGroup> group);
  /// An optimizer with param groups of its own: `optimizer` was built over
  /// `params` (as above) and has not stepped. Each group keeps its options
  /// and steps this rank's FP32 shards of its parameters instead of them,
  /// one shard per (group, dtype) in the order of shards(); a parameter in
  /// no group is not stepped. Every rank must give the same groups (checked
  /// through the group, as the parameters are).
  ShardedOptimizer(std::vector<torch::Tensor> params,
                   std::unique_ptr<torch::optim::Optimizer> optimizer,
                   std::shared_ptr<ProcessGroup> group);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  /// Steps this rank's shard with the parameters' gradients, then gathers
  /// every rank's updated shard into the parameters.
  void step();
  /// step() through `scaler` (GradScaler::step on the shard's optimizer):
  /// the shard's gradients unscaled (unless unscale_() did it) and the step
  /// skipped where any rank's shard held an inf/NaN, on every rank alike.
  /// Returns whether the optimizer stepped. Call scaler.update() after it.
  bool step(GradScaler& scaler);
  /// Copies this rank's part of the parameters' gradients into its shard
  /// (if not done since the last step) and divides them by the scale
  /// (GradScaler::unscale_ on the shard's optimizer), the overflow flag
  /// agreed over the ranks (the maximum): what PyTorch's
  /// `scaler.unscale_(optimizer)` does, for clipping before step(scaler).
  void unscale_(GradScaler& scaler);
  /// Clips the shard's gradients (copied from the parameters' if not done
  /// since the last step) so that the norm of the whole gradient, over
  /// every rank's shard, is at most `max_norm` (lamp::optim::clip_grad_norm_'s
  /// rule), and returns that norm before clipping, the same on every rank.
  /// A collective. The parameters' own gradients are left as they are.
  torch::Tensor clip_grad_norm_(double max_norm);
  /// Resets the parameters' gradients (to undefined, as
  /// torch::optim::Optimizer::zero_grad(true) does).
  void zero_grad();

  /// Writes this rank's FP32 shards and its optimizer's state (the options
  /// of each group, the step counts and moments of its shards), with the
  /// world size and rank and the layout of the shards. One archive per rank:
  /// each holds its own shard.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what save() wrote on this rank: the shards, the optimizer's
  /// state, and the parameters gathered from the shards. A collective:
  /// every rank calls it together. Every rank checks its archive first (the
  /// same world size and rank, the same parameters in the same param
  /// groups, finite shards, state of the shards' shapes); when any rank's
  /// is refused, every rank throws (naming the reason, or the rank that
  /// refused) and nothing changes on any rank.
  void load(torch::serialize::InputArchive& archive);
  /// load() of the archives that every rank of a run over any number of
  /// ranks saved: `every_rank[k]` is what rank k's save() wrote. Each rank
  /// passes all of them, in rank order, and takes its own shard of the
  /// master weights and optimizer state, cut anew for this group's number
  /// of ranks (one rank's archive for a run of N, or N's for one). The
  /// parameters and param groups must be the same; each state tensor the
  /// size of a shard (torch::optim's SGD, Adam, AdamW, RMSprop, Adagrad) is
  /// joined and cut anew, every other value (a step count) must be the same
  /// in every archive. Each rank holds every rank's state while it loads. A
  /// collective, all or nothing as load() is: when any rank refuses (the
  /// archives out of order or of two saves, a damaged shard), every rank
  /// throws and nothing changes.
  void load_resharded(std::vector<torch::serialize::InputArchive>& every_rank);

  /// The optimizer of this rank's shard (its learning rate, its state).
  torch::optim::Optimizer& optimizer();
  /// This rank's FP32 shard of each parameter dtype, in the order the
  /// dtypes first appear in `params`.
  const std::vector<torch::Tensor>& shards() const;
  /// The layout of the parameters of each dtype, in the order of shards().
  const std::vector<ShardLayout>& layouts() const;
  /// Bytes this rank holds for training: its FP32 shards, their gradients
  /// and the optimizer's state tensors for them (SGD's momentum, Adam's
  /// and AdamW's moments; state of other optimizers is not counted).
  int64_t state_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// ZeRO stage 1 for TrainStep: what DataParallel gives TrainStep with
/// DataParallelOptions::zero_stage 1 (see lamp::OptimizerSharding). The
/// parameters of each (param group, dtype) pair lie end to end in a
/// ShardLayout; this rank keeps an FP32 shard of each, and the optimizer's
/// param groups step those shards (each group's options stay its own, so
/// weight-decay groups work). The optimizer must act on each element alone,
/// as for ShardedOptimizer.
std::unique_ptr<OptimizerSharding> optimizer_sharding(
    std::shared_ptr<ProcessGroup> group);

/// Bytes of the state tensors of `optimizer` whose kind lamp knows (SGD's
/// momentum, Adam's and AdamW's moments); 0 for other optimizers' state.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

} // namespace distributed
} // namespace lamp
