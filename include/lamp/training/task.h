#pragma once

/// \file
/// What a training::Trainer's model predicts and how it is scored: a class
/// per example (Task::classification()) or the next token at every position
/// of a sequence (Task::language_model()), each with its own metrics and
/// the words its reports use.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>

#include "lamp/data/datasets.h"

namespace lamp {
namespace training {

/// One of the trainer's two tasks. Both train on cross-entropy; they differ
/// in what is predicted, what is counted and what is reported:
///
/// | | classification() | language_model() |
/// |---|---|---|
/// | inputs | images [N, C, H, W] (or token ids [N, T]) | token ids [N, T] |
/// | targets | a class per example, [N] | the next token per position, [N, T] |
/// | model output | [N, classes] | [N, T, vocab] |
/// | loss | cross-entropy per example | cross-entropy per token |
/// | metrics | accuracy | perplexity (exp of the loss), next-token accuracy |
/// | counts | examples ("images") | sequences and tokens |
///
/// Example:
/// \code
///   auto options = lamp::training::TrainerOptions(lamp::Precision::kAMPBF16)
///                      .task(lamp::training::Task::language_model());
/// \endcode
class Task {
 public:
  /// Which of the two tasks.
  enum class Kind {
    kClassification, ///< a class per example
    kLanguageModel,  ///< the next token at every position
  };

  /// A class per example; `example` names one in reports ("image").
  static Task classification(std::string example = "image");
  /// The next token at every position of a sequence.
  static Task language_model();

  /// Which task this is.
  Kind kind() const { return kind_; }
  /// Whether this is Task::language_model().
  bool is_language_model() const { return kind_ == Kind::kLanguageModel; }
  /// One example, in reports: "image" (classification's noun) or
  /// "sequence".
  const std::string& example() const { return example_; }
  /// One prediction, in reports: the example's noun, or "token".
  std::string prediction() const;
  /// "accuracy", or "next-token accuracy".
  std::string accuracy_name() const;

  /// The loss, FP32: cross-entropy of `output` against `targets` as a mean
  /// (`sum` false) or a sum over every prediction. Classification: output
  /// [N, classes], targets [N]; language model: output [N, T, vocab],
  /// targets [N, T]. Any output dtype (computed in FP32); targets of any
  /// integer type. Throws c10::Error, naming the task and the shapes, when
  /// they do not fit.
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& targets,
                     bool sum = false) const;
  /// How many predictions `output` ranks first among its classes or tokens
  /// (argmax equal to the target): a 0-dim int64 tensor on the output's
  /// device; the same shapes as loss().
  torch::Tensor correct(const torch::Tensor& output,
                        const torch::Tensor& targets) const;
  /// The predictions one example of `data` holds: 1 for classification, T
  /// for a language model's sequences [N, T].
  int64_t predictions_per_example(const data::Dataset& data) const;
  /// Throws c10::Error, naming `what` ("the training data"), the task and
  /// the fix, unless `data` fits the task: targets [N] for
  /// classification; token ids [N, T] with targets [N, T] for a language
  /// model.
  void check(const data::Dataset& data, const std::string& what) const;

 private:
  Task(Kind kind, std::string example)
      : kind_(kind), example_(std::move(example)) {}
  Kind kind_;
  std::string example_;
};

/// exp(loss), a language model's perplexity per token: +inf where it
/// overflows a double (a loss above about 709.78), NaN for a NaN loss.
double perplexity(double loss);

} // namespace training
} // namespace lamp
