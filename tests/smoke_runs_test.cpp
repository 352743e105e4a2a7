// Smoke runs that tell the truth: an epoch that max_steps cuts short is
// reported partial and writes no checkpoint; limit_eval_batches evaluates the
// first batches only and says so; warm-up is the training step's, not the
// evaluation's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lamp/training/schedule.h"
#include "lamp/training/trainer.h"
#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp::training::BatchProgress;
using lamp::training::EpochStats;
using lamp::training::EvalProgress;
using lamp::training::Trainer;
using lamp::training::TrainerOptions;
using lamp_test::error_of;
using lamp_test::image_problem;
using lamp_test::make_run;
using lamp_test::temp_path;

struct EvalRun {
  lamp_test::SmallNet model;
  std::unique_ptr<Trainer> trainer;
};

// A trainer on image_problem() whose test loader serves `test` (64 images by
// default) in batches of `test_batch` (4 of 16 by default); `on_forward`,
// when given, runs before each forward with whether the model is training
// (to slow the evaluation down, say).

std::unique_ptr<EvalRun> make_eval_run(
    TrainerOptions options, int64_t test_batch = 16,
    const lamp::data::Dataset& test = image_problem(false),
    std::function<void(bool training)> on_forward = nullptr) {
  auto run = std::make_unique<EvalRun>();
  torch::manual_seed(5);
  run->model = lamp_test::SmallNet();
  auto model = run->model;
  run->trainer = std::make_unique<Trainer>(
      model.ptr(),
      [model, on_forward](const torch::Tensor& x) mutable {
        if (on_forward) {
          on_forward(model->is_training());
        }
        return model->forward(x);
      },
      "smallnet",
      lamp::data::DeviceLoader(image_problem(true), torch::kCPU,
                               lamp_test::train_loader_options(32)),
      lamp::data::DeviceLoader(test, torch::kCPU,
                               lamp::data::LoaderOptions(test_batch)
                                   .shuffle(false)
                                   .mean({0.5, 0.5, 0.5})
                                   .std({0.2, 0.2, 0.2})),
      options.option_name(lamp_test::flag_name));
  return run;
}

TEST(Trainer, AnEpochCutShortByMaxStepsIsPartialAndCheckpointsItsPosition) {
  // 6 steps per epoch; 8 steps: epoch 1 whole, epoch 2 partial (2 of 6).
  const auto checkpoint = temp_path("partial.pt");
  std::remove(checkpoint.c_str());
  std::vector<BatchProgress> batches;
  std::vector<EpochStats> stats;
  {
    auto run = make_run(
        lamp::Precision::kFP32,
        TrainerOptions().epochs(3).max_steps(8).checkpoint(checkpoint));
    stats = run->trainer->fit(
        nullptr, [&](const BatchProgress& p) { batches.push_back(p); });
  }
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].steps, 6);
  EXPECT_EQ(stats[0].steps_in_epoch, 6);
  EXPECT_FALSE(stats[0].partial());
  EXPECT_TRUE(stats[0].checkpoint_written);
  EXPECT_EQ(stats[1].steps, 2);
  EXPECT_EQ(stats[1].steps_in_epoch, 6);
  EXPECT_EQ(stats[1].global_step, 8);
  EXPECT_TRUE(stats[1].partial());
  EXPECT_TRUE(stats[1].checkpoint_written); // at step 8, inside epoch 2
  // A progress bar's total is where the epoch will stop: 6, then 2 of 6.
  ASSERT_EQ(batches.size(), 8u);
  EXPECT_EQ(batches[0].batches, 6);
  EXPECT_EQ(batches[0].batches_in_epoch, 6);
  EXPECT_EQ(batches[6].batch, 1);
  EXPECT_EQ(batches[6].batches, 2);
  EXPECT_EQ(batches[7].batches, 2);
  EXPECT_EQ(batches[7].batches_in_epoch, 6);
  // The checkpoint holds the step the run stopped on: 2 steps into epoch 2.
  auto resumed = make_run(lamp::Precision::kFP32,
                          TrainerOptions().epochs(3).resume(checkpoint));
  EXPECT_EQ(resumed->trainer->start_epoch(), 1);
  EXPECT_EQ(resumed->trainer->start_step_in_epoch(), 2);
  EXPECT_EQ(resumed->trainer->global_step(), 8);
  std::remove(checkpoint.c_str());
}

TEST(Trainer, WholeEpochsAreNotPartialAndWithoutACheckpointWriteNone) {
  auto run = make_run(lamp::Precision::kFP32,
                      TrainerOptions().epochs(2).max_steps(12));
  const auto stats = run->trainer->fit();
  ASSERT_EQ(stats.size(), 2u);
  for (const auto& s : stats) {
    EXPECT_FALSE(s.partial());
    EXPECT_EQ(s.steps, 6);
    EXPECT_FALSE(s.checkpoint_written); // none asked for
    EXPECT_FALSE(s.test_subset());
    EXPECT_EQ(s.test_batches, 1);
    EXPECT_EQ(s.test_batches_in_set, 1);
    EXPECT_EQ(s.test_examples, 64);
  }
}

// The learning-rate schedule spans the whole run (epochs x batches) however
// the run is cut: one that max_steps stops 2 steps into its second epoch
// takes the full run's learning rates step by step, and so does that run
// resumed from its checkpoint.
TEST(Trainer, ScheduleIsTheFullRunsUnderMaxStepsAndResume) {
  using lamp::training::Schedule;
  for (const auto schedule : {Schedule::kOneCycle, Schedule::kCosine}) {
    SCOPED_TRACE(lamp::training::to_string(schedule));
    const auto checkpoint = temp_path("schedule.pt");
    const auto options = TrainerOptions().epochs(3).schedule(schedule);
    const auto lrs_of = [](Trainer& trainer) {
      std::vector<double> lrs;
      trainer.fit(nullptr,
                  [&](const BatchProgress& p) { lrs.push_back(p.lr); });
      return lrs;
    };
    // 3 epochs of 6 batches; make_run's peak lr is 0.05.
    std::vector<double> expected;
    for (int64_t step = 0; step < 18; ++step) {
      expected.push_back(
          lamp::training::learning_rate(schedule, 0.05, step, 18));
    }
    EXPECT_EQ(lrs_of(*make_run(lamp::Precision::kFP32, options)->trainer),
              expected);
    const auto cut =
        make_run(lamp::Precision::kFP32,
                 TrainerOptions(options).max_steps(8).checkpoint(checkpoint));
    EXPECT_EQ(lrs_of(*cut->trainer),
              std::vector<double>(expected.begin(), expected.begin() + 8));
    // Its checkpoint holds step 8, inside epoch 2: the resumed run takes
    // steps 8 to 17.
    const auto resumed = make_run(lamp::Precision::kFP32,
                                  TrainerOptions(options).resume(checkpoint));
    EXPECT_EQ(lrs_of(*resumed->trainer),
              std::vector<double>(expected.begin() + 8, expected.end()));
    std::remove(checkpoint.c_str());
  }
}

TEST(Trainer, LimitEvalBatchesEvaluatesTheFirstBatchesOnly) {
  // Limited to 2 of 4 batches of 16: the same loss and accuracy as the
  // whole evaluation of a test set of those 32 images.
  auto limited = make_eval_run(TrainerOptions().limit_eval_batches(2));
  const auto test = image_problem(false);
  auto first_32 = make_eval_run(
      TrainerOptions(), 16,
      {test.inputs.slice(0, 0, 32), test.targets.slice(0, 0, 32)});
  std::vector<EvalProgress> seen;
  const auto subset = limited->trainer->evaluate_subset(
      [&](const EvalProgress& p) { seen.push_back(p); });
  const auto whole = first_32->trainer->evaluate_subset();
  EXPECT_EQ(subset.loss, whole.loss);
  EXPECT_EQ(subset.accuracy, whole.accuracy);
  EXPECT_EQ(subset.batches, 2);
  EXPECT_EQ(subset.batches_in_set, 4);
  EXPECT_EQ(subset.examples, 32);
  EXPECT_EQ(whole.batches, 2);
  EXPECT_EQ(whole.batches_in_set, 2);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].batch, 2);
  EXPECT_EQ(seen[1].batches, 2);
  EXPECT_EQ(seen[1].batches_evaluated, 2);
  EXPECT_EQ(seen[1].batches_in_set, 4);
  EXPECT_EQ(seen[1].examples, 16);
  EXPECT_EQ(limited->trainer->evaluate(),
            std::make_pair(subset.loss, subset.accuracy));
  // The epoch's stats say it, with the epoch in the progress.
  seen.clear();
  const auto stats = limited->trainer->fit(
      nullptr, nullptr, [&](const EvalProgress& p) { seen.push_back(p); });
  ASSERT_FALSE(stats.empty());
  EXPECT_TRUE(stats[0].test_subset());
  EXPECT_EQ(stats[0].test_batches, 2);
  EXPECT_EQ(stats[0].test_batches_in_set, 4);
  EXPECT_EQ(stats[0].test_examples, 32);
  ASSERT_EQ(seen.size(), 2 * stats.size());
  EXPECT_EQ(seen[0].epoch, 1);
}

// evaluate_unless_stopped(): evaluate_subset()'s figures where nothing asks
// to stop; where stop_requested asks before the 3rd of 4 batches, false
// after 2 batches, the result untouched and the stop point saying so; the
// training data's evaluation alike.
TEST(Trainer, EvaluateUnlessStoppedStopsWhereAsked) {
  int64_t asked = 0;
  int64_t stop_at = 0; // the question answered yes (0: none)
  auto run = make_eval_run(
      TrainerOptions().stop_requested([&] { return ++asked == stop_at; }));
  const auto whole = run->trainer->evaluate_subset();
  lamp::training::Evaluation result;
  ASSERT_TRUE(run->trainer->evaluate_unless_stopped(result));
  EXPECT_EQ(result.loss, whole.loss);
  EXPECT_EQ(result.accuracy, whole.accuracy);
  EXPECT_EQ(result.batches, 4);
  EXPECT_EQ(asked, 4); // before each batch
  EXPECT_FALSE(run->trainer->stop_point().stopped);
  asked = 0;
  stop_at = 3;
  std::vector<EvalProgress> seen;
  lamp::training::Evaluation untouched;
  untouched.loss = -1;
  EXPECT_FALSE(run->trainer->evaluate_unless_stopped(
      untouched, false, [&](const EvalProgress& p) { seen.push_back(p); }, 7));
  EXPECT_EQ(untouched.loss, -1);
  EXPECT_EQ(seen.size(), 2u);
  const auto& stop = run->trainer->stop_point();
  EXPECT_TRUE(stop.stopped);
  EXPECT_TRUE(stop.in_evaluation);
  EXPECT_EQ(stop.epoch, 7);
  EXPECT_EQ(stop.asked_by_rank, 0);
  // The training data's: its own figures, and stopped alike.
  asked = 0;
  stop_at = 0;
  ASSERT_TRUE(run->trainer->evaluate_unless_stopped(result, true));
  EXPECT_EQ(result.loss, run->trainer->evaluate_training_data().loss);
  EXPECT_FALSE(run->trainer->stop_point().stopped);
  asked = 0;
  stop_at = 1;
  EXPECT_FALSE(run->trainer->evaluate_unless_stopped(result, true));
  EXPECT_TRUE(run->trainer->stop_point().stopped);
}

TEST(Trainer, LimitEvalBatchesOfZeroOrBeyondTheSetEvaluatesItAll) {
  // 64 images in batches of 10: 7 batches, the last of 4 images.
  for (const int64_t limit : {0, 7, 100}) {
    auto run = make_eval_run(TrainerOptions().limit_eval_batches(limit), 10);
    const auto eval = run->trainer->evaluate_subset();
    EXPECT_EQ(eval.batches, 7) << limit;
    EXPECT_EQ(eval.batches_in_set, 7) << limit;
    EXPECT_EQ(eval.examples, 64) << limit;
  }
  // The last, short batch counts its own images.
  auto run = make_eval_run(TrainerOptions().limit_eval_batches(6), 10);
  EXPECT_EQ(run->trainer->evaluate_subset().examples, 60);
  const auto refused =
      error_of([] { make_eval_run(TrainerOptions().limit_eval_batches(-1)); });
  EXPECT_NE(refused.find("--limit-eval-batches must be >= 0 (0 = all), got -1"),
            std::string::npos)
      << refused;
}

TEST(Trainer, WarmUpIsTheFirstTrainingStepNotTheFirstEvaluation) {
  // Every evaluation forward takes 100 ms: 4 batches, 0.4 s per evaluation,
  // which the warm-up must not contain.
  auto run = make_eval_run(
      TrainerOptions().epochs(2), 16, image_problem(false), [](bool training) {
        if (!training) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
  // The warm-up step lies between fit()'s start and the first batch's
  // report, which come before any evaluation: however slow the machine, a
  // warm-up with the evaluation in it would be longer than that.
  const auto start = std::chrono::steady_clock::now();
  double until_first_batch = -1;
  const auto stats = run->trainer->fit(nullptr, [&](const BatchProgress& p) {
    if (p.global_step == 1) {
      until_first_batch = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start)
                              .count();
    }
  });
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_GT(stats[0].warmup_seconds, 0.0);
  EXPECT_LE(stats[0].warmup_seconds, until_first_batch);
  EXPECT_GE(stats[0].eval_seconds, 0.4);
  EXPECT_GE(stats[1].eval_seconds, 0.4);
  EXPECT_EQ(stats[1].warmup_seconds, 0.0);
}

} // namespace
