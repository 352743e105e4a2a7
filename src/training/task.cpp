// The trainer's two tasks: what is predicted, scored and counted.
#include "lamp/training/task.h"

#include <torch/torch.h>

#include <cmath>
#include <utility>

namespace lamp {
namespace training {
namespace {

namespace F = torch::nn::functional;

F::CrossEntropyFuncOptions reduction(bool sum) {
  return F::CrossEntropyFuncOptions().reduction(
      sum ? F::CrossEntropyFuncOptions::reduction_t(torch::kSum)
          : F::CrossEntropyFuncOptions::reduction_t(torch::kMean));
}

} // namespace

Task Task::classification(std::string example) {
  TORCH_CHECK(!example.empty(),
              "lamp::training::Task::classification: the example's noun "
              "must not be empty (\"image\", \"review\", ...).");
  return Task(Kind::kClassification, std::move(example));
}

Task Task::language_model() {
  return Task(Kind::kLanguageModel, "sequence");
}

std::string Task::prediction() const {
  return is_language_model() ? "token" : example_;
}

std::string Task::accuracy_name() const {
  return is_language_model() ? "next-token accuracy" : "accuracy";
}

torch::Tensor Task::loss(const torch::Tensor& output,
                         const torch::Tensor& targets, bool sum) const {
  if (is_language_model()) {
    TORCH_CHECK(
        targets.dim() == 2 && output.dim() == 3 &&
            output.size(0) == targets.size(0) &&
            output.size(1) == targets.size(1),
        "lamp::training: a language model's targets [N, T] (the next token "
        "of each position) need the model's output [N, T, vocab]; got "
        "targets ",
        targets.sizes(), " and output ", output.sizes(), ".");
    return F::cross_entropy(output.flatten(0, 1).to(torch::kFloat),
                            targets.flatten().to(torch::kLong), reduction(sum));
  }
  TORCH_CHECK(targets.dim() == 1 && output.dim() == 2 &&
                  output.size(0) == targets.size(0),
              "lamp::training: classification's targets [N] (a class per ",
              example_, ") need the model's output [N, classes]; got targets ",
              targets.sizes(), " and output ", output.sizes(),
              targets.dim() == 2
                  ? " (targets [N, T] are a language model's: "
                    "TrainerOptions::task(Task::language_model()))"
                  : "",
              ".");
  return F::cross_entropy(output.to(torch::kFloat), targets.to(torch::kLong),
                          reduction(sum));
}

torch::Tensor Task::correct(const torch::Tensor& output,
                            const torch::Tensor& targets) const {
  TORCH_CHECK(output.dim() == targets.dim() + 1 &&
                  output.sizes().slice(0, targets.dim()) == targets.sizes(),
              "lamp::training: the model's output ", output.sizes(),
              " does not fit the targets ", targets.sizes(), ".");
  return output.argmax(-1).eq(targets).sum();
}

int64_t Task::predictions_per_example(const data::Dataset& data) const {
  return is_language_model() && data.targets.defined() &&
                 data.targets.dim() == 2
             ? data.targets.size(1)
             : 1;
}

void Task::check(const data::Dataset& data, const std::string& what) const {
  const auto& targets = data.targets;
  if (is_language_model()) {
    TORCH_CHECK(
        data.sequences() && targets.defined() && targets.dim() == 2 &&
            targets.sizes() == data.inputs.sizes(),
        "lamp::training: a language model trains on token ids [N, T] with "
        "targets [N, T] (the next token of each position, "
        "data::text_windows()); ",
        what, " holds inputs ",
        data.inputs.defined() ? data.inputs.sizes() : c10::IntArrayRef{},
        " and targets ",
        targets.defined() ? targets.sizes() : c10::IntArrayRef{}, ".");
    return;
  }
  TORCH_CHECK(targets.defined() && targets.dim() == 1,
              "lamp::training: classification needs a class per example, "
              "targets [N]; ",
              what, " holds targets ",
              targets.defined() ? targets.sizes() : c10::IntArrayRef{},
              targets.defined() && targets.dim() == 2
                  ? ", a token per position: a language model's "
                    "(TrainerOptions::task(Task::language_model()))"
                  : "",
              ".");
}

double perplexity(double loss) {
  return std::exp(loss);
}

} // namespace training
} // namespace lamp
