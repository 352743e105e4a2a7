#pragma once

/// \file
/// What TrainStep asks of optimizer state sharded across data-parallel
/// replicas (ZeRO stages 1 and 2), without knowing how they communicate.
/// lamp::distributed implements it over a process group
/// (DataParallelOptions::zero_stage, lamp/distributed/sharded_optimizer.h).

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

namespace lamp {

/// Keeps one replica's shard of the FP32 master weights and optimizer
/// state. TrainStep builds the optimizer over the parameters it trains,
/// then calls shard(); per optimizer step, after the gradients are
/// averaged: gradients_to_shards(), the unscale (its overflow flag
/// combined over the replicas by GradientSync::reduce_found_inf), the
/// clipping (its sum of squares combined by reduce_square_sum()), the
/// optimizer step, and shards_to_parameters().
class OptimizerSharding {
 public:
  virtual ~OptimizerSharding() = default;

  /// Replaces the parameters of each of `optimizer`'s param groups (built
  /// over `params`, before any step; `names` are theirs) by this replica's
  /// FP32 shards of them, and starts the shards from the parameters'
  /// values. Throws when the replicas' parameters or groups differ.
  virtual void shard(torch::optim::Optimizer& optimizer,
                     const std::vector<torch::Tensor>& params,
                     const std::vector<std::string>& names) = 0;
  /// This replica's FP32 shards, in the optimizer's order.
  virtual const std::vector<torch::Tensor>& shards() const = 0;
  /// A name for each of shards(), for messages ("the shard of param group
  /// 0 (BFloat16)").
  virtual const std::vector<std::string>& shard_names() const = 0;
  /// Copies this replica's part of the parameters' (averaged) gradients
  /// into the shards' gradients (zero for a parameter without one). Stage
  /// 2 does nothing here: the gradient sync put them there.
  virtual void gradients_to_shards() = 0;
  /// Gathers every replica's updated shards into the parameters, in their
  /// dtype.
  virtual void shards_to_parameters() = 0;
  /// The whole FP32 master weights: one tensor per parameter given to
  /// shard(), in that order, each of the parameter's shape (a parameter in
  /// no param group: its own values in FP32). A collective: every replica
  /// calls it. For exporting the FP32 weights of an FP16/BF16 model.
  virtual std::vector<torch::Tensor> gather_masters() = 0;
  /// Sets the master weights from whole values: one tensor per parameter
  /// given to shard(), in that order, of its shape (any floating dtype);
  /// this replica copies its pieces into its shards. No collective: the
  /// parameters keep their values until the next shards_to_parameters().
  /// For loading FP32 weights into a sharded step (a fine-tuning start).
  virtual void set_masters(const std::vector<torch::Tensor>& values) = 0;
  /// Replaces `square_sum` (a one-element FP32 tensor: this replica's sum
  /// of squared gradient elements) in place by its sum over the replicas.
  virtual void reduce_square_sum(torch::Tensor& square_sum) = 0;
  /// Writes the layout (world size, rank, the elements of each shard) and
  /// the shards' values.
  virtual void save(torch::serialize::OutputArchive& archive) const = 0;
  /// Checks what save() wrote against this replica: the same world size,
  /// rank and layout, finite values. Throws naming the difference; changes
  /// nothing.
  virtual void check(torch::serialize::InputArchive& archive,
                     const std::string& where) const = 0;
  /// Loads what check() accepted.
  virtual void load(torch::serialize::InputArchive& archive) = 0;
  /// Runs `work` (checks that may fail on some replicas only: each reads
  /// its own archive) and agrees with the other replicas before any goes
  /// on: when it threw on any replica (any exception, a std::bad_alloc as
  /// well as a c10::Error), every replica throws, so that none goes on
  /// alone into a collective the others never reach; the replica that
  /// threw gets its exception back, the others a c10::Error naming it. `what` names
  /// the work in the other replicas' message ("checking the checkpoint").
  /// TrainStep's load() and load_resharded() check through it. A
  /// collective. The default, for one replica, runs `work`.
  virtual void agree(const std::string& what,
                     const std::function<void()>& work) {
    (void)what;
    work();
  }
  /// Re-shards a checkpoint of a run over another number of replicas: from
  /// what each of its N replicas saved (`shards[k]`: replica k's save();
  /// `optimizers[k]`: its optimizer's save()), writes what this replica
  /// would have saved in their place into `shard_out` and `optimizer_out`,
  /// for check() and load(). The model and param groups must be the same.
  /// The optimizer's state must be in torch::optim's layout (SGD, Adam,
  /// AdamW, RMSprop, Adagrad and lamp's): each state tensor the size of a
  /// shard is joined and cut anew, every other value (a step count) must
  /// be equal on the N replicas. Throws naming the archive and what
  /// differs. No collective; N may equal this run's number.
  virtual void reshard(std::vector<torch::serialize::InputArchive>& shards,
                       std::vector<torch::serialize::InputArchive>& optimizers,
                       torch::serialize::OutputArchive& shard_out,
                       torch::serialize::OutputArchive& optimizer_out,
                       const std::string& where) const = 0;
};

} // namespace lamp
