#include "training/divergence_watch.h"

#include <torch/torch.h>

#include <cmath>
#include <utility>
#include <vector>

#include "lamp/amp/numerics_check.h"
#include "lamp/amp/precision_support.h"

namespace lamp {
namespace training {
namespace detail {
namespace {

// The advice to leave FP16 for BF16, with what BF16 costs where the device
// only emulates it.
std::string bf16_advice(const torch::Device& device) {
  // The table is kept: of() returns a reference into it.
  const auto support = precision_support(device);
  const auto& bf16 = support.of(Precision::kAMPBF16);
  if (bf16.level == SupportLevel::kEmulated) {
    return ", clip gradients, or train in bf16/amp-bf16 (emulated on this " +
           std::string(c10::DeviceTypeName(device.type(), true)) + ": " +
           bf16.reason + "; slower than fp32, which also avoids FP16's range).";
  }
  return bf16.level == SupportLevel::kNative
             ? ", clip gradients, or train in bf16/amp-bf16."
             : ", clip gradients, or train in fp32.";
}

} // namespace

DivergenceWatch::DivergenceWatch(const torch::Device& device,
                                 const TrainerOptions& options,
                                 const GradScaler& scaler, Locate locate,
                                 ReduceMax reduce_max)
    : options_(options),
      scaler_(scaler),
      locate_(std::move(locate)),
      reduce_max_(std::move(reduce_max)),
      bf16_advice_(bf16_advice(device)),
      patience_(options.divergence_patience()) {
  const auto on_device = torch::TensorOptions().device(device);
  consecutive_skips_ = torch::zeros({}, on_device.dtype(torch::kFloat));
  longest_skip_run_ = torch::zeros({}, on_device.dtype(torch::kFloat));
  epoch_skipped_ = torch::zeros({}, on_device.dtype(torch::kFloat));
  non_finite_ = torch::zeros({}, on_device.dtype(torch::kLong));
  consecutive_non_finite_ = torch::zeros({}, on_device.dtype(torch::kLong));
  longest_non_finite_run_ = torch::zeros({}, on_device.dtype(torch::kLong));
}

void DivergenceWatch::begin_epoch() {
  epoch_skipped_.zero_();
}

void DivergenceWatch::record(int64_t epoch, const StepResult& result) {
  const auto bad = torch::isfinite(result.loss).logical_not();
  non_finite_ += bad;
  // The losses non-finite in a row, however the windows fall across them.
  consecutive_non_finite_.add_(1).mul_(bad);
  torch::maximum_out(longest_non_finite_run_, longest_non_finite_run_,
                     consecutive_non_finite_);
  if (result.cycle_ended) {
    const auto flag =
        result.found_inf.to(epoch_skipped_.device(), /*non_blocking=*/true);
    epoch_skipped_ += flag;
    consecutive_skips_.add_(flag).mul_(flag);
    torch::maximum_out(longest_skip_run_, longest_skip_run_,
                       consecutive_skips_);
  }
  if (++window_ < patience_) {
    return;
  }
  window_ = 0;
  check_skip_run(epoch);
  const int64_t mine = longest_non_finite_run_.item<int64_t>();
  const int64_t worst = reduce_max_ ? reduce_max_(mine) : mine;
  if (worst >= patience_) {
    diverged(epoch,
             "the loss was inf/NaN for " + std::to_string(patience_) +
                 " steps in a row" +
                 (mine >= patience_ ? "" : " on another rank"),
             lower_lr() + " or clip gradients.");
  }
}

int64_t DivergenceWatch::read_non_finite_losses() const {
  return non_finite_.item<int64_t>();
}

int64_t DivergenceWatch::read_epoch_skipped() const {
  return static_cast<int64_t>(epoch_skipped_.item<float>());
}

void DivergenceWatch::check_epoch(int64_t epoch, int64_t steps,
                                  int64_t non_finite, double train_loss,
                                  const torch::nn::Module& model) const {
  check_skip_run(epoch); // a run that reached `patience` in the last window
  const int64_t finite_steps = steps - non_finite;
  // However few its steps: an epoch without a finite loss, or with a
  // non-finite mean, or that leaves inf/NaN weights, ends the run before
  // evaluation and checkpoint.
  if (steps > 0 && (finite_steps == 0 || !std::isfinite(train_loss))) {
    diverged(epoch,
             finite_steps == 0
                 ? "the loss was inf/NaN in all its " + std::to_string(steps) +
                       " steps"
                 : "its mean training loss is " + exact(train_loss),
             lower_lr() + bf16_advice_);
  }
  const auto bad = first_non_finite(model);
  if (!bad.empty()) {
    diverged(epoch, bad + " has inf/NaN values",
             lower_lr() + " or clip gradients.");
  }
}

void DivergenceWatch::check_test_loss(int64_t epoch, double test_loss) const {
  if (!std::isfinite(test_loss)) {
    diverged(epoch,
             "the test loss is " + exact(test_loss) +
                 " (the model's outputs overflow)",
             lower_lr() + " or clip gradients.");
  }
}

void DivergenceWatch::check_skip_run(int64_t epoch) const {
  // Where the count is read anyway (see check_min_scale_patience()).
  scaler_.check_min_scale_patience();
  if (longest_skip_run_.item<float>() >= patience_) {
    diverged(
        epoch,
        std::to_string(patience_) +
            " optimizer steps in a row had inf/NaN gradients (loss scale now " +
            exact(scaler_.get_scale()) + ")",
        lower_lr() + bf16_advice_);
  }
}

std::string DivergenceWatch::lower_lr() const {
  return "Lower the learning rate (" +
         name_option(options_, "lr", "TrainerOptions::optimizer().lr") + ")";
}

void DivergenceWatch::diverged(int64_t epoch, const std::string& why,
                               const std::string& fix) const {
  const auto& checkpoint = options_.checkpoint();
  const auto where = locate_ ? locate_() : std::string();
  TORCH_CHECK(false, "lamp: training diverged in epoch ", epoch + 1, ": ", why,
              where.empty() ? std::string() : " (" + where + ")", ". ", fix,
              checkpoint.empty()
                  ? std::string()
                  : " The checkpoint " + checkpoint + " was left as it was.");
}

std::string first_non_finite(const torch::nn::Module& model) {
  for (const auto& item : model.named_parameters()) {
    if (!torch::isfinite(item.value()).all().item<bool>()) {
      return "parameter '" + item.key() + "'";
    }
  }
  for (const auto& item : model.named_buffers()) {
    const auto& b = item.value();
    if (b.is_floating_point() && !torch::isfinite(b).all().item<bool>()) {
      return "buffer '" + item.key() + "'";
    }
  }
  return "";
}

std::string rerun_under_check(
    const std::shared_ptr<torch::nn::Module>& model, TrainStep& step,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const Task& task, const torch::Tensor& inputs, const torch::Tensor& targets,
    int64_t step_number, bool loss_scaled) {
  // The step's own gradient tensors (which CUDA graphs and the optimizer
  // hold) are set aside untouched while the backward makes fresh ones.
  std::vector<torch::Tensor> grads;
  const auto params = model->parameters();
  for (auto p : params) {
    grads.push_back(p.grad());
    p.mutable_grad() = torch::Tensor();
  }
  std::vector<torch::Tensor> buffers;
  {
    torch::NoGradGuard no_grad;
    for (const auto& b : model->buffers()) {
      buffers.push_back(b.defined() ? b.clone() : b);
    }
  }
  c10::optional<NumericsFinding> finding;
  try {
    NumericsCheck check(model, NumericsCheckOptions().stop(false));
    finding = check.observe(
        step_number,
        [&] {
          auto loss = task.loss(step.forward(forward, inputs), targets);
          auto& scaler = step.scaler();
          (scaler.is_enabled() ? scaler.scale(loss) : loss).backward();
        },
        loss_scaled);
  } catch (const std::exception&) {
    // The divergence error is the one to report; this was only a pointer.
  }
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto param = params[i];
      param.mutable_grad() = grads[i];
    }
    auto live = model->buffers();
    for (size_t i = 0; i < live.size(); ++i) {
      if (live[i].defined()) {
        live[i].copy_(buffers[i]);
      }
    }
  }
  return finding ? finding->to_string() : "";
}

} // namespace detail
} // namespace training
} // namespace lamp
