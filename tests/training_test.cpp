#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lamp/optim/adam.h"
#include "lamp/optim/sgd.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/checkpoint_file.h"
#include "lamp/training/schedule.h"
#include "lamp/training/trainer.h"
#include "platform/checkpoint_io.h"
#include "test_util.h"
#include "trainer_util.h"
// describe_run_settings() is internal to the library (src/), for its ranks.
#include "../src/training/run_settings.h"

namespace {

using lamp::training::Schedule;
using lamp::training::Trainer;
using lamp::training::TrainerOptions;
using lamp_test::error_of;
using lamp_test::exists;
using lamp_test::file_bytes;
using lamp_test::image_problem;
using lamp_test::make_run;
using lamp_test::temp_path;
using lamp_test::with;

// Golden values from PyTorch 1.13's torch.optim.lr_scheduler.OneCycleLR
// (max_lr=0.1, total_steps=20, defaults), printed with %.17g.
TEST(Schedule, OneCycleMatchesPyTorch) {
  const std::vector<double> expected = {
      0.0040000000000000036, 0.013167184270002533,  0.037167184270002526,
      0.066832815729997469,  0.090832815729997476,  0.10000000000000001,
      0.098746400623508743,  0.095048463201347383,  0.089091617757105002,
      0.081174565394976306,  0.071694300179130088,  0.06112620219362893,
      0.050000200000000002,  0.038874197806371073,  0.028306099820869922,
      0.018825834605023701,  0.010908782242895003,  0.0049519367986526289,
      0.0012539993764912555, 3.9999999999999998e-07};
  for (int64_t step = 0; step < 20; ++step) {
    EXPECT_NEAR(
        lamp::training::learning_rate(Schedule::kOneCycle, 0.1, step, 20),
        expected[step], 1e-15)
        << "step " << step;
  }
}

TEST(Schedule, CosineConstantAndParsing) {
  EXPECT_DOUBLE_EQ(lamp::training::learning_rate(Schedule::kCosine, 0.2, 0, 10),
                   0.2);
  EXPECT_NEAR(lamp::training::learning_rate(Schedule::kCosine, 0.2, 5, 10), 0.1,
              1e-12);
  EXPECT_DOUBLE_EQ(
      lamp::training::learning_rate(Schedule::kConstant, 0.3, 9, 10), 0.3);
  EXPECT_EQ(lamp::training::parse_schedule("cosine"), Schedule::kCosine);
  EXPECT_EQ(lamp::training::to_string(Schedule::kOneCycle), "onecycle");
  EXPECT_THROW(lamp::training::parse_schedule("step"), c10::Error);
  torch::nn::Linear linear(2, 2);
  torch::optim::SGD sgd(linear->parameters(), 0.1);
  lamp::training::set_learning_rate(sgd, 0.025);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.025);
}

// Past its end (a run lengthened on resume) a schedule holds its last step's
// rate: it neither rises again (the cosine's second half-period) nor runs on
// past one-cycle's floor.
TEST(Schedule, HoldsTheLastStepsRatePastTheEnd) {
  using lamp::training::learning_rate;
  for (const auto schedule : {Schedule::kCosine, Schedule::kOneCycle}) {
    const double last = learning_rate(schedule, 0.1, 19, 20);
    for (const int64_t step : {20, 21, 30, 39, 1000}) {
      EXPECT_DOUBLE_EQ(learning_rate(schedule, 0.1, step, 20), last)
          << lamp::training::to_string(schedule) << " step " << step;
    }
  }
  EXPECT_DOUBLE_EQ(learning_rate(Schedule::kCosine, 0.1, 19, 20),
                   0.05 * (1 + std::cos(M_PI * 19 / 20)));
}

// Every parameter group gets the rate: the weight-decay groups of a GPT are
// two, and a schedule that moved only the first would leave the biases and
// norms at the initial rate.
TEST(Schedule, SetsTheRateOfEveryParamGroup) {
  torch::nn::Linear a(2, 2), b(2, 3);
  torch::optim::AdamW adamw(
      {torch::optim::OptimizerParamGroup(a->parameters()),
       torch::optim::OptimizerParamGroup(
           b->parameters(), std::make_unique<torch::optim::AdamWOptions>(0.5))},
      torch::optim::AdamWOptions(0.1));
  lamp::training::set_learning_rate(adamw, 0.025);
  ASSERT_EQ(adamw.param_groups().size(), 2u);
  for (auto& group : adamw.param_groups()) {
    EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.025);
  }
}

// The resume contract: 2 epochs straight == 1 epoch, checkpoint,
// a new process-like start from the checkpoint, 1 more epoch: bit-identical.
class TrainerResume : public ::testing::TestWithParam<lamp::Precision> {};

TEST_P(TrainerResume, ResumeContinuesBitIdentically) {
  const auto precision = GetParam();
  if (lamp::uses_fp16(precision) &&
      !lamp::fp16_compute_available(torch::kCPU)) {
    GTEST_SKIP() << lamp::to_string(precision)
                 << " needs FP16 CPU kernels, which this LibTorch lacks";
  }
  {
    const auto checkpoint = temp_path(lamp::to_string(precision) + ".pt");
    auto straight = make_run(precision, TrainerOptions().epochs(2));
    const auto full = straight->trainer->fit();
    ASSERT_EQ(full.size(), 2u);
    EXPECT_LT(full[1].train_loss, full[0].train_loss);

    auto first = make_run(
        precision,
        TrainerOptions().epochs(2).max_steps(6).checkpoint(checkpoint));
    ASSERT_EQ(first->trainer->fit().size(), 1u);
    EXPECT_TRUE(exists(checkpoint));
    auto resumed =
        make_run(precision, TrainerOptions().epochs(2).resume(checkpoint));
    EXPECT_EQ(resumed->trainer->start_epoch(), 1);
    const auto rest = resumed->trainer->fit();
    ASSERT_EQ(rest.size(), 1u);
    EXPECT_EQ(rest[0].epoch, 2);
    EXPECT_EQ(rest[0].train_loss, full[1].train_loss)
        << lamp::to_string(precision);
    EXPECT_EQ(rest[0].test_loss, full[1].test_loss)
        << lamp::to_string(precision);
    EXPECT_EQ(rest[0].global_step, full[1].global_step);
    std::remove(checkpoint.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(
    , TrainerResume,
    ::testing::Values(lamp::Precision::kFP32, lamp::Precision::kBF16,
                      lamp::Precision::kAMP, lamp::Precision::kHalf),
    [](const auto& info) { return lamp::to_string(info.param); });

TEST(Trainer, ReportsEpochStatistics) {
  auto run = make_run(lamp::Precision::kAMPBF16, TrainerOptions().epochs(3));
  std::vector<int64_t> seen;
  int64_t batches = 0;
  const auto stats = run->trainer->fit(
      [&](const lamp::training::EpochStats& s) { seen.push_back(s.epoch); },
      [&](const lamp::training::BatchProgress&) { ++batches; });
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(batches, 3 * 6);
  EXPECT_GT(stats.back().test_accuracy, 0.5); // 4 classes: chance is 0.25
  EXPECT_GT(stats.back().examples_per_second, 0);
  EXPECT_GT(stats.back().peak_memory_bytes, 0);
  EXPECT_EQ(stats.back().steps, 6);
  EXPECT_EQ(stats.back().loss_scale, 1.0);
  // The run's first step is warm-up, timed apart (evaluation is not).
  EXPECT_GT(stats[0].warmup_seconds, 0.0);
  EXPECT_EQ(stats[1].warmup_seconds, 0.0);
  EXPECT_EQ(stats[2].warmup_seconds, 0.0);
}

// An evaluation leaves the model in the mode it found it in: a caller's
// model in eval mode stays there (it was put back in training mode), and
// fit()'s evaluations hand a training model back to training.
TEST(Trainer, AnEvaluationLeavesTheModelsModeAsItWas) {
  auto run = make_run(lamp::Precision::kFP32, TrainerOptions().epochs(1));
  run->model->eval();
  run->trainer->evaluate();
  EXPECT_FALSE(run->model->is_training());
  run->model->train();
  run->trainer->evaluate();
  EXPECT_TRUE(run->model->is_training());
  bool training_after_evaluation = false;
  run->trainer->fit([&](const lamp::training::EpochStats&) {
    training_after_evaluation = run->model->is_training();
  });
  EXPECT_TRUE(training_after_evaluation);
}

// The trainer's default, CudaGraphMode::kAuto: eager steps on the CPU (and
// the reason), CUDA graphs on a GPU, where they train as eager steps do and
// their pool's memory is in the peak of the epochs after the capture.
TEST(Trainer, CudaGraphsWhereTheyApply_CUDA) {
  auto cpu = make_run(lamp::Precision::kFP32, TrainerOptions().epochs(1));
  EXPECT_EQ(cpu->trainer->options().step().cuda_graph(),
            lamp::CudaGraphMode::kAuto);
  EXPECT_FALSE(cpu->trainer->train_step().cuda_graph_enabled());
  EXPECT_FALSE(
      cpu->trainer->train_step().cuda_graph_unavailable_reason().empty());
  if (!lamp::cuda_available()) {
    GTEST_SKIP() << "no CUDA GPU: the GPU half of this test did not run";
  }
  std::vector<std::vector<lamp::training::EpochStats>> stats;
  for (auto mode : {lamp::CudaGraphMode::kAuto, lamp::CudaGraphMode::kOff}) {
    auto run = make_run(lamp::Precision::kAMP,
                        with(TrainerOptions().epochs(3),
                             [&](auto& o) { o.step().cuda_graph(mode); }),
                        0.05, 32, torch::kCUDA);
    auto& step = run->trainer->train_step();
    EXPECT_EQ(step.cuda_graph_enabled(), mode == lamp::CudaGraphMode::kAuto)
        << step.cuda_graph_unavailable_reason();
    stats.push_back(run->trainer->fit());
    if (mode == lamp::CudaGraphMode::kAuto) {
      EXPECT_GT(step.cuda_graph_pool_bytes(), 0);
      EXPECT_GT(stats.back()[2].peak_memory_bytes,
                step.cuda_graph_pool_bytes());
    } else {
      EXPECT_EQ(step.cuda_graph_pool_bytes(), 0);
    }
  }
  for (size_t e = 0; e < 3; ++e) {
    // The same steps on the same data: only cuDNN's algorithm choices may
    // differ between the runs (a few FP16 ulps, amplified by training).
    EXPECT_NEAR(stats[0][e].train_loss, stats[1][e].train_loss,
                2e-2 * stats[1][e].train_loss)
        << "epoch " << e + 1;
  }
  EXPECT_GT(stats[0][2].test_accuracy, 0.5);
}

// A checkpoint of a run on a GPU holds the GPU's generator (dropout draws
// from it there): a resume goes on drawing what the run would have drawn
// next, not its seed's numbers again.
TEST(Trainer, ResumeRestoresTheCudaGenerator_CUDA) {
  if (!lamp::cuda_available()) {
    GTEST_SKIP() << "no CUDA GPU";
  }
  const auto checkpoint = temp_path("cuda_rng.pt");
  std::remove(checkpoint.c_str());
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  auto first =
      make_run(lamp::Precision::kFP32,
               TrainerOptions().epochs(1).max_steps(2).checkpoint(checkpoint),
               0.05, 32, torch::kCUDA);
  // Away from make_run's seed, which the resumed run's make_run sets again:
  // only a restored generator gives the same draws as this one.
  torch::cuda::manual_seed(77);
  torch::rand({3}, cuda);
  first->trainer->fit();
  const auto next = torch::rand({16}, cuda);
  torch::rand({1000}, cuda); // the generator moves on
  torch::cuda::manual_seed(123);
  auto resumed = make_run(lamp::Precision::kFP32,
                          TrainerOptions().epochs(1).resume(checkpoint), 0.05,
                          32, torch::kCUDA);
  EXPECT_TRUE(torch::equal(torch::rand({16}, cuda), next));
  // A run that does not resume draws otherwise.
  make_run(lamp::Precision::kFP32, TrainerOptions().epochs(1), 0.05, 32,
           torch::kCUDA);
  EXPECT_FALSE(torch::equal(torch::rand({16}, cuda), next));
  std::remove(checkpoint.c_str());
}

// A damaged GPU generator state is refused before the checkpoint changes
// anything of the run: the model keeps its weights (it was checked after
// the model, the optimizer and the scaler had been replaced).
TEST(Trainer, ADamagedCudaGeneratorStateChangesNothing_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto checkpoint = temp_path("cuda_rng_whole.pt");
  const auto forged = temp_path("cuda_rng_damaged.pt");
  const auto options = TrainerOptions().epochs(1).max_steps(2);
  make_run(lamp::Precision::kFP32,
           TrainerOptions(options).checkpoint(checkpoint), 0.05, 32,
           torch::kCUDA)
      ->trainer->fit();
  torch::serialize::InputArchive original;
  lamp::load_checked_archive(original, checkpoint);
  torch::serialize::OutputArchive archive;
  for (const auto& key : original.keys()) {
    // Nested archives (optional ones, and the step's, written below) and
    // the tensors, written as the trainer writes them.
    if (key == "train_step" || key == "cuda_rng_state" ||
        key == "cpu_rng_state" || key == "history" ||
        key == "program_settings") {
      continue;
    }
    c10::IValue value;
    ASSERT_TRUE(original.try_read(key, value)) << key;
    archive.write(key, value);
  }
  torch::Tensor rng;
  original.read("cpu_rng_state", rng);
  archive.write("cpu_rng_state", rng);
  torch::serialize::InputArchive step;
  ASSERT_TRUE(original.try_read("train_step", step));
  auto other =
      make_run(lamp::Precision::kFP32, options, 0.05, 32, torch::kCUDA);
  other->trainer->train_step().load(step);
  torch::serialize::OutputArchive step_out;
  other->trainer->train_step().save(step_out);
  archive.write("train_step", step_out);
  archive.write("cuda_rng_state", torch::zeros({3}, torch::kByte));
  lamp::save_checked_archive(archive, forged);
  auto run = make_run(lamp::Precision::kFP32, options, 0.05, 32, torch::kCUDA);
  run->trainer->fit();
  std::vector<torch::Tensor> before;
  for (const auto& p : run->model->parameters()) {
    before.push_back(p.detach().clone());
  }
  const auto error = error_of([&] { run->trainer->load_checkpoint(forged); });
  EXPECT_NE(error.find("the saved CUDA random number generator state is "
                       "damaged"),
            std::string::npos)
      << error;
  const auto after = run->model->parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(after[i], before[i])) << i;
  }
  std::remove(checkpoint.c_str());
  std::remove(forged.c_str());
}

// Each optimizer trains the small problem from the same start, and a
// checkpoint remembers which one it was: resuming with another is refused.
TEST(Trainer, TrainsWithEachOptimizerAndRefusesToSwitchOnResume) {
  const auto checkpoint = temp_path("optimizer.pt");
  for (const std::string name : {"sgd", "adam", "adamw"}) {
    auto run = make_run(lamp::Precision::kAMPBF16,
                        with(TrainerOptions().epochs(3).checkpoint(
                                 name == "adam" ? checkpoint : ""),
                             [&](auto& o) { o.optimizer().name(name); }),
                        name == "sgd" ? 0.05 : 0.01);
    auto& optimizer = run->trainer->train_step().optimizer();
    EXPECT_EQ(dynamic_cast<lamp::optim::SGD*>(&optimizer) != nullptr,
              name == "sgd");
    EXPECT_EQ(dynamic_cast<lamp::optim::Adam*>(&optimizer) != nullptr,
              name == "adam");
    EXPECT_EQ(dynamic_cast<lamp::optim::AdamW*>(&optimizer) != nullptr,
              name == "adamw");
    const auto stats = run->trainer->fit();
    EXPECT_LT(stats.back().train_loss, stats.front().train_loss) << name;
    EXPECT_GT(stats.back().test_accuracy, 0.5) << name; // chance: 0.25
  }
  try {
    make_run(lamp::Precision::kAMPBF16,
             with(TrainerOptions().epochs(4).resume(checkpoint),
                  [](auto& o) { o.optimizer().name("sgd"); }));
    FAIL() << "resumed an Adam checkpoint with SGD";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume with --optimizer adam"),
              std::string::npos)
        << e.what();
  }
  std::remove(checkpoint.c_str());
}

// A BF16 run of 2 epochs (6 steps each) that skips non-finite steps, whose
// training steps 2 and 4 of the first epoch overflow; `training_calls`
// counts the training forwards.
std::unique_ptr<lamp_test::Run> run_overflowing_twice(int64_t& training_calls) {
  auto run = make_run(lamp::Precision::kBF16,
                      with(TrainerOptions().epochs(2),
                           [](auto& o) { o.step().skip_non_finite(true); }));
  auto model = run->model;
  run->trainer = std::make_unique<Trainer>(
      model.ptr(),
      [model, &training_calls](const torch::Tensor& x) mutable {
        auto out = model->forward(x);
        if (model->is_training() &&
            (++training_calls == 2 || training_calls == 4)) {
          out = out * std::numeric_limits<float>::infinity();
        }
        return out;
      },
      "smallnet",
      lamp::data::DeviceLoader(image_problem(true), torch::kCPU,
                               lamp::data::LoaderOptions(32).seed(9)),
      lamp::data::DeviceLoader(image_problem(false), torch::kCPU,
                               lamp::data::LoaderOptions(64).shuffle(false)),
      with(TrainerOptions(lamp::Precision::kBF16).epochs(2), [](auto& o) {
        o.optimizer().lr(0.05);
        o.step().skip_non_finite(true);
      }));
  return run;
}

// Skipped steps are counted per epoch (on the device, read at its end), and
// a skipped step leaves the weights finite.
TEST(Trainer, CountsSkippedStepsPerEpoch) {
  int64_t training_calls = 0;
  auto run = run_overflowing_twice(training_calls);
  auto model = run->model;
  const auto stats = run->trainer->fit();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].skipped_steps, 2);
  EXPECT_EQ(stats[1].skipped_steps, 0);
  // The skipped steps' NaN losses are counted, not averaged in.
  EXPECT_EQ(stats[0].non_finite_losses, 2);
  EXPECT_TRUE(std::isfinite(stats[0].train_loss));
  EXPECT_TRUE(std::isfinite(stats[1].train_loss));
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

// An epoch's loss statistics are its own: the non-finite losses counted
// from 0 at each epoch, and the mean loss the finite losses' sum over their
// count (4, then 6 steps), summed in FP64 as the trainer does.
TEST(Trainer, EpochLossStatisticsStartAfreshEachEpoch) {
  int64_t training_calls = 0;
  auto run = run_overflowing_twice(training_calls);
  std::vector<std::vector<float>> losses(2);
  const auto stats =
      run->trainer->fit(nullptr, [&](const lamp::training::BatchProgress& p) {
        losses.at(p.epoch - 1).push_back(p.loss.item<float>());
      });
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].non_finite_losses, 2);
  EXPECT_EQ(stats[1].non_finite_losses, 0);
  for (size_t e = 0; e < 2; ++e) {
    SCOPED_TRACE("epoch " + std::to_string(e + 1));
    ASSERT_EQ(losses[e].size(), 6u);
    double sum = 0;
    int64_t finite = 0;
    for (float loss : losses[e]) {
      if (std::isfinite(loss)) {
        sum += loss;
        ++finite;
      }
    }
    EXPECT_EQ(finite, e == 0 ? 4 : 6);
    EXPECT_NEAR(stats[e].train_loss, sum / finite, 1e-12 * sum);
  }
}

TEST(Trainer, StopsWithAClearErrorWhenTheLossStaysNonFinite) {
  auto run = make_run(lamp::Precision::kFP32,
                      TrainerOptions().epochs(5).divergence_patience(4));
  // Poison the weights: every loss from now on is NaN.
  {
    torch::NoGradGuard no_grad;
    run->model->fc->weight.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  try {
    run->trainer->fit();
    FAIL() << "trained on with a NaN loss";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("training diverged"),
              std::string::npos)
        << e.what();
  }
}

// The divergence error names the first module with inf/NaN: found by
// re-running the last batch's forward and backward under the numerics check
// (without it), or by the check itself (with it, at the first step).
TEST(Trainer, DivergenceErrorNamesTheFirstModule) {
  auto run = make_run(lamp::Precision::kFP32,
                      TrainerOptions().epochs(2).divergence_patience(3));
  {
    torch::NoGradGuard no_grad;
    run->model->conv2->weight[0][0][0][0] =
        std::numeric_limits<float>::quiet_NaN();
  }
  const auto message = error_of([&] { run->trainer->fit(); });
  EXPECT_NE(message.find("training diverged in epoch 1"), std::string::npos)
      << message;
  EXPECT_NE(message.find("re-running the last batch under the numerics "
                         "check: step 3, forward: the output of module "
                         "'conv2'"),
            std::string::npos)
      << message;

  auto checked = make_run(lamp::Precision::kFP32,
                          TrainerOptions().epochs(2).check_numerics(true));
  {
    torch::NoGradGuard no_grad;
    checked->model->conv2->weight[0][0][0][0] =
        std::numeric_limits<float>::quiet_NaN();
  }
  const auto stopped = error_of([&] { checked->trainer->fit(); });
  EXPECT_NE(stopped.find("lamp::NumericsCheck: step 1, forward: the output of "
                         "module 'conv2' ("),
            std::string::npos)
      << stopped;
  EXPECT_FALSE(checked->trainer->train_step().cuda_graph_enabled());
}

// Re-running the failing step applies nothing twice: the gradients and
// BatchNorm's running statistics are as the last step left them.
TEST(Trainer, LocatingTheFirstModuleChangesNoState) {
  auto run = make_run(lamp::Precision::kFP32, TrainerOptions().epochs(2));
  {
    torch::NoGradGuard no_grad;
    run->model->conv2->weight[0][0][0][0] =
        std::numeric_limits<float>::quiet_NaN();
  }
  const auto state = [&] {
    std::vector<torch::Tensor> tensors;
    for (const auto& b : run->model->buffers()) {
      tensors.push_back(b.clone());
    }
    for (const auto& p : run->model->parameters()) {
      tensors.push_back(p.grad().defined() ? p.grad().clone()
                                           : torch::zeros({0}));
    }
    return tensors;
  };
  std::vector<torch::Tensor> before;
  const auto message = error_of([&] {
    run->trainer->fit(nullptr, [&](const lamp::training::BatchProgress& p) {
      if (p.batch == p.batches) {
        before = state(); // the end of the epoch, where it stops
      }
    });
  });
  EXPECT_NE(message.find("the loss was inf/NaN in all its 6 steps (re-running "
                         "the last batch under the numerics check: step 6, "
                         "forward: the output of module 'conv2'"),
            std::string::npos)
      << message;
  const auto after = state();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(before[i].equal(after[i]) ||
                (before[i].isnan().equal(after[i].isnan()) &&
                 before[i].nan_to_num().equal(after[i].nan_to_num())))
        << i;
  }
}

TEST(Trainer, CheckNumericsRefusesCudaGraphsOn) {
  const auto message = error_of([&] {
    make_run(lamp::Precision::kFP32,
             with(TrainerOptions().check_numerics(true),
                  [](auto& o) { o.step().cuda_graph(true); }));
  });
  EXPECT_NE(message.find("--check-numerics observes eager steps, but "
                         "--cuda-graph is on"),
            std::string::npos)
      << message;
}

// A wrongly typed field is lamp's error naming it, not an IValue assertion
// that asks for a PyTorch bug report.
TEST(Trainer, RefusesBadCheckpointsAndPaths) {
  const auto missing = temp_path("missing.pt");
  EXPECT_THROW(
      make_run(lamp::Precision::kFP32, TrainerOptions().resume(missing)),
      c10::Error);
  EXPECT_THROW(make_run(lamp::Precision::kFP32,
                        TrainerOptions().checkpoint("/nonexistent-dir/x.pt")),
               c10::Error);
  const auto checkpoint = temp_path("bf16.pt");
  auto run = make_run(lamp::Precision::kBF16,
                      TrainerOptions().epochs(1).checkpoint(checkpoint));
  run->trainer->fit();
  // Another precision cannot resume it.
  EXPECT_THROW(
      make_run(lamp::Precision::kFP32, TrainerOptions().resume(checkpoint)),
      c10::Error);
  std::remove(checkpoint.c_str());
}

// A test loader that would score a part of the test set, or altered
// examples, under the whole set's name is refused, each reason named: the
// evaluation shares the test batches among the ranks itself.
TEST(Trainer, RefusesATestLoaderThatIsNotTheWholeTestSet) {
  lamp_test::SmallNet model;
  const auto make = [&](const lamp::data::LoaderOptions& test_options) {
    return error_of([&] {
      Trainer(
          model.ptr(),
          [model](const torch::Tensor& x) mutable { return model->forward(x); },
          "smallnet",
          lamp::data::DeviceLoader(image_problem(true), torch::kCPU,
                                   lamp_test::train_loader_options(32)),
          lamp::data::DeviceLoader(image_problem(false), torch::kCPU,
                                   test_options),
          TrainerOptions().epochs(1));
    });
  };
  const auto plain = lamp::data::LoaderOptions(16).shuffle(false);
  EXPECT_EQ(make(plain), "");
  const auto sharded =
      make(lamp::data::LoaderOptions(plain).num_shards(2).shard(1));
  EXPECT_NE(sharded.find("the test loader has num_shards(2) (the evaluation "
                         "shares the test batches among the ranks itself)"),
            std::string::npos)
      << sharded;
  const auto dropping = make(lamp::data::LoaderOptions(plain).drop_last(true));
  EXPECT_NE(dropping.find("drop_last(true) (the last partial batch would go "
                          "unscored)"),
            std::string::npos)
      << dropping;
  EXPECT_NE(make(lamp::data::LoaderOptions(plain).horizontal_flip(true))
                .find("crop_padding or horizontal_flip"),
            std::string::npos);
  EXPECT_NE(make(lamp::data::LoaderOptions(plain).crop_padding(2))
                .find("crop_padding or horizontal_flip"),
            std::string::npos);
}

// A run started afresh over a sharded checkpoint (another world size,
// another step) removes the shard files no manifest at that name can name
// any more, and nothing else: before, they stayed beside it for good.
TEST(Trainer, TheFirstCheckpointRemovesTheShardsEarlierRunsLeft) {
  const auto checkpoint = temp_path("left_shards.pt");
  const auto write = [](const std::string& path) {
    std::ofstream(path) << "an earlier run's shard";
  };
  const std::vector<std::string> stale = {checkpoint + ".rank1-of-2.step4",
                                          checkpoint + ".rank3-of-4.step12"};
  // Names that only look like one: kept.
  const std::vector<std::string> others = {
      checkpoint + ".rank1-of-2.step4.bak", checkpoint + ".rank1-of-2.step",
      checkpoint + ".rankA-of-2.step4", checkpoint + ".best.rank1-of-2.step4",
      temp_path("other.pt.rank1-of-2.step4")};
  for (const auto& path : stale) {
    write(path);
  }
  for (const auto& path : others) {
    write(path);
  }
  make_run(lamp::Precision::kFP32,
           TrainerOptions().epochs(1).checkpoint(checkpoint))
      ->trainer->fit();
  EXPECT_TRUE(exists(checkpoint));
  for (const auto& path : stale) {
    EXPECT_FALSE(exists(path)) << path;
  }
  for (const auto& path : others) {
    EXPECT_TRUE(exists(path)) << path;
    std::remove(path.c_str());
  }
  std::remove(checkpoint.c_str());
}

// Divergence is counted across epochs, and an epoch that ends with a NaN
// mean loss ends the run: 6 steps per epoch, far below the patience of 100,
// used to train NaN to the end and write the NaN weights over the
// checkpoint.
TEST(Trainer, DivergenceInShortEpochsStopsAndKeepsTheCheckpoint) {
  const auto checkpoint = temp_path("diverge.pt");
  const auto options = TrainerOptions().epochs(3).checkpoint(checkpoint);
  make_run(lamp::Precision::kFP32, TrainerOptions(options).max_steps(6))
      ->trainer->fit();
  const auto good = file_bytes(checkpoint);
  ASSERT_FALSE(good.empty());
  auto run = make_run(lamp::Precision::kFP32,
                      TrainerOptions(options).resume(checkpoint));
  {
    torch::NoGradGuard no_grad;
    run->model->fc->weight.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  const auto message = error_of([&] { run->trainer->fit(); });
  EXPECT_NE(message.find("training diverged in epoch 2"), std::string::npos)
      << message;
  EXPECT_NE(message.find(checkpoint + " was left as it was"), std::string::npos)
      << message;
  EXPECT_EQ(file_bytes(checkpoint), good);
  // Nor can a direct save write NaN weights over it.
  const auto refused =
      error_of([&] { run->trainer->save_checkpoint(checkpoint); });
  EXPECT_NE(
      refused.find("has inf/NaN values; the previous checkpoint was left"),
      std::string::npos)
      << refused;
  EXPECT_EQ(file_bytes(checkpoint), good);
  run.reset();
  std::remove(checkpoint.c_str());
}

// Inside an epoch no evaluation or epoch check has looked at the model: a
// periodic checkpoint, or the one at a stop, whose step's loss was inf/NaN
// (steps skipped, the weights finite but the model diverged) is not
// written over the last good one, and a warning says so.
TEST(Trainer, ACheckpointInsideAnEpochIsNotWrittenAfterANonFiniteLoss) {
  const auto checkpoint = temp_path("non_finite_every.pt");
  std::remove(checkpoint.c_str());
  auto net = std::make_shared<lamp_test::SmallNet>(nullptr);
  int64_t steps = 0;
  auto run = make_run(
      lamp::Precision::kFP32,
      with(
          TrainerOptions().epochs(1).checkpoint(checkpoint).checkpoint_every(2),
          [&](TrainerOptions& o) {
            o.step().skip_non_finite(true);
            // From step 3 on, every loss is NaN.
            o.training_loss([&, net](const torch::Tensor& x,
                                     const torch::Tensor& y) {
              const auto loss =
                  torch::nn::functional::cross_entropy((*net)->forward(x), y);
              return ++steps > 2
                         ? loss * std::numeric_limits<float>::quiet_NaN()
                         : loss;
            });
            // A stop after step 5.
            o.stop_requested([&] { return steps == 5; });
          }));
  *net = run->model;
  const lamp_test::Warnings warnings;
  run->trainer->fit();
  EXPECT_EQ(run->trainer->stop_point().global_step, 5);
  EXPECT_EQ(lamp::training::read_checkpoint_settings(checkpoint).global_step,
            2);
  EXPECT_EQ(run->trainer->stop_point().checkpoint_step, 2);
  const auto warned = warnings.containing(
      "was not written: that step's loss "
      "was inf/NaN");
  ASSERT_EQ(warned.size(), 2u); // step 4 (periodic) and step 5 (the stop)
  EXPECT_NE(warned[0].find("the checkpoint of step 4"), std::string::npos)
      << warned[0];
  EXPECT_NE(warned[0].find("(it keeps step 2)"), std::string::npos)
      << warned[0];
  run.reset();
  std::remove(checkpoint.c_str());
}

// Steps skipped for inf gradients (the loss stays finite) are counted across
// epochs: 8 in a row stop the run in its second epoch of 6 steps.
TEST(Trainer, SkippedStepsCountAcrossEpochs) {
  auto run = make_run(lamp::Precision::kFP32,
                      with(TrainerOptions().epochs(3).divergence_patience(8),
                           [](auto& o) { o.step().skip_non_finite(true); }));
  run->model->fc->weight.register_hook([](const torch::Tensor& grad) {
    return grad * std::numeric_limits<float>::infinity();
  });
  std::vector<int64_t> finished;
  const auto message = error_of([&] {
    run->trainer->fit(
        [&](const auto& stats) { finished.push_back(stats.epoch); });
  });
  EXPECT_NE(
      message.find(
          "training diverged in epoch 2: 8 optimizer steps in a row had inf/NaN gradients"),
      std::string::npos)
      << message;
  EXPECT_EQ(finished, std::vector<int64_t>{1});
}

// A resumed run must repeat the settings the checkpoint was trained with;
// the error names the flag and the value to give.
TEST(Trainer, ResumeRefusesChangedSettingsNamingTheFlag) {
  const auto checkpoint = temp_path("settings.pt");
  const auto options =
      TrainerOptions().epochs(2).max_steps(6).checkpoint(checkpoint);
  make_run(lamp::Precision::kAMPBF16, options)->trainer->fit();
  const auto resume = TrainerOptions().epochs(2).resume(checkpoint);
  const auto refusal = [&](TrainerOptions changed, double lr, int64_t batch) {
    return error_of(
        [&] { make_run(lamp::Precision::kAMPBF16, changed, lr, batch); });
  };
  EXPECT_NE(refusal(resume, 0.05, 16).find("resume with --batch-size 32"),
            std::string::npos);
  EXPECT_NE(refusal(resume, 0.1, 32).find("resume with --lr 0.05"),
            std::string::npos);
  EXPECT_NE(refusal(TrainerOptions(resume).epochs(3), 0.05, 32)
                .find("resume with --epochs 2"),
            std::string::npos);
  EXPECT_NE(
      refusal(TrainerOptions(resume).schedule(Schedule::kCosine), 0.05, 32)
          .find("resume with --schedule onecycle"),
      std::string::npos);
  EXPECT_NE(refusal(with(resume, [](auto& o) { o.optimizer().momentum(0.5); }),
                    0.05, 32)
                .find("resume with --momentum 0.9"),
            std::string::npos);
  EXPECT_EQ(refusal(resume, 0.05, 32), "");
  std::remove(checkpoint.c_str());
}

// Resuming a finished run trains nothing (the program says so).
TEST(Trainer, ResumingAFinishedRunTrainsNothing) {
  const auto checkpoint = temp_path("finished.pt");
  make_run(lamp::Precision::kFP32,
           TrainerOptions().epochs(1).checkpoint(checkpoint))
      ->trainer->fit();
  auto resumed = make_run(lamp::Precision::kFP32,
                          TrainerOptions().epochs(1).resume(checkpoint));
  EXPECT_EQ(resumed->trainer->start_epoch(), 1);
  EXPECT_TRUE(resumed->trainer->fit().empty());
  std::remove(checkpoint.c_str());
}

// Hand-made checkpoints (valid checksum, bad fields): every field is checked
// for presence, type and range before anything changes.
TEST(Trainer, ResumeChecksEveryFieldOfAHandMadeCheckpoint) {
  const auto checkpoint = temp_path("fields.pt");
  const auto forged = temp_path("forged.pt");
  const auto options = TrainerOptions().epochs(2).max_steps(6);
  make_run(lamp::Precision::kFP32,
           TrainerOptions(options).checkpoint(checkpoint))
      ->trainer->fit();
  auto source = make_run(lamp::Precision::kFP32,
                         TrainerOptions(options).resume(checkpoint));
  torch::serialize::InputArchive original;
  lamp::load_checked_archive(original, checkpoint);
  const std::vector<std::string> keys = {
      "format",         "model_name",       "optimizer",    "precision",
      "batch_size",     "epochs",           "lr",           "schedule",
      "momentum",       "weight_decay",     "train_images", "steps_per_epoch",
      "next_epoch",     "global_step",      "seed",         "epoch_step",
      "epoch_loss_sum", "epoch_non_finite", "mean"};
  // Writes the checkpoint's fields with `changes` (a None value drops one).
  const auto forge = [&](const std::map<std::string, c10::IValue>& changes) {
    torch::serialize::OutputArchive archive;
    for (const auto& key : keys) {
      c10::IValue value;
      ASSERT_TRUE(original.try_read(key, value)) << key;
      const auto change = changes.find(key);
      if (change != changes.end()) {
        value = change->second;
      }
      if (!value.isNone()) {
        archive.write(key, value);
      }
    }
    torch::Tensor rng;
    original.read("cpu_rng_state", rng);
    archive.write("cpu_rng_state", rng);
    torch::serialize::OutputArchive step;
    source->trainer->train_step().save(step);
    archive.write("train_step", step);
    lamp::save_checked_archive(archive, forged);
  };
  const auto resume_error = [&]() {
    return error_of([&] {
      make_run(lamp::Precision::kFP32, TrainerOptions(options).resume(forged));
    });
  };
  forge({});
  EXPECT_EQ(resume_error(), "");
  // The mean and std (train_mnist measures them from the data) agree to
  // 1e-12 of each value: the same measurement rounded otherwise (another
  // LibTorch's sums) resumes; another measurement, or another number of
  // channels, does not.
  forge({{"mean", c10::IValue(std::string(
                      "0.50000000000000011, 0.5, 0.49999999999999994"))}});
  EXPECT_EQ(resume_error(), "");
  for (const char* other_mean : {"0.5000001, 0.5, 0.5", "0.5, 0.5", "none"}) {
    forge({{"mean", c10::IValue(std::string(other_mean))}});
    EXPECT_NE(resume_error().find(std::string(other_mean) +
                                  " but this run uses 0.5, 0.5, 0.5"),
              std::string::npos)
        << other_mean << ": " << resume_error();
  }
  forge({});
  // `keys` are those of a checkpoint written before max_grad_norm and the
  // data's fingerprints were stored: they are not checked.
  auto other = image_problem(true);
  other.inputs = other.inputs.flip(0);
  EXPECT_EQ(error_of([&] {
              make_run(lamp::Precision::kFP32,
                       with(TrainerOptions(options).resume(forged),
                            [](auto& o) { o.step().max_grad_norm(2.0); }),
                       0.05, 32, torch::kCPU, other);
            }),
            "");
  const int64_t huge = int64_t{1} << 62;
  for (const auto& [key, value] : std::map<std::string, c10::IValue>{
           {"next_epoch", c10::IValue(huge)},
           {"next_epoch", c10::IValue(int64_t{-1})}}) {
    forge({{key, value}});
    EXPECT_NE(resume_error().find("cannot reach; the checkpoint is damaged"),
              std::string::npos)
        << key << " " << value;
  }
  forge({{"global_step", c10::IValue(int64_t{-5})}});
  EXPECT_NE(resume_error().find("cannot reach"), std::string::npos);
  // The position inside an epoch: its step within the epoch's 6, its
  // non-finite losses within its steps, a finite loss sum.
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, c10::IValue>>{
           {"epoch_step", c10::IValue(int64_t{6})},
           {"epoch_step", c10::IValue(int64_t{-1})},
           {"epoch_non_finite", c10::IValue(int64_t{1})},
           {"epoch_loss_sum", c10::IValue(std::nan(""))}}) {
    forge({{key, value}});
    EXPECT_NE(resume_error().find("cannot reach; the checkpoint is damaged"),
              std::string::npos)
        << key << " " << value;
  }
  forge({{"next_epoch", c10::IValue(std::string("1"))}});
  EXPECT_NE(
      resume_error().find(
          "'next_epoch' has type String in the archive where an integer is expected"),
      std::string::npos);
  forge({{"model_name", c10::IValue(int64_t{3})}});
  EXPECT_NE(
      resume_error().find(
          "'model_name' has type Int in the archive where a string is expected"),
      std::string::npos);
  forge({{"lr", c10::IValue()}});
  EXPECT_NE(resume_error().find("has no 'lr'"), std::string::npos);
  forge({{"train_images", c10::IValue(int64_t{50000})}});
  EXPECT_NE(resume_error().find("resume with the same --data"),
            std::string::npos);
  forge({{"steps_per_epoch", c10::IValue(int64_t{7})}});
  EXPECT_NE(resume_error().find("7 steps per epoch"), std::string::npos);
  std::remove(checkpoint.c_str());
  std::remove(forged.c_str());
}

TEST(CheckpointFile, CheckWritablePathRefusesFoldersThatCannotTakeAFile) {
  const auto path = temp_path("writable.pt");
  lamp::check_writable_path(path, "--export-state-dict");
  EXPECT_FALSE(exists(path)); // the probe file is gone
  EXPECT_NE(error_of([&] {
              lamp::check_writable_path(path + ".d/x.pt",
                                        "--export-state-dict");
            }).find("--export-state-dict"),
            std::string::npos);
  // Even root cannot create files in /proc.
  const auto message = error_of([] {
    lamp::check_writable_path("/proc/lamp_export.pt", "--export-state-dict");
  });
  EXPECT_NE(message.find("cannot create a file in its folder"),
            std::string::npos)
      << message;
}

// A killed run with this process's pid (a container's trainer is pid 1 on
// every run) left temporaries under the names this process would take
// first: the writes pass over them (before, O_EXCL failed with "File
// exists" and the advice to make the folder writable), and leave them as
// they were. Run as its own process (ctest), this process's names start at
// the first of those.
TEST(CheckpointFile, AKilledRunsTemporariesUnderOurNamesAreStepped) {
  const auto path = temp_path("stepped.pt");
  const auto tokens = temp_path("stepped.bin");
  std::vector<std::string> left;
  // The named writes step over 500 names; the unnamed one's names are
  // taken beyond where they leave the counter.
  for (const auto& [p, names] :
       std::vector<std::pair<std::string, int>>{{path, 500}, {tokens, 1200}}) {
    for (int k = 1; k <= names; ++k) {
      left.push_back(p + ".tmp-" + std::to_string(::getpid()) + "-" +
                     std::to_string(k));
      std::ofstream(left.back()) << "a killed run's";
    }
  }
  EXPECT_EQ(
      error_of([&] { lamp::check_writable_path(path, "--export-state-dict"); }),
      "");
  c10::Dict<std::string, torch::Tensor> dict;
  dict.insert("x", torch::arange(3, torch::kFloat));
  EXPECT_EQ(error_of([&] { lamp::save_pickle(dict, path); }), "");
  EXPECT_TRUE(torch::equal(
      lamp::load_pickle(path, "test").toGenericDict().at("x").toTensor(),
      torch::arange(3, torch::kFloat)));
  // An unnamed temporary (O_TMPFILE), named at the commit.
  {
    lamp::detail::StreamingFile file(tokens, /*unnamed=*/true);
    file.write("ids", 3);
    EXPECT_EQ(error_of([&] { file.commit(); }), "");
  }
  EXPECT_EQ(file_bytes(tokens), "ids");
  for (const auto& name : left) {
    std::ifstream in(name);
    std::string text;
    std::getline(in, text);
    EXPECT_EQ(text, "a killed run's") << name;
    std::remove(name.c_str());
  }
  std::remove(path.c_str());
  std::remove(tokens.c_str());
}

// The lock file is opened as a file of its own: a symbolic link at its name
// would have its target truncated to a pid, a folder gave "make it
// writable". Both are refused naming what to remove; a file stays the lock.
TEST(CheckpointFile, TheLockIsAFileOfItsOwn) {
  const auto path = temp_path("locked.pt");
  const auto target = temp_path("notes.txt");
  std::ofstream(target) << "my notes";
  ASSERT_EQ(::symlink(target.c_str(), (path + ".lock").c_str()), 0);
  const auto linked = error_of([&] { lamp::CheckpointLock lock(path); });
  EXPECT_NE(linked.find(path + ".lock is a symbolic link; the checkpoint's "
                               "lock file must be a file of its own: remove "
                               "the link."),
            std::string::npos)
      << linked;
  EXPECT_EQ(file_bytes(target), "my notes");
  std::remove((path + ".lock").c_str());
  ASSERT_EQ(::mkdir((path + ".lock").c_str(), 0755), 0);
  const auto folder = error_of([&] { lamp::CheckpointLock lock(path); });
  EXPECT_NE(folder.find(path + ".lock is a folder"), std::string::npos)
      << folder;
  ::rmdir((path + ".lock").c_str());
  EXPECT_EQ(error_of([&] { lamp::CheckpointLock lock(path); }), "");
  std::remove(target.c_str());
}

TEST(CheckpointFile, PickleFilesRoundTrip) {
  const auto path = temp_path("pickle.pt");
  c10::Dict<std::string, torch::Tensor> dict;
  dict.insert("x", torch::arange(4, torch::kFloat));
  dict.insert("n", torch::tensor(int64_t{7}));
  lamp::save_pickle(dict, path);
  const auto back = lamp::load_pickle(path, "test").toGenericDict();
  EXPECT_TRUE(
      torch::equal(back.at("x").toTensor(), torch::arange(4, torch::kFloat)));
  EXPECT_EQ(back.at("n").toTensor().item<int64_t>(), 7);
  std::ofstream(path, std::ios::trunc) << "not a zip";
  EXPECT_NE(error_of([&] { lamp::load_pickle(path, "caller"); })
                .find("caller: " + path +
                      " is not a file written by Python's torch.save"),
            std::string::npos);
  std::remove(path.c_str());
}

} // namespace

// Accumulation and clipping reach the TrainStep: 6 batches per epoch with 3
// accumulation steps are 2 optimizer steps (Adam counts them); every batch is
// reported with its step, learning rate and loss (a device tensor). An
// accumulation that does not divide the epoch is refused with the divisors.
TEST(Trainer, AccumulatesClipsAndReportsEachBatch) {
  const auto options = with(TrainerOptions().epochs(1), [](auto& o) {
    o.optimizer().name("adam").implementation(
        lamp::optim::Implementation::kPerTensor);
    o.step().accumulation_steps(3).max_grad_norm(1.0);
  });
  auto run = make_run(lamp::Precision::kFP32, options, 1e-3);
  auto& step = run->trainer->train_step();
  EXPECT_EQ(step.options().accumulation_steps(), 3);
  EXPECT_EQ(step.options().max_grad_norm(), 1.0);
  std::vector<lamp::training::BatchProgress> seen;
  run->trainer->fit(nullptr, [&](const lamp::training::BatchProgress& p) {
    seen.push_back(p);
  });
  ASSERT_EQ(seen.size(), 6u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].global_step, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(seen[i].batch, static_cast<int64_t>(i) + 1);
    EXPECT_GT(seen[i].lr, 0.0);
    ASSERT_TRUE(seen[i].loss.defined());
    EXPECT_TRUE(std::isfinite(seen[i].loss.item<double>()));
    EXPECT_EQ(seen[i].warmup, i == 0);
  }
  // The running totals are the trainer's live ones: at the end they hold
  // the epoch's sum of (finite) losses and no non-finite one.
  double sum = 0;
  for (const auto& p : seen) {
    sum += p.loss.item<double>();
  }
  EXPECT_NEAR(seen.back().epoch_loss_sum.item<double>(), sum,
              1e-9 * std::abs(sum));
  EXPECT_EQ(seen.back().non_finite_losses.item<int64_t>(), 0);
  EXPECT_EQ(seen.front().non_finite_before_epoch, 0);
  ASSERT_FALSE(step.optimizer().state().empty());
  for (const auto& item : step.optimizer().state()) {
    EXPECT_EQ(
        static_cast<const torch::optim::AdamParamState&>(*item.second).step(),
        2);
  }
  const auto refused = error_of([&] {
    make_run(lamp::Precision::kFP32,
             with(options, [](auto& o) { o.step().accumulation_steps(4); }),
             1e-3);
  });
  EXPECT_NE(refused.find(
                "4 accumulation steps do not divide the 6 batches of an epoch"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("use one of 1, 2, 3, 6,"), std::string::npos)
      << refused;
  // max_steps inside a cycle: refused before any step, not a run that took
  // no optimizer step (or dropped its last gradients) and ended as if done.
  const auto too_short = error_of([&] {
    make_run(lamp::Precision::kFP32,
             with(options, [](auto& o) { o.max_steps(2); }), 1e-3);
  });
  EXPECT_NE(too_short.find("--max-steps 2 is not a multiple of the 3 "
                           "--accumulation-steps: the run would end inside an "
                           "accumulation cycle, before its first optimizer "
                           "step; use 3"),
            std::string::npos)
      << too_short;
  const auto ragged = error_of([&] {
    make_run(lamp::Precision::kFP32,
             with(options, [](auto& o) { o.max_steps(5); }), 1e-3);
  });
  EXPECT_NE(ragged.find("--max-steps 5 is not a multiple of the 3 "
                        "--accumulation-steps: the run would end inside an "
                        "accumulation cycle, dropping its last gradients; "
                        "use 3 or another multiple of 3"),
            std::string::npos)
      << ragged;
}

// A stop asked for inside an accumulation cycle (after the cycle's second
// of 3 batches) finishes the cycle, since the half-summed gradients cannot
// be saved, then stops and writes its checkpoint; the resume ends where the
// straight run does, to the bit.
TEST(Trainer, AStopInsideAnAccumulationCycleFinishesTheCycle) {
  const auto checkpoint = temp_path("stop_in_cycle.pt");
  std::remove(checkpoint.c_str());
  const auto options = with(TrainerOptions().epochs(2),
                            [](auto& o) { o.step().accumulation_steps(3); });
  const auto full =
      make_run(lamp::Precision::kFP32, options, 1e-3)->trainer->fit();
  ASSERT_EQ(full.size(), 2u);
  bool stop = false;
  {
    auto first = make_run(
        lamp::Precision::kFP32,
        with(options,
             [&](auto& o) {
               o.checkpoint(checkpoint).stop_requested([&] { return stop; });
             }),
        1e-3);
    std::vector<int64_t> steps;
    first->trainer->fit(nullptr, [&](const lamp::training::BatchProgress& p) {
      steps.push_back(p.global_step);
      stop = stop || p.global_step == 2;
    });
    EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
    const auto& at = first->trainer->stop_point();
    EXPECT_TRUE(at.stopped);
    EXPECT_FALSE(at.in_evaluation);
    EXPECT_EQ(at.steps, 3);
    EXPECT_EQ(at.global_step, 3);
    EXPECT_EQ(at.checkpoint_step, 3);
  }
  auto resumed =
      make_run(lamp::Precision::kFP32,
               with(options, [&](auto& o) { o.resume(checkpoint); }), 1e-3);
  EXPECT_EQ(resumed->trainer->global_step(), 3);
  const auto rest = resumed->trainer->fit();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].train_loss, full[0].train_loss);
  EXPECT_EQ(rest[1].train_loss, full[1].train_loss);
  EXPECT_EQ(rest[1].test_loss, full[1].test_loss);
  std::remove(checkpoint.c_str());
}

// Without TrainerOptions::option_name the library names its own options;
// the table of settings is what both writing and checking read.
TEST(Trainer, MessagesNameLibraryOptionsUnlessToldOtherwise) {
  const auto checkpoint = temp_path("library_names.pt");
  const auto library_names = [](const std::string&, const std::string& name) {
    return name;
  };
  make_run(lamp::Precision::kFP32,
           TrainerOptions().epochs(2).max_steps(6).checkpoint(checkpoint))
      ->trainer->fit();
  const auto resume =
      TrainerOptions().epochs(2).resume(checkpoint).option_name(library_names);
  EXPECT_NE(
      error_of([&] {
        make_run(lamp::Precision::kFP32, resume, 0.1);
      }).find("was trained with TrainerOptions::optimizer().lr 0.05 but this run uses 0.1; resume with TrainerOptions::optimizer().lr 0.05"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              make_run(lamp::Precision::kBF16, resume);
            }).find("resume with TrainerOptions::step().precision fp32"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_run(lamp::Precision::kFP32, with(resume, [](auto& o) {
                         o.optimizer().name("adam");
                       }));
            }).find("resume with TrainerOptions::optimizer().name sgd"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_run(lamp::Precision::kFP32, resume, 0.05, 16);
            }).find("resume with LoaderOptions::batch_size 32"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_run(lamp::Precision::kFP32,
                       TrainerOptions().epochs(0).option_name(library_names));
            }).find("TrainerOptions::epochs must be positive, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_run(lamp::Precision::kFP32, resume, -1.0);
            }).find("TrainerOptions::optimizer().lr must be positive"),
            std::string::npos);
  std::remove(checkpoint.c_str());
}

// The new settings are stored and a resume must repeat them.
// So are clipping and the data itself: a resume on other data of the same
// size (MNIST for Fashion-MNIST) is refused naming it.
TEST(Trainer, ResumeRefusesOtherAccumulationBiasDecayClipOrData) {
  const auto checkpoint = temp_path("accumulation.pt");
  const auto options =
      with(TrainerOptions().epochs(2).max_steps(6), [](auto& o) {
        o.step().accumulation_steps(2).max_grad_norm(1.0);
        o.optimizer().no_bias_decay(true);
      });
  make_run(lamp::Precision::kFP32,
           TrainerOptions(options).checkpoint(checkpoint))
      ->trainer->fit();
  const auto resume = TrainerOptions(options).max_steps(0).resume(checkpoint);
  EXPECT_EQ(error_of([&] { make_run(lamp::Precision::kFP32, resume); }), "");
  EXPECT_NE(error_of([&] {
              make_run(lamp::Precision::kFP32, with(resume, [](auto& o) {
                         o.step().accumulation_steps(3);
                       }));
            }).find("resume with --accumulation-steps 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_run(lamp::Precision::kFP32, with(resume, [](auto& o) {
                         o.optimizer().no_bias_decay(false);
                       }));
            }).find("was trained with --no-bias-decay; resume with it"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_run(lamp::Precision::kFP32, with(resume, [](auto& o) {
                         o.step().max_grad_norm(0.0);
                       }));
            }).find("resume with --max-grad-norm 1"),
            std::string::npos);
  auto other = image_problem(true);
  other.inputs = other.inputs.flip(0); // the same images in another order
  const auto refusal = error_of([&] {
    make_run(lamp::Precision::kFP32, resume, 0.05, 32, torch::kCPU, other);
  });
  EXPECT_NE(refusal.find("was trained on other training data (192 images "
                         "3x8x8, labels crc32 "),
            std::string::npos)
      << refusal;
  EXPECT_NE(refusal.find("resume with the same --data"), std::string::npos);
  std::remove(checkpoint.c_str());
}

// Every stored setting shows its own option's value: three runs whose
// options all differ, and whose seven switches take three patterns in which
// no two switches agree throughout, so that a setting that read another
// option's value would show.
TEST(Trainer, EachStoredSettingShowsItsOwnOption) {
  using Pair = std::pair<std::string, std::string>;
  const auto text = [](bool b) { return std::string(b ? "true" : "false"); };
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE("pattern " + std::to_string(k));
    // Switch i is on where bit k of i + 1 is set: 001 010 011 100 101 110
    // 111.
    const auto on = [k](int i) { return (((i + 1) >> k) & 1) != 0; };
    auto options = with(TrainerOptions().epochs(7 + k), [&](auto& o) {
      o.option_name(lamp_test::flag_name);
      o.schedule(lamp::training::Schedule::kCosine);
      o.steps(30 + k).warmup_steps(3 + k).min_lr(1e-4 * (k + 1));
      o.zero_stage(k % 2);
      o.step()
          .precision(lamp::Precision::kAMPBF16)
          .accumulation_steps(4 + k)
          .max_grad_norm(0.5 + k)
          .skip_non_finite(on(2))
          .force_loss_scaling(on(3))
          .tf32(true);
      // The FP8 recipe: none, then current and delayed, each field apart.
      if (k > 0) {
        o.step().float8(lamp::nn::Float8Recipe()
                            .scaling(k == 2 ? lamp::nn::Float8Scaling::kDelayed
                                            : lamp::nn::Float8Scaling::kCurrent)
                            .amax_history_len(5 + k)
                            .margin(k));
      }
      o.optimizer()
          .name("adam")
          .lr(0.0123)
          .momentum(0.85)
          .weight_decay(0.001)
          .no_bias_decay(on(0))
          .nesterov(on(1))
          .beta1(0.8 + 0.01 * k)
          .beta2(0.95 + 0.001 * k);
    });
    const auto loader = lamp::data::LoaderOptions(24 + k)
                            .seed(12345678901ULL + k)
                            .shuffle(on(4))
                            .horizontal_flip(on(5))
                            .random_windows(on(6))
                            .crop_padding(3)
                            .mean({0.1, 0.2, 0.3})
                            .std({0.4, 0.5, 0.6})
                            .dtype(torch::kBFloat16)
                            .num_shards(2);
    const std::string train = "train fingerprint", test = "test fingerprint";
    const std::vector<Pair> expected = {
        {"--precision", "amp-bf16"},
        {"--optimizer", "adam"},
        {"--batch-size", std::to_string(24 + k)},
        {"--epochs", std::to_string(7 + k)},
        {"--lr", "0.0123"},
        {"--schedule", "cosine"},
        {"--momentum", "0.85"},
        {"--weight-decay", "0.001"},
        {"--no-bias-decay", text(on(0))},
        {"--accumulation-steps", std::to_string(4 + k)},
        {"--seed", std::to_string(12345678901ULL + k)},
        {"--train-data", train},
        {"--test-data", test},
        {"--max-grad-norm", k == 0   ? "0.5"
                            : k == 1 ? "1.5"
                                     : "2.5"},
        {"--nesterov", text(on(1))},
        {"--skip-non-finite", text(on(2))},
        {"--force-loss-scaling", text(on(3))},
        {"--tf32", "on"},
        {"--shuffle", text(on(4))},
        {"--crop-padding", "3"},
        {"--horizontal-flip", text(on(5))},
        {"--mean", "0.1, 0.2, 0.3"},
        {"--std", "0.4, 0.5, 0.6"},
        {"--image-dtype", "BFloat16"},
        {"--num-shards", "2"},
        {"--steps", std::to_string(30 + k)},
        {"--warmup-steps", std::to_string(3 + k)},
        {"--min-lr",
         k == 0 ? "0.0001" : (k == 1 ? "0.0002" : "0.00030000000000000003")},
        {"--beta1", k == 0 ? "0.8" : (k == 1 ? "0.81" : "0.82000000000000006")},
        {"--beta2", k == 0 ? "0.95" : (k == 1 ? "0.951" : "0.952")},
        {"--zero-stage", std::to_string(k % 2)},
        {"--fp8-scaling", k == 0 ? "none" : (k == 1 ? "current" : "delayed")},
        {"--fp8-amax-history", k == 0 ? "1024" : std::to_string(5 + k)},
        {"--fp8-margin", std::to_string(k)},
        {"--windows", on(6) ? "random" : "fixed"}};
    EXPECT_EQ(lamp::training::detail::describe_run_settings(
                  {options, loader, train, test}),
              expected);
  }
}

// Every stored setting, named as messages name it, in the table's order.
TEST(Trainer, DescribesEveryStoredSetting) {
  auto run = make_run(lamp::Precision::kAMPBF16,
                      with(TrainerOptions().epochs(3),
                           [](auto& o) { o.step().max_grad_norm(0.5); }));
  const auto& trainer = *run->trainer;
  const auto train = lamp::data::fingerprint(image_problem(true));
  const auto test = lamp::data::fingerprint(image_problem(false));
  const auto loader = lamp_test::train_loader_options(32);
  const auto described = lamp::training::detail::describe_run_settings(
      {trainer.options(), loader, train, test});
  const std::map<std::string, std::string> by_name(described.begin(),
                                                   described.end());
  EXPECT_EQ(described.size(), by_name.size()); // no name twice
  EXPECT_EQ(described.front(), std::make_pair(std::string("--precision"),
                                              std::string("amp-bf16")));
  EXPECT_EQ(by_name.at("--epochs"), "3");
  EXPECT_EQ(by_name.at("--max-grad-norm"), "0.5");
  EXPECT_EQ(by_name.at("--crop-padding"), "1");
  EXPECT_EQ(by_name.at("--mean"), "0.5, 0.5, 0.5");
  EXPECT_EQ(by_name.at("--train-data"), train);
  EXPECT_EQ(by_name.at("--test-data"), test);
  EXPECT_EQ(by_name.at("--nesterov"), "true");
  EXPECT_EQ(by_name.at("--fp8-scaling"), "none");
  // Precision fp8 without a recipe of its own converts with the default
  // recipe, and says so.
  auto fp8 = trainer.options();
  fp8.step().precision(lamp::Precision::kFP8);
  const auto fp8_described =
      lamp::training::detail::describe_run_settings({fp8, loader, train, test});
  const std::map<std::string, std::string> fp8_by_name(fp8_described.begin(),
                                                       fp8_described.end());
  EXPECT_EQ(fp8_by_name.at("--fp8-scaling"), "current");
  EXPECT_EQ(fp8_by_name.at("--fp8-amax-history"), "1024");
  EXPECT_EQ(fp8_by_name.at("--fp8-margin"), "0");
}
