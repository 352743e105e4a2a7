#pragma once

// The trainer's divergence checks: skipped steps and non-finite losses
// counted on the device (a sync-free step's flag lives there) and read once
// per window of `patience` steps and at the end of each epoch, so that a
// run that diverges stops however short its epochs are, without a host read
// per step. Every stop is one message: the epoch, what happened, what to
// change, and that the checkpoint was left as it was.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "lamp/amp/train_step.h"
#include "lamp/training/trainer.h"

#include "platform/number_text.h"

namespace lamp {
namespace training {
namespace detail {

class DivergenceWatch {
 public:
  /// Names the first module with inf/NaN, as a phrase, or "" when unknown.
  using Locate = std::function<std::string()>;
  /// The maximum of a count over the ranks (a collective every rank calls
  /// at the same step), so that they stop together.
  using ReduceMax = std::function<int64_t(int64_t)>;

  /// Counters on `device`; messages name settings through `options`, quote
  /// `scaler`'s scale and add what `locate` (optional) finds. `reduce_max`
  /// (optional: one process) decides a window's non-finite losses over the
  /// ranks.
  DivergenceWatch(const torch::Device& device, const TrainerOptions& options,
                  const GradScaler& scaler, Locate locate = nullptr,
                  ReduceMax reduce_max = nullptr);

  /// Starts an epoch's counts (skipped steps).
  void begin_epoch();
  /// Counts one step: its loss (inf/NaN or not) and, at the end of an
  /// accumulation cycle, whether the optimizer step was skipped. Then, once
  /// per `patience` steps, reads the counters: a run of `patience` skipped
  /// steps, or of `patience` non-finite losses in a row (on any rank, with
  /// `reduce_max`; across windows too), stops the run.
  void record(int64_t epoch, const StepResult& result);

  /// Non-finite losses since the watch began: the live device counter
  /// (int64) for progress displays, and a host read.
  const torch::Tensor& non_finite_losses() const { return non_finite_; }
  int64_t read_non_finite_losses() const;
  /// Optimizer steps skipped in this epoch (a host read).
  int64_t read_epoch_skipped() const;

  /// The end of an epoch of `steps` steps, `non_finite` of whose losses were
  /// inf/NaN and whose finite ones averaged `train_loss`: stops a run of
  /// skipped steps that reached `patience` in the last window, an epoch
  /// without a finite loss or with a non-finite mean, and weights or buffers
  /// of `model` that hold inf/NaN.
  void check_epoch(int64_t epoch, int64_t steps, int64_t non_finite,
                   double train_loss, const torch::nn::Module& model) const;
  /// Stops on a non-finite test loss (finite but huge weights show there).
  void check_test_loss(int64_t epoch, double test_loss) const;

 private:
  [[noreturn]] void diverged(int64_t epoch, const std::string& why,
                             const std::string& fix) const;
  void check_skip_run(int64_t epoch) const;
  std::string lower_lr() const;

  const TrainerOptions& options_;
  const GradScaler& scaler_;
  Locate locate_;
  ReduceMax reduce_max_;
  // ", clip gradients, or train in bf16/amp-bf16." and what BF16 costs on
  // the device where it is emulated.
  std::string bf16_advice_;
  int64_t patience_;
  torch::Tensor consecutive_skips_; // FP32 counters: a step's flag is FP32
  torch::Tensor longest_skip_run_;
  torch::Tensor epoch_skipped_;
  torch::Tensor non_finite_; // int64, since the watch began
  // int64: the inf/NaN losses in a row up to the last step, and the most
  // in a row since the watch began.
  torch::Tensor consecutive_non_finite_;
  torch::Tensor longest_non_finite_run_;
  int64_t window_ = 0;
};

/// The first parameter or floating-point buffer of `model` with inf/NaN
/// values, as "parameter 'fc.weight'", or "" when all are finite.
std::string first_non_finite(const torch::nn::Module& model);

/// The first module with inf/NaN in `inputs`/`targets`' forward (through
/// `step`'s input cast and autocast, `task`'s loss, scaled where
/// `step` scales it) and backward, found by a NumericsCheck as step
/// `step_number` (NumericsFinding::to_string()), or "" when none is found or
/// the pass fails. Nothing is applied twice: no optimizer step, the backward
/// accumulates into fresh gradients and the step's own gradient tensors are
/// put back, and the buffers (BatchNorm's running statistics) are restored.
std::string rerun_under_check(
    const std::shared_ptr<torch::nn::Module>& model, TrainStep& step,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const Task& task, const torch::Tensor& inputs, const torch::Tensor& targets,
    int64_t step_number, bool loss_scaled);

/// lamp::detail::exact (platform/number_text.h), as the trainer's code
/// names it.
using lamp::detail::exact;

} // namespace detail
} // namespace training
} // namespace lamp
