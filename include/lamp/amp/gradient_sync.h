#pragma once

/// \file
/// What TrainStep asks of data-parallel training, without knowing how the
/// replicas communicate. lamp::distributed::DataParallel implements it over a
/// process group (lamp/distributed/data_parallel.h); another transport
/// implements these five calls.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lamp/amp/optimizer_sharding.h"

namespace lamp {

/// Keeps the gradients of model replicas (one per process) equal. TrainStep
/// calls, per micro-batch: before_forward(); set_sync(last micro-batch of the
/// accumulation cycle); the backward; and at the end of a cycle
/// finish_gradient_sync() before the optimizer step. Its GradScaler
/// combines the overflow flags with reduce_found_inf(), so that every
/// replica skips or steps together.
class GradientSync {
 public:
  virtual ~GradientSync() = default;

  /// Before each forward (e.g. broadcast rank 0's BatchNorm statistics).
  virtual void before_forward() = 0;
  /// Whether the coming backward synchronises; false for the micro-batches
  /// whose gradients only accumulate.
  virtual void set_sync(bool sync) = 0;
  /// After the backward that ends a cycle: afterwards every replica's .grad
  /// holds the average over the replicas.
  virtual void finish_gradient_sync() = 0;
  /// Replaces `found_inf` (a one-element FP32 tensor, 1 where this replica
  /// saw an inf/NaN gradient) in place by its maximum over the replicas.
  virtual void reduce_found_inf(torch::Tensor& found_inf) = 0;
  /// Replaces every element of `values` (an FP32 tensor on device()) in
  /// place by its maximum over the replicas: the FP8 layers' amaxes
  /// (lamp::nn::update_float8_scales()), so that every replica scales alike.
  /// The default reduces one element at a time with reduce_found_inf();
  /// lamp's DataParallel does it in one all-reduce.
  virtual void reduce_max_(torch::Tensor& values) {
    for (int64_t i = 0; i < values.numel(); ++i) {
      auto one = values.view({-1}).narrow(0, i, 1).clone();
      reduce_found_inf(one);
      values.view({-1}).narrow(0, i, 1).copy_(one);
    }
  }
  /// The device the replicas communicate on; TrainStep refuses a model on
  /// another.
  virtual torch::Device device() const = 0;
  /// Fails on every replica, naming the first setting that differs and its
  /// value on each, when the replicas were given different `settings`
  /// (TrainStep passes its precision, accumulation steps, clipping and loss
  /// scaling at construction). The default compares nothing, for a
  /// transport that cannot.
  virtual void check_same_settings(
      const std::string& what,
      const std::vector<std::pair<std::string, std::string>>& settings) {
    (void)what;
    (void)settings;
  }
  /// The sharding of the optimizer state over the replicas (ZeRO stage 1),
  /// or nullptr to keep it whole on every replica (the default). TrainStep
  /// asks once, before it builds the optimizer.
  virtual std::unique_ptr<OptimizerSharding> optimizer_sharding() {
    return nullptr;
  }
};

/// Builds the GradientSync for TrainStep's model, or nullptr for plain
/// training (as for a one-process group). TrainStep calls it after the
/// precision conversion (replicas synchronise in the dtype they train in)
/// and before the FP32 master copy (which then starts from the synchronised
/// weights).
using GradientSyncFactory = std::function<std::unique_ptr<GradientSync>(
    const std::shared_ptr<torch::nn::Module>& model)>;

} // namespace lamp
