#pragma once

// What a CUDA graph of TrainStep's step baked in, and how a change is
// noticed before the next replay. Private to lamp: tests reach it here.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lamp/amp/grad_scaler.h"
#include "lamp/amp/train_step.h"

namespace lamp {
namespace detail {

/// What a CUDA graph of TrainStep's step baked in, besides the learning rates
/// (read from device tensors) and the values of tensors: record() takes it at
/// a capture, changed() compares it before every step. Host values only
/// (pointers, flags and numbers, no tensor is read): a few microseconds per
/// step for a ResNet-50.
///
/// Watched: the optimizer's param groups (how many, their sizes, which
/// tensors and their storage), their options' type and the options the
/// optimizer says its captured step bakes in
/// (optim::AmpStep::baked_in_options(): SGD's momentum, dampening,
/// weight_decay, nesterov; Adam's and AdamW's betas, eps, weight_decay,
/// amsgrad), the
/// optimizer's state_version() (lamp::optim's), each model parameter's
/// requires_grad and storage, each buffer's storage, each module's
/// is_training(), TrainStepOptions::max_grad_norm and the scaler's options
/// that its update uses (enabled, dynamic, growth_factor, backoff_factor,
/// growth_interval, hysteresis, min_scale, max_scale, min_scale_patience).
class CaptureSignature {
 public:
  /// Watches `model`'s modules, parameters and buffers as registered now (the
  /// lists are taken once) and `options`' max_grad_norm.
  CaptureSignature(const std::shared_ptr<torch::nn::Module>& model,
                   const TrainStepOptions& options);

  /// Records what a capture bakes in now.
  void record(const torch::optim::Optimizer& optimizer,
              const GradScaler& scaler);
  /// "" while everything watched is as record() saw it; otherwise the first
  /// difference, e.g. "param group 0's momentum (0.9 -> 0.5)". Allocates
  /// nothing when nothing changed.
  std::string changed(const torch::optim::Optimizer& optimizer,
                      const GradScaler& scaler);

 private:
  /// One watched value: its kind (and field), where it is, its bits.
  struct Entry {
    uint32_t what = 0;
    uint32_t group = 0;
    uint64_t index = 0;
    uint64_t value = 0;
    bool operator==(const Entry& other) const {
      return what == other.what && group == other.group &&
             index == other.index && value == other.value;
    }
  };
  void compute(const torch::optim::Optimizer& optimizer,
               const GradScaler& scaler, std::vector<Entry>& out) const;
  // The difference between recorded_[i] and `now`, in words.
  std::string describe(size_t i, const Entry& now,
                       const torch::optim::Optimizer& optimizer) const;

  std::vector<std::shared_ptr<torch::nn::Module>> modules_;
  std::vector<std::string> module_names_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> param_names_;
  std::vector<torch::Tensor> buffers_;
  std::vector<std::string> buffer_names_;
  double max_grad_norm_ = 0;
  std::vector<Entry> recorded_, scratch_;
};

} // namespace detail

} // namespace lamp
