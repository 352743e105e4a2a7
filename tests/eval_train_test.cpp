// TrainerOptions::eval_train: the training data evaluated as nanoGPT's
// estimate_loss() does, in eval mode and without augmentation, over the
// test set's number of batches of one fixed draw; in the epoch and step
// results beside the test set's, and alone (evaluate_training_data()).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "lamp/data/text.h"
#include "lamp/models/gpt.h"
#include "lamp/training/task.h"
#include "lamp/training/trainer.h"
#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp::training::EvalProgress;
using lamp::training::Trainer;
using lamp::training::TrainerOptions;
using lamp_test::image_problem;

// The evaluation by hand: batches 0 .. `batches` - 1 of `loader` (at its
// epoch) through `forward` in eval mode, the mean cross-entropy per
// prediction and the share of predictions whose argmax is the target, in
// FP64 sums.
std::pair<double, double> by_hand(
    torch::nn::Module& model,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const lamp::data::DeviceLoader& loader, int64_t batches) {
  torch::NoGradGuard no_grad;
  model.eval();
  double loss = 0, hits = 0, predictions = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const auto batch = loader.batch(i);
    auto out = forward(batch.inputs).to(torch::kFloat);
    out = out.reshape({-1, out.size(-1)});
    const auto targets = batch.targets.reshape({-1});
    loss += torch::nn::functional::cross_entropy(
                out, targets,
                torch::nn::functional::CrossEntropyFuncOptions().reduction(
                    torch::kSum))
                .item<double>();
    hits += out.argmax(-1).eq(targets).sum().item<double>();
    predictions += static_cast<double>(targets.numel());
  }
  model.train();
  return {loss / predictions, hits / predictions};
}

struct ImageRun {
  lamp_test::SmallNet model;
  std::unique_ptr<Trainer> trainer;
  std::vector<bool> training_in_forward; // model->is_training() each call
};

// SmallNet on image_problem(): training batches of 32, augmented (crop and
// flip, lamp_test::train_loader_options()), test batches of 16.
std::unique_ptr<ImageRun> image_run(TrainerOptions options) {
  auto run = std::make_unique<ImageRun>();
  torch::manual_seed(5);
  run->model = lamp_test::SmallNet();
  auto model = run->model;
  auto* seen = &run->training_in_forward;
  run->trainer = std::make_unique<Trainer>(
      model.ptr(),
      [model, seen](const torch::Tensor& x) mutable {
        seen->push_back(model->is_training());
        return model->forward(x);
      },
      "smallnet",
      lamp::data::DeviceLoader(image_problem(true), torch::kCPU,
                               lamp_test::train_loader_options(32)),
      lamp::data::DeviceLoader(image_problem(false), torch::kCPU,
                               lamp::data::LoaderOptions(16)
                                   .shuffle(false)
                                   .mean({0.5, 0.5, 0.5})
                                   .std({0.2, 0.2, 0.2})),
      options.epochs(2).option_name(lamp_test::flag_name));
  return run;
}

// What eval_train evaluates of image_problem(true): the training loader's
// normalisation and seed, batches of the test set's 16, epoch 0's shuffled
// order, no crop or flip.
lamp::data::DeviceLoader reference_loader() {
  lamp::data::DeviceLoader loader(image_problem(true), torch::kCPU,
                                  lamp::data::LoaderOptions(16)
                                      .seed(9)
                                      .mean({0.5, 0.5, 0.5})
                                      .std({0.2, 0.2, 0.2}));
  loader.set_epoch(0);
  return loader;
}

// The loss sums of one evaluation against another in FP64, over batches
// summed in the same order, by ATen's reductions that may split a batch
// differently: 1e-6 of losses near 1.
constexpr double kSumTolerance = 1e-6;

TEST(EvalTrain, EvaluatesTheTrainingDataInEvalModeWithoutAugmentation) {
  auto run = image_run(TrainerOptions().limit_eval_batches(3));
  std::vector<EvalProgress> seen;
  const auto eval = run->trainer->evaluate_training_data(
      [&](const EvalProgress& p) { seen.push_back(p); });
  // BatchNorm in train mode would normalise by the batch: every forward
  // ran in eval mode, and the model is left training.
  ASSERT_EQ(run->training_in_forward.size(), 3u);
  for (const bool training : run->training_in_forward) {
    EXPECT_FALSE(training);
  }
  EXPECT_TRUE(run->model->is_training());
  const auto n = image_problem(true).targets.size(0);
  EXPECT_EQ(eval.batches, 3);
  EXPECT_EQ(eval.batches_in_set, (n + 15) / 16);
  EXPECT_EQ(eval.examples, 48);
  EXPECT_EQ(eval.predictions, 48);
  const auto expected = by_hand(
      *run->model,
      [&](const torch::Tensor& x) { return run->model->forward(x); },
      reference_loader(), 3);
  EXPECT_NEAR(eval.loss, expected.first, kSumTolerance);
  EXPECT_NEAR(eval.accuracy, expected.second, 1e-12);
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& p : seen) {
    EXPECT_TRUE(p.training_data);
    EXPECT_EQ(p.batches, 3);
    EXPECT_EQ(p.batches_evaluated, 3);
    EXPECT_EQ(p.batches_in_set, (n + 15) / 16);
    EXPECT_EQ(p.examples, 16);
  }
  // The test set's evaluation says it is not the training data's.
  seen.clear();
  run->trainer->evaluate_subset(
      [&](const EvalProgress& p) { seen.push_back(p); });
  ASSERT_FALSE(seen.empty());
  EXPECT_FALSE(seen[0].training_data);
}

TEST(EvalTrain, TheWholeTrainingDataWithoutALimit) {
  auto run = image_run(TrainerOptions());
  const auto eval = run->trainer->evaluate_training_data();
  const auto n = image_problem(true).targets.size(0);
  EXPECT_EQ(eval.batches, (n + 15) / 16);
  EXPECT_EQ(eval.batches_in_set, eval.batches);
  EXPECT_EQ(eval.examples, n);
  // The same examples in any order: a loss over all of them.
  const auto expected = by_hand(
      *run->model,
      [&](const torch::Tensor& x) { return run->model->forward(x); },
      reference_loader(), eval.batches);
  EXPECT_NEAR(eval.loss, expected.first, kSumTolerance);
}

TEST(EvalTrain, EveryEpochAndStepEvaluationReportsItBesideTheTestSet) {
  // Per epoch: the training data's evaluation of epoch 0's draw with the
  // weights of each epoch's end; the training loader's own epochs (another
  // order and augmentation) do not move it.
  auto run = image_run(TrainerOptions().eval_train(true).limit_eval_batches(2));
  std::vector<EvalProgress> seen;
  std::vector<double> by_epoch;
  const auto stats = run->trainer->fit(
      [&](const lamp::training::EpochStats&) {
        by_epoch.push_back(
            by_hand(
                *run->model,
                [&](const torch::Tensor& x) { return run->model->forward(x); },
                reference_loader(), 2)
                .first);
      },
      nullptr, [&](const EvalProgress& p) { seen.push_back(p); });
  ASSERT_EQ(stats.size(), 2u);
  for (size_t e = 0; e < stats.size(); ++e) {
    ASSERT_TRUE(stats[e].train_evaluation.has_value()) << e;
    EXPECT_EQ(stats[e].train_evaluation->batches, 2);
    EXPECT_EQ(stats[e].train_evaluation->examples, 32);
    EXPECT_NEAR(stats[e].train_evaluation->loss, by_epoch[e], kSumTolerance)
        << e;
    EXPECT_EQ(stats[e].test_batches, 2);
  }
  EXPECT_NE(stats[0].train_evaluation->loss, stats[1].train_evaluation->loss);
  // Each epoch: the test set's 2 batches, then the training data's 2.
  ASSERT_EQ(seen.size(), 8u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].training_data, i % 4 >= 2) << i;
  }
  // By steps: each evaluation has it.
  auto by_steps = image_run(
      TrainerOptions().eval_train(true).eval_every(1).limit_eval_batches(1));
  std::vector<lamp::training::StepEvaluation> evaluations;
  by_steps->trainer->fit(nullptr, nullptr, nullptr,
                         [&](const lamp::training::StepEvaluation& e) {
                           evaluations.push_back(e);
                         });
  ASSERT_FALSE(evaluations.empty());
  for (const auto& e : evaluations) {
    ASSERT_TRUE(e.train_evaluation.has_value()) << e.global_step;
    EXPECT_EQ(e.train_evaluation->examples, 16);
  }
}

TEST(EvalTrain, OffByDefault) {
  auto run = image_run(TrainerOptions().limit_eval_batches(1));
  std::vector<EvalProgress> seen;
  const auto stats = run->trainer->fit(
      nullptr, nullptr, [&](const EvalProgress& p) { seen.push_back(p); });
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_FALSE(stats[0].train_evaluation.has_value());
  // One test batch per epoch and no more.
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_FALSE(seen[0].training_data);
  EXPECT_FALSE(seen[1].training_data);
}

TEST(EvalTrain, TokenWindowsAtRandomOffsetsPerTokenWithoutDropout) {
  // A GPT with dropout: eval mode matters. The training windows at random
  // offsets, drawn as the training loader draws epoch 0's.
  torch::manual_seed(4);
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 600; ++i) {
    bytes.push_back(static_cast<uint8_t>("the cat sat on the mat. "[i % 24]));
  }
  const auto tokens =
      torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())},
                       torch::kByte)
          .clone();
  const auto train = lamp::data::text_windows(tokens.slice(0, 0, 480), 8);
  const auto validation = lamp::data::text_windows(tokens.slice(0, 480), 8);
  const auto gpt_options = lamp::models::GPTOptions()
                               .layers(2)
                               .heads(2)
                               .width(16)
                               .context(8)
                               .dropout(0.5);
  lamp::models::GPT gpt(gpt_options);
  auto options = TrainerOptions(lamp::Precision::kFP32)
                     .epochs(1)
                     .limit_eval_batches(2)
                     .eval_train(true)
                     .task(lamp::training::Task::language_model());
  const auto train_options = lamp::data::LoaderOptions(12)
                                 .dtype(torch::kLong)
                                 .seed(3)
                                 .random_windows(true);
  Trainer trainer(
      gpt.ptr(),
      [gpt](const torch::Tensor& x) mutable { return gpt->forward(x); },
      gpt_options.name(),
      lamp::data::DeviceLoader(train, torch::kCPU, train_options),
      lamp::data::DeviceLoader(
          validation, torch::kCPU,
          lamp::data::LoaderOptions(5).shuffle(false).dtype(torch::kLong)),
      options);
  const auto eval = trainer.evaluate_training_data();
  EXPECT_EQ(eval.batches, 2);
  EXPECT_EQ(eval.examples, 10);
  EXPECT_EQ(eval.predictions, 80);
  lamp::data::DeviceLoader reference(train, torch::kCPU,
                                     lamp::data::LoaderOptions(5)
                                         .dtype(torch::kLong)
                                         .seed(3)
                                         .random_windows(true));
  reference.set_epoch(0);
  const auto expected = by_hand(
      *gpt, [&](const torch::Tensor& x) { return gpt->forward(x); }, reference,
      2);
  EXPECT_NEAR(eval.loss, expected.first, kSumTolerance);
  EXPECT_NEAR(eval.accuracy, expected.second, 1e-12);
  // Twice the same: no dropout, the same windows.
  EXPECT_EQ(trainer.evaluate_training_data().loss, eval.loss);
}

} // namespace
