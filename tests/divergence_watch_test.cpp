// The trainer's divergence counting, step by step: the exact patience
// boundary of a run of skipped steps, a taken step that ends the run, the
// run of non-finite losses in a row (scattered inf/NaN losses never add up
// to a false stop; a run across two windows is one run), and the per-epoch
// skip counter.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "lamp/amp/grad_scaler.h"
#include "lamp/amp/train_step.h"
#include "lamp/training/trainer.h"
#include "test_util.h"
#include "training/divergence_watch.h"

namespace {

using lamp::training::TrainerOptions;
using lamp::training::detail::DivergenceWatch;

// One step as the trainer reports it: its loss and, at the end of a cycle,
// whether the optimizer step was skipped.
lamp::StepResult step(bool skipped, bool finite_loss = true,
                      bool cycle_ended = true) {
  lamp::StepResult result;
  result.loss = torch::full(
      {}, finite_loss ? 0.5f : std::numeric_limits<float>::quiet_NaN());
  result.cycle_ended = cycle_ended;
  if (cycle_ended) {
    result.found_inf = torch::full({}, skipped ? 1.0f : 0.0f);
  }
  return result;
}

// A watch with `patience`, its options and scaler kept alive beside it.
struct Watched {
  explicit Watched(int64_t patience)
      : options(TrainerOptions().divergence_patience(patience)),
        scaler(lamp::GradScalerOptions().enabled(false)),
        watch(torch::kCPU, options, scaler) {}
  TrainerOptions options;
  lamp::GradScaler scaler;
  DivergenceWatch watch;
};

// Records `steps` in order; returns the 1-based index of the step whose
// record stopped the run (0: none did) and, in `message`, the error.
size_t stopping_step(DivergenceWatch& watch,
                     const std::vector<lamp::StepResult>& steps,
                     std::string* message = nullptr) {
  for (size_t i = 0; i < steps.size(); ++i) {
    try {
      watch.record(0, steps[i]);
    } catch (const c10::Error& e) {
      if (message != nullptr) {
        *message = e.what();
      }
      return i + 1;
    }
  }
  return 0;
}

TEST(DivergenceWatch, StopsAtExactlyPatienceSkippedStepsInARow) {
  // patience - 1 skipped steps in a row: no stop, at the window's check or
  // at the epoch's end.
  {
    Watched w(4);
    EXPECT_EQ(stopping_step(w.watch, {step(false), step(true), step(true),
                                      step(true), step(false), step(false),
                                      step(false), step(false)}),
              0u);
    EXPECT_NO_THROW(
        w.watch.check_epoch(0, 8, 0, 0.5, *torch::nn::Linear(2, 2)));
  }
  // patience of them: the run stops at the window's end, the 4th step.
  {
    Watched w(4);
    std::string message;
    EXPECT_EQ(
        stopping_step(w.watch, {step(true), step(true), step(true), step(true)},
                      &message),
        4u);
    EXPECT_NE(message.find("training diverged in epoch 1: 4 optimizer steps "
                           "in a row had inf/NaN gradients"),
              std::string::npos)
        << message;
  }
  // A run that reaches patience between two checks is caught at the next
  // one: here the end of the epoch.
  {
    Watched w(4);
    EXPECT_EQ(stopping_step(w.watch, {step(false), step(false), step(true),
                                      step(true), step(true), step(true)}),
              0u);
    EXPECT_THROW(w.watch.check_epoch(0, 6, 0, 0.5, *torch::nn::Linear(2, 2)),
                 c10::Error);
  }
}

TEST(DivergenceWatch, ATakenStepEndsTheRunOfSkippedSteps) {
  Watched w(4);
  // 3 skipped, 1 taken, repeated: 15 of 20 steps skipped, never 4 in a row.
  std::vector<lamp::StepResult> steps;
  for (int i = 0; i < 20; ++i) {
    steps.push_back(step(i % 4 != 3));
  }
  EXPECT_EQ(stopping_step(w.watch, steps), 0u);
  EXPECT_EQ(w.watch.read_epoch_skipped(), 15);
  EXPECT_NO_THROW(w.watch.check_epoch(0, 20, 0, 0.5, *torch::nn::Linear(2, 2)));
  // Micro-batches inside an accumulation cycle neither skip nor take a
  // step: they leave the run as it is.
  Watched cycles(3);
  EXPECT_EQ(stopping_step(cycles.watch,
                          {step(true), step(false, true, false), step(true),
                           step(false, true, false), step(true)}),
            0u);
  EXPECT_THROW(cycles.watch.check_epoch(0, 5, 0, 0.5, *torch::nn::Linear(2, 2)),
               c10::Error);
}

TEST(DivergenceWatch, NonFiniteLossesStopAtPatienceOfThemInARow) {
  // One NaN loss in every window of 3 steps, over 30 steps: 10 in all,
  // never 3 in a row.
  {
    Watched w(3);
    std::vector<lamp::StepResult> steps;
    for (int i = 0; i < 30; ++i) {
      steps.push_back(step(false, /*finite_loss=*/i % 3 != 1));
    }
    EXPECT_EQ(stopping_step(w.watch, steps), 0u);
    EXPECT_EQ(w.watch.read_non_finite_losses(), 10);
  }
  // Two in a window, then a whole window of them: the stop comes at that
  // window's end.
  {
    Watched w(3);
    std::string message;
    EXPECT_EQ(stopping_step(
                  w.watch,
                  {step(false, false), step(false), step(false, false),
                   step(false, false), step(false, false), step(false, false)},
                  &message),
              6u);
    EXPECT_NE(message.find("the loss was inf/NaN for 3 steps in a row"),
              std::string::npos)
        << message;
  }
  // Three in a row across two windows (one at the end of the first, two at
  // the start of the second): stopped at the second window's check. Counted
  // per window, neither held three.
  {
    Watched w(3);
    EXPECT_EQ(stopping_step(w.watch, {step(false), step(false),
                                      step(false, false), step(false, false),
                                      step(false, false), step(false)}),
              6u);
  }
  // Two in a row, twice, across the windows: never three.
  {
    Watched w(3);
    EXPECT_EQ(stopping_step(
                  w.watch, {step(false), step(false, false), step(false, false),
                            step(false), step(false, false), step(false, false),
                            step(false), step(false), step(false)}),
              0u);
  }
}

TEST(DivergenceWatch, SkippedStepsAreCountedPerEpoch) {
  Watched w(100);
  w.watch.begin_epoch();
  EXPECT_EQ(stopping_step(w.watch, {step(true), step(false), step(true)}), 0u);
  EXPECT_EQ(w.watch.read_epoch_skipped(), 2);
  w.watch.begin_epoch();
  EXPECT_EQ(w.watch.read_epoch_skipped(), 0);
  EXPECT_EQ(stopping_step(w.watch, {step(true), step(false)}), 0u);
  EXPECT_EQ(w.watch.read_epoch_skipped(), 1);
}

// The end-of-epoch checks: an epoch without a finite loss, a non-finite
// mean loss (inf as well as NaN), inf/NaN in a parameter or a buffer, and a
// non-finite test loss each stop the run, naming what happened and that the
// checkpoint was left as it was; an epoch of 0 steps and finite values do
// not.
TEST(DivergenceWatch, EpochEndChecksStopOnEveryNonFiniteResult) {
  auto options = TrainerOptions().divergence_patience(100).checkpoint("run.pt");
  lamp::GradScaler scaler(lamp::GradScalerOptions().enabled(false));
  DivergenceWatch watch(torch::kCPU, options, scaler);
  torch::nn::BatchNorm1d bn(2);
  const auto stops = [&](const std::function<void()>& check) {
    return lamp_test::error_of(check);
  };
  const auto expect_stop = [&](const std::function<void()>& check,
                               const std::string& why) {
    const auto message = stops(check);
    EXPECT_NE(message.find("training diverged in epoch 3: " + why),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("The checkpoint run.pt was left as it was."),
              std::string::npos)
        << message;
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  EXPECT_NO_THROW(watch.check_epoch(2, 4, 1, 0.5, *bn));
  EXPECT_NO_THROW(watch.check_epoch(2, 0, 0, 0.0, *bn));
  expect_stop([&] { watch.check_epoch(2, 4, 4, 0.0, *bn); },
              "the loss was inf/NaN in all its 4 steps");
  expect_stop([&] { watch.check_epoch(2, 4, 0, kInf, *bn); },
              "its mean training loss is inf");
  expect_stop([&] { watch.check_epoch(2, 4, 0, -kInf, *bn); },
              "its mean training loss is -inf");
  {
    torch::NoGradGuard no_grad;
    bn->running_mean[1] = std::numeric_limits<float>::quiet_NaN();
  }
  expect_stop([&] { watch.check_epoch(2, 4, 0, 0.5, *bn); },
              "buffer 'running_mean' has inf/NaN values");
  {
    torch::NoGradGuard no_grad;
    bn->weight[0] = std::numeric_limits<float>::infinity();
  }
  expect_stop([&] { watch.check_epoch(2, 4, 0, 0.5, *bn); },
              "parameter 'weight' has inf/NaN values");
  EXPECT_NO_THROW(watch.check_test_loss(2, 1e30));
  expect_stop([&] { watch.check_test_loss(2, kInf); }, "the test loss is inf");
  expect_stop(
      [&] {
        watch.check_test_loss(2, std::numeric_limits<double>::quiet_NaN());
      },
      "the test loss is nan");
}

} // namespace
