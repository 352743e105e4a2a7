// The programs' progress display (examples/common/progress.h): what its step
// lines report.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>

#include "common/progress.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// A step of a one-epoch run of two batches, `examples` each, every loss 1.
lamp::training::BatchProgress step(int64_t batch, int64_t examples) {
  lamp::training::BatchProgress p;
  p.epoch = 1;
  p.batch = batch;
  p.batches = p.batches_in_epoch = 2;
  p.examples = examples;
  p.global_step = batch;
  p.lr = 0.1;
  p.loss = torch::ones({1});
  p.epoch_loss_sum = torch::full({}, static_cast<double>(batch),
                                 torch::TensorOptions(torch::kDouble));
  p.non_finite_losses = torch::zeros({}, torch::TensorOptions(torch::kLong));
  return p;
}

// The step line's rate ("... 1234 img/s ...") of the line for `batch`.
double line_rate(const std::string& printed, int64_t batch) {
  const std::regex line("step " + std::to_string(batch) +
                        "/2  loss [0-9.]+  ([0-9]+) img/s");
  std::smatch match;
  if (!std::regex_search(printed, match, line)) {
    ADD_FAILURE() << "no line for step " << batch << " in:\n" << printed;
    return -1;
  }
  return std::stod(match[1]);
}

// A step line after an --eval-every evaluation reports the steps' rate: the
// evaluation's time (StepEvaluation::eval_seconds) is not training time, as
// the epoch's figures leave it out. The clock is read around each update(),
// which reads it once inside, so the rate has bounds whatever the machine's
// load; the evaluation's 0.3 s, counted in, would give a rate far below them.
TEST(Progress, AStepLineAfterAnEvaluationLeavesTheEvaluationsTimeOut) {
  constexpr int64_t kExamples = 1000000;
  constexpr double kEvalSeconds = 0.3;
  lamp_examples::Progress progress(/*bar=*/false, /*timed_lines=*/false,
                                   /*log_every=*/1, /*show_scale=*/false,
                                   /*epochs=*/1, /*log=*/nullptr);
  ::testing::internal::CaptureStdout();
  const auto before_first = Clock::now();
  progress.update(step(1, kExamples));
  const auto after_first = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  lamp::training::StepEvaluation evaluation;
  evaluation.global_step = 1;
  evaluation.epoch = 1;
  evaluation.eval_seconds = kEvalSeconds;
  progress.print_evaluation(evaluation, /*total_steps=*/2);
  const auto before_second = Clock::now();
  progress.update(step(2, kExamples));
  const auto after_second = Clock::now();
  const auto printed = ::testing::internal::GetCapturedStdout();

  // The rate's window starts inside the first update() and ends inside the
  // second; the evaluation's time comes off it.
  const double longest = seconds(after_second - before_first) - kEvalSeconds;
  const double shortest = seconds(before_second - after_first) - kEvalSeconds;
  ASSERT_GT(shortest, 0.05); // the 0.4 s sleep, less the evaluation
  // Printed with "%.0f": within half a unit of the rate.
  const double rate = line_rate(printed, 2);
  EXPECT_GE(rate, kExamples / longest - 0.5) << printed;
  EXPECT_LE(rate, kExamples / shortest + 0.5) << printed;
}

// The clock starts as the epoch's first batch ends, so a line's rate counts
// the batches after it: with --log-every 1 the first line has nothing timed
// and says "?" (not "0 img/s"); with --log-every 2 the line for batches 1
// and 2 is batch 2's examples over the time since batch 1 (counting batch
// 1's examples too would double the rate, far outside the bounds).
TEST(Progress, AnEpochsFirstLineCountsOnlyTheBatchesTimed) {
  constexpr int64_t kExamples = 1000000;
  {
    lamp_examples::Progress progress(/*bar=*/false, /*timed_lines=*/false,
                                     /*log_every=*/1, /*show_scale=*/false,
                                     /*epochs=*/1, /*log=*/nullptr);
    ::testing::internal::CaptureStdout();
    progress.update(step(1, kExamples));
    const auto printed = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(printed.find("step 1/2  loss 1.0000  ? img/s  lr 0.1"),
              std::string::npos)
        << printed;
  }
  lamp_examples::Progress progress(/*bar=*/false, /*timed_lines=*/false,
                                   /*log_every=*/2, /*show_scale=*/false,
                                   /*epochs=*/1, /*log=*/nullptr);
  ::testing::internal::CaptureStdout();
  const auto before_first = Clock::now();
  progress.update(step(1, kExamples));
  const auto after_first = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto before_second = Clock::now();
  progress.update(step(2, kExamples));
  const auto after_second = Clock::now();
  const auto printed = ::testing::internal::GetCapturedStdout();
  const double longest = seconds(after_second - before_first);
  const double shortest = seconds(before_second - after_first);
  const double rate = line_rate(printed, 2);
  EXPECT_GE(rate, kExamples / longest - 0.5) << printed;
  EXPECT_LE(rate, kExamples / shortest + 0.5) << printed;
}

// The bar's rate and ETA count the batches its clock timed, too: after
// batch 2 of 100 it has timed one batch, so the rate is one batch's
// examples over the time since batch 1, and 98 batches remain at that pace
// (counting batch 1 would double the rate and halve the ETA).
TEST(Progress, TheBarsRateAndEtaCountOnlyTheBatchesTimed) {
  constexpr int64_t kExamples = 1000000;
  constexpr int64_t kBatches = 100;
  const auto batch = [](int64_t b) {
    auto p = step(b, kExamples);
    p.batches = p.batches_in_epoch = kBatches;
    return p;
  };
  // Room for every part of the line (stderr, captured, is no terminal).
  setenv("COLUMNS", "120", 1);
  lamp_examples::Progress progress(/*bar=*/true, /*timed_lines=*/false,
                                   /*log_every=*/0, /*show_scale=*/false,
                                   /*epochs=*/1, /*log=*/nullptr);
  ::testing::internal::CaptureStderr();
  const auto before_first = Clock::now();
  progress.update(batch(1));
  const auto after_first = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto before_second = Clock::now();
  progress.update(batch(2));
  const auto after_second = Clock::now();
  const auto drawn = ::testing::internal::GetCapturedStderr();
  const double longest = seconds(after_second - before_first);
  const double shortest = seconds(before_second - after_first);
  // The last drawing's figures.
  const std::regex figures(
      "2/100 loss 1.0000 ([0-9]+) img/s ETA ([0-9]+):([0-9]+)");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(drawn, match, figures)) << drawn;
  const double rate = std::stod(match[1]);
  EXPECT_GE(rate, kExamples / longest - 0.5) << drawn;
  EXPECT_LE(rate, kExamples / shortest + 0.5) << drawn;
  // The ETA, rounded to whole seconds.
  const double eta = 60.0 * std::stod(match[2]) + std::stod(match[3]);
  EXPECT_GE(eta, (kBatches - 2) * shortest - 0.5) << drawn;
  EXPECT_LE(eta, (kBatches - 2) * longest + 0.5) << drawn;
}

} // namespace
