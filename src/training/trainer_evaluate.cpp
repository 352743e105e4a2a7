// ClassifierTrainer's evaluation of the test set: alone (evaluate()) and
// after each epoch of fit(), split over the ranks of a data-parallel run.
#include "lamp/training/trainer.h"

#include <torch/torch.h>

#include <algorithm>

namespace lamp {
namespace training {

std::pair<double, double> ClassifierTrainer::evaluate() {
  const auto eval = evaluate_subset();
  return {eval.loss, eval.accuracy};
}

Evaluation ClassifierTrainer::evaluate_subset(
    const std::function<void(const EvalProgress&)>& on_batch, int64_t epoch) {
  return *run_evaluation(on_batch, epoch, nullptr);
}

c10::optional<Evaluation> ClassifierTrainer::run_evaluation(
    const std::function<void(const EvalProgress&)>& on_batch, int64_t epoch,
    const std::function<bool()>& stop) {
  torch::NoGradGuard no_grad;
  model_->eval();
  const auto on_device = torch::TensorOptions().device(test_loader_.device());
  auto loss_sum = torch::zeros({}, on_device.dtype(torch::kDouble));
  auto correct = torch::zeros({}, on_device.dtype(torch::kLong));
  // Data-parallel: rank r evaluates batches r, r + world, ...; the sums
  // are then added up over the ranks (each test image counted once).
  const auto& group = options_.process_group();
  const int64_t ranks = group ? group->world_size() : 1;
  const int64_t rank = group ? group->rank() : 0;
  // On CUDA every evaluation batch has the same shape: the last one is padded
  // with zero images whose outputs are dropped (eval-mode BatchNorm treats
  // each image alone), so cuDNN autotunes once instead of twice.
  const int64_t full = test_loader_.options().batch_size();
  const bool pad = test_loader_.device().is_cuda();
  const int64_t in_set = test_loader_.batches_per_epoch();
  const int64_t limit = options_.limit_eval_batches();
  const int64_t batches = limit > 0 ? std::min(limit, in_set) : in_set;
  // This rank's batches, and the images of all of them (every rank's).
  const int64_t own = rank < batches ? (batches - rank + ranks - 1) / ranks : 0;
  int64_t images = 0;
  for (int64_t i = 0; i < batches; ++i) {
    images += std::min(full, test_loader_.samples_per_epoch() - i * full);
  }
  int64_t done = 0;
  for (int64_t i = rank; i < batches; i += ranks) {
    if (stop && stop()) {
      model_->train();
      return c10::nullopt;
    }
    const auto batch = test_loader_.batch(i);
    auto images = batch.images;
    const int64_t n = images.size(0);
    if (pad && n < full) {
      auto padding_sizes = images.sizes().vec();
      padding_sizes[0] = full - n;
      images =
          torch::cat({images, torch::zeros(padding_sizes, images.options())})
              .contiguous(images.suggest_memory_format());
    }
    // Cast and autocast as the training step runs the model.
    auto output = step_->forward(forward_, images).to(torch::kFloat);
    if (output.size(0) != n) {
      output = output.slice(0, 0, n);
    }
    loss_sum += classifier_loss(output, batch.labels, /*sum=*/true);
    correct += classifier_correct(output, batch.labels);
    if (on_batch) {
      EvalProgress progress;
      progress.epoch = epoch;
      progress.batch = ++done;
      progress.batches = own;
      progress.batches_evaluated = batches;
      progress.batches_in_set = in_set;
      progress.images = n;
      on_batch(progress);
    }
  }
  model_->train();
  if (ranks > 1) {
    group->all_reduce_(loss_sum, lamp::distributed::ReduceOp::kSum,
                       "the evaluation's all-reduce of the loss");
    auto correct_double = correct.to(torch::kDouble);
    group->all_reduce_(correct_double, lamp::distributed::ReduceOp::kSum,
                       "the evaluation's all-reduce of the hits");
    correct = correct_double.to(torch::kLong);
  }
  Evaluation eval;
  // Sequences: every position is a label.
  const auto& labels = test_loader_.data().labels;
  const double n = static_cast<double>(images) *
                   static_cast<double>(labels.numel() / labels.size(0));
  eval.loss = loss_sum.item<double>() / n;
  eval.accuracy = correct.item<int64_t>() / n;
  eval.batches = batches;
  eval.batches_in_set = in_set;
  eval.images = images;
  return eval;
}

} // namespace training
} // namespace lamp
