// Trainer's evaluation of the test set (and with TrainerOptions::eval_train
// of the training data): alone (evaluate()) and after each epoch of fit(),
// split over the ranks of a data-parallel run.
#include "lamp/training/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "lamp/platform/out_of_memory.h"

namespace lamp {
namespace training {

std::pair<double, double> Trainer::evaluate() {
  const auto eval = evaluate_subset();
  return {eval.loss, eval.accuracy};
}

Evaluation Trainer::evaluate_subset(
    const std::function<void(const EvalProgress&)>& on_batch, int64_t epoch) {
  return *run_evaluation(on_batch, epoch, nullptr);
}

bool Trainer::evaluate_unless_stopped(
    Evaluation& result, bool training_data,
    const std::function<void(const EvalProgress&)>& on_batch, int64_t epoch) {
  restart_stop_checks(); // every rank's checks start here
  stop_point_ = StopPoint();
  const auto evaluated = run_evaluation(
      on_batch, epoch,
      [&] {
        const int asked_by = rank_asking_to_stop(/*in_evaluation=*/true);
        if (asked_by < 0) {
          return false;
        }
        stop_point_ = {
            true, epoch, 0, 0, true, global_step_, checkpoint_step_, asked_by};
        return true;
      },
      training_data);
  if (!evaluated) {
    return false;
  }
  result = *evaluated;
  return true;
}

Evaluation Trainer::evaluate_training_data(
    const std::function<void(const EvalProgress&)>& on_batch, int64_t epoch) {
  return *run_evaluation(on_batch, epoch, nullptr, /*training_data=*/true);
}

const data::DeviceLoader& Trainer::train_eval_loader() {
  if (!train_eval_loader_) {
    // The training loader's data, normalisation and dtype, in batches of
    // the test set's size, without augmentation or sharding (every rank
    // evaluates its share of the batches, as of the test set's). One fixed
    // epoch of the training loader's shuffled order (or random windows):
    // examples from all of the data, the same ones every evaluation.
    auto o = train_loader_.options();
    const auto train = train_loader_.data();
    o.batch_size(
         std::min(test_loader_.options().batch_size(), train.targets.size(0)))
        .shuffle(true)
        .drop_last(false)
        .batches_multiple_of(1)
        .crop_padding(0)
        .horizontal_flip(false)
        .num_shards(1)
        .shard(0);
    train_eval_loader_ = std::make_unique<data::DeviceLoader>(
        train, train_loader_.device(), std::move(o));
    train_eval_loader_->set_epoch(0);
  }
  return *train_eval_loader_;
}

c10::optional<std::pair<Evaluation, c10::optional<Evaluation>>>
Trainer::run_evaluations(
    const std::function<void(const EvalProgress&)>& on_batch, int64_t epoch,
    const std::function<bool()>& stop) {
  const auto test = run_evaluation(on_batch, epoch, stop);
  if (!test) {
    return c10::nullopt;
  }
  c10::optional<Evaluation> train;
  if (options_.eval_train()) {
    train = run_evaluation(on_batch, epoch, stop, /*training_data=*/true);
    if (!train) {
      return c10::nullopt;
    }
  }
  return std::make_pair(*test, train);
}

c10::optional<Evaluation> Trainer::run_evaluation(
    const std::function<void(const EvalProgress&)>& on_batch, int64_t epoch,
    const std::function<bool()>& stop, bool training_data) {
  const auto& loader = training_data ? train_eval_loader() : test_loader_;
  torch::NoGradGuard no_grad;
  // The model's mode as it was, however the evaluation ends (an error
  // included): fit() trains after it, a caller's evaluate() of a model in
  // eval mode leaves it there.
  struct ModeBack {
    torch::nn::Module& model;
    bool training;
    ~ModeBack() { model.train(training); }
  } mode_back{*model_, model_->is_training()};
  model_->eval();
  const auto on_device = torch::TensorOptions().device(loader.device());
  auto loss_sum = torch::zeros({}, on_device.dtype(torch::kDouble));
  auto correct = torch::zeros({}, on_device.dtype(torch::kLong));
  // Data-parallel: rank r evaluates batches r, r + world, ...; the sums
  // are then added up over the ranks (each test example counted once).
  const auto& group = options_.process_group();
  const int64_t ranks = group ? group->world_size() : 1;
  const int64_t rank = group ? group->rank() : 0;
  // On CUDA every evaluation batch has the same shape: the last one is padded
  // with zero inputs whose outputs are dropped (eval-mode BatchNorm treats
  // each example alone), so cuDNN autotunes once instead of twice.
  const int64_t full = loader.options().batch_size();
  const bool pad = loader.device().is_cuda();
  const int64_t in_set = loader.batches_per_epoch();
  const int64_t limit = options_.limit_eval_batches();
  const int64_t batches = limit > 0 ? std::min(limit, in_set) : in_set;
  // This rank's batches, and the examples of all of them (every rank's).
  const int64_t own = rank < batches ? (batches - rank + ranks - 1) / ranks : 0;
  int64_t examples = 0;
  for (int64_t i = 0; i < batches; ++i) {
    examples += std::min(full, loader.samples_per_epoch() - i * full);
  }
  const auto& task = options_.task();
  int64_t done = 0;
  // Every rank takes as many turns as the one with the most batches, a
  // rank past its last batch only asking `stop`: a data-parallel stop is
  // agreed at one turn on every rank (stop() all-reduces).
  const int64_t turns = (batches + ranks - 1) / ranks;
  for (int64_t turn = 0; turn < turns; ++turn) {
    if (stop && stop()) {
      return c10::nullopt;
    }
    const int64_t i = rank + turn * ranks;
    if (i >= batches) {
      continue;
    }
    const auto batch = loader.batch(i);
    auto inputs = batch.inputs;
    const int64_t n = inputs.size(0);
    if (pad && n < full) {
      auto padding_sizes = inputs.sizes().vec();
      padding_sizes[0] = full - n;
      inputs =
          torch::cat({inputs, torch::zeros(padding_sizes, inputs.options())})
              .contiguous(inputs.suggest_memory_format());
    }
    // Cast and autocast as the training step runs the model; the outputs
    // in FP32 (a language model's logits: batch x context x vocabulary).
    with_memory_context(
        "the outputs of an evaluation batch of " + std::to_string(full) +
            " examples (TrainerOptions::eval_batch_size; the programs' "
            "--eval-batch-size: a smaller one)",
        -1, [&] {
          auto output = step_->forward(forward_, inputs).to(torch::kFloat);
          if (output.size(0) != n) {
            output = output.slice(0, 0, n);
          }
          loss_sum += task.loss(output, batch.targets, /*sum=*/true);
          correct += task.correct(output, batch.targets);
        });
    if (on_batch) {
      EvalProgress progress;
      progress.epoch = epoch;
      progress.training_data = training_data;
      progress.batch = ++done;
      progress.batches = own;
      progress.batches_evaluated = batches;
      progress.batches_in_set = in_set;
      progress.examples = n;
      on_batch(progress);
    }
  }
  if (ranks > 1) {
    group->all_reduce_(loss_sum, lamp::distributed::ReduceOp::kSum,
                       "the evaluation's all-reduce of the loss");
    auto correct_double = correct.to(torch::kDouble);
    group->all_reduce_(correct_double, lamp::distributed::ReduceOp::kSum,
                       "the evaluation's all-reduce of the hits");
    correct = correct_double.to(torch::kLong);
  }
  Evaluation eval;
  // A language model's sequences: every position is a prediction.
  eval.predictions = examples * task.predictions_per_example(loader.data());
  const auto n = static_cast<double>(eval.predictions);
  eval.loss = loss_sum.item<double>() / n;
  eval.accuracy = correct.item<int64_t>() / n;
  eval.batches = batches;
  eval.batches_in_set = in_set;
  eval.examples = examples;
  return eval;
}

} // namespace training
} // namespace lamp
