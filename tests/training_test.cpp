#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lamp/backends.h"
#include "lamp/optim/adam.h"
#include "lamp/optim/sgd.h"
#include "lamp/training/schedule.h"
#include "lamp/training/trainer.h"
#include "test_util.h"

namespace {

using lamp::training::ClassifierTrainer;
using lamp::training::Schedule;
using lamp::training::TrainerOptions;

// Golden values from PyTorch 1.13's torch.optim.lr_scheduler.OneCycleLR
// (max_lr=0.1, total_steps=20, defaults), printed with %.17g.
TEST(Schedule, OneCycleMatchesPyTorch) {
  const std::vector<double> expected = {
      0.0040000000000000036, 0.013167184270002533, 0.037167184270002526,
      0.066832815729997469,  0.090832815729997476, 0.10000000000000001,
      0.098746400623508743,  0.095048463201347383, 0.089091617757105002,
      0.081174565394976306,  0.071694300179130088, 0.06112620219362893,
      0.050000200000000002,  0.038874197806371073, 0.028306099820869922,
      0.018825834605023701,  0.010908782242895003, 0.0049519367986526289,
      0.0012539993764912555, 3.9999999999999998e-07};
  for (int64_t step = 0; step < 20; ++step) {
    EXPECT_NEAR(lamp::training::learning_rate(Schedule::kOneCycle, 0.1, step, 20),
                expected[step], 1e-15)
        << "step " << step;
  }
}

TEST(Schedule, CosineConstantAndParsing) {
  EXPECT_DOUBLE_EQ(lamp::training::learning_rate(Schedule::kCosine, 0.2, 0, 10), 0.2);
  EXPECT_NEAR(lamp::training::learning_rate(Schedule::kCosine, 0.2, 5, 10), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(lamp::training::learning_rate(Schedule::kConstant, 0.3, 9, 10), 0.3);
  EXPECT_EQ(lamp::training::parse_schedule("cosine"), Schedule::kCosine);
  EXPECT_EQ(lamp::training::to_string(Schedule::kOneCycle), "onecycle");
  EXPECT_THROW(lamp::training::parse_schedule("step"), c10::Error);
  torch::nn::Linear linear(2, 2);
  torch::optim::SGD sgd(linear->parameters(), 0.1);
  lamp::training::set_learning_rate(sgd, 0.025);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.025);
}

// A small uint8 image problem the SmallNet can learn in a few epochs: the
// first 192 images train, the last 64 test (same labelling rule).
lamp::data::Dataset image_problem(bool train) {
  torch::manual_seed(1);
  const int64_t n = 256;
  auto offsets = torch::randn({n, 3, 1, 1});
  auto images = (128 + 40 * offsets + 20 * torch::randn({n, 3, 8, 8}))
                    .clamp(0, 255).to(torch::kByte);
  auto labels = offsets.flatten(1).mm(torch::randn({3, 4})).argmax(1);
  const int64_t start = train ? 0 : 192, end = train ? 192 : n;
  return {images.slice(0, start, end), labels.slice(0, start, end)};
}

struct Run {
  lamp_test::SmallNet model;
  std::unique_ptr<ClassifierTrainer> trainer;
};

std::unique_ptr<Run> make_run(lamp::Precision precision, TrainerOptions options,
                              double lr = 0.05) {
  auto run = std::make_unique<Run>();
  torch::manual_seed(5);
  run->model = lamp_test::SmallNet();
  auto model = run->model;
  const auto loader_options = lamp::data::LoaderOptions(32).seed(9).crop_padding(1)
                                  .horizontal_flip(true).mean({0.5, 0.5, 0.5})
                                  .std({0.2, 0.2, 0.2});
  run->trainer = std::make_unique<ClassifierTrainer>(
      model.ptr(), [model](const torch::Tensor& x) mutable { return model->forward(x); },
      "smallnet",
      lamp::data::DeviceLoader(image_problem(true), torch::kCPU, loader_options),
      lamp::data::DeviceLoader(image_problem(false), torch::kCPU,
                               lamp::data::LoaderOptions(64).shuffle(false)
                                   .mean({0.5, 0.5, 0.5}).std({0.2, 0.2, 0.2})),
      options.precision(precision).lr(lr));
  return run;
}

// POSIX, not std::filesystem (see src/training/trainer.cpp).
std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "lamp_training_test_" + std::to_string(::getpid()) +
      "_" + name;
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// The resume contract: 2 epochs straight == 1 epoch, checkpoint,
// a new process-like start from the checkpoint, 1 more epoch: bit-identical.
class ClassifierTrainerResume : public ::testing::TestWithParam<lamp::Precision> {};

TEST_P(ClassifierTrainerResume, ResumeContinuesBitIdentically) {
  const auto precision = GetParam();
  if (lamp::uses_fp16(precision) && !lamp::fp16_compute_available(torch::kCPU)) {
    GTEST_SKIP() << lamp::to_string(precision)
                 << " needs FP16 CPU kernels, which this LibTorch lacks";
  }
  {
    const auto checkpoint = temp_path(lamp::to_string(precision) + ".pt");
    auto straight = make_run(precision, TrainerOptions().epochs(2));
    const auto full = straight->trainer->fit();
    ASSERT_EQ(full.size(), 2u);
    EXPECT_LT(full[1].train_loss, full[0].train_loss);

    auto first = make_run(precision, TrainerOptions().epochs(2).max_steps(6)
                                         .checkpoint(checkpoint));
    ASSERT_EQ(first->trainer->fit().size(), 1u);
    EXPECT_FALSE(exists(checkpoint + ".partial"));
    EXPECT_TRUE(exists(checkpoint));
    auto resumed = make_run(precision, TrainerOptions().epochs(2).resume(checkpoint));
    EXPECT_EQ(resumed->trainer->start_epoch(), 1);
    const auto rest = resumed->trainer->fit();
    ASSERT_EQ(rest.size(), 1u);
    EXPECT_EQ(rest[0].epoch, 2);
    EXPECT_EQ(rest[0].train_loss, full[1].train_loss) << lamp::to_string(precision);
    EXPECT_EQ(rest[0].test_loss, full[1].test_loss) << lamp::to_string(precision);
    EXPECT_EQ(rest[0].global_step, full[1].global_step);
    std::remove(checkpoint.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(, ClassifierTrainerResume,
                         ::testing::Values(lamp::Precision::kFP32,
                                           lamp::Precision::kBF16,
                                           lamp::Precision::kAMP,
                                           lamp::Precision::kHalf),
                         [](const auto& info) { return lamp::to_string(info.param); });

TEST(ClassifierTrainer, ReportsEpochStatistics) {
  auto run = make_run(lamp::Precision::kAMPBF16, TrainerOptions().epochs(3));
  std::vector<int64_t> seen;
  int64_t batches = 0;
  const auto stats = run->trainer->fit(
      [&](const lamp::training::EpochStats& s) { seen.push_back(s.epoch); },
      [&](const lamp::training::BatchProgress&) { ++batches; });
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(batches, 3 * 6);
  EXPECT_GT(stats.back().test_accuracy, 0.5);  // 4 classes: chance is 0.25
  EXPECT_GT(stats.back().images_per_second, 0);
  EXPECT_GT(stats.back().peak_memory_bytes, 0);
  EXPECT_EQ(stats.back().steps, 6);
  EXPECT_EQ(stats.back().loss_scale, 1.0);
  // The run's first step and first evaluation are warm-up, timed apart.
  EXPECT_GT(stats[0].warmup_seconds, 0.0);
  EXPECT_EQ(stats[1].warmup_seconds, 0.0);
  EXPECT_EQ(stats[2].warmup_seconds, 0.0);
}

// Each optimizer trains the small problem from the same start, and a
// checkpoint remembers which one it was: resuming with another is refused.
TEST(ClassifierTrainer, TrainsWithEachOptimizerAndRefusesToSwitchOnResume) {
  const auto checkpoint = temp_path("optimizer.pt");
  for (const std::string name : {"sgd", "adam", "adamw"}) {
    auto run = make_run(lamp::Precision::kAMPBF16,
                        TrainerOptions().epochs(3).optimizer(name).checkpoint(
                            name == "adam" ? checkpoint : ""),
                        name == "sgd" ? 0.05 : 0.01);
    auto& optimizer = run->trainer->train_step().optimizer();
    EXPECT_EQ(dynamic_cast<lamp::optim::SGD*>(&optimizer) != nullptr, name == "sgd");
    EXPECT_EQ(dynamic_cast<lamp::optim::Adam*>(&optimizer) != nullptr, name == "adam");
    EXPECT_EQ(dynamic_cast<lamp::optim::AdamW*>(&optimizer) != nullptr, name == "adamw");
    const auto stats = run->trainer->fit();
    EXPECT_LT(stats.back().train_loss, stats.front().train_loss) << name;
    EXPECT_GT(stats.back().test_accuracy, 0.5) << name;  // chance: 0.25
  }
  try {
    make_run(lamp::Precision::kAMPBF16,
             TrainerOptions().epochs(4).optimizer("sgd").resume(checkpoint));
    FAIL() << "resumed an Adam checkpoint with SGD";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume with --optimizer adam"),
              std::string::npos)
        << e.what();
  }
  std::remove(checkpoint.c_str());
}

// Skipped steps are counted per epoch (on the device, read at its end), and
// a skipped step leaves the weights finite.
TEST(ClassifierTrainer, CountsSkippedStepsPerEpoch) {
  auto run = make_run(lamp::Precision::kBF16,
                      TrainerOptions().epochs(2).skip_non_finite(true));
  int64_t training_calls = 0;
  auto model = run->model;
  run->trainer = std::make_unique<ClassifierTrainer>(
      model.ptr(),
      [model, &training_calls](const torch::Tensor& x) mutable {
        auto out = model->forward(x);
        // Training steps 2 and 4 of the first epoch (of 6) overflow.
        if (model->is_training() && (++training_calls == 2 || training_calls == 4)) {
          out = out * std::numeric_limits<float>::infinity();
        }
        return out;
      },
      "smallnet",
      lamp::data::DeviceLoader(image_problem(true), torch::kCPU,
                               lamp::data::LoaderOptions(32).seed(9)),
      lamp::data::DeviceLoader(image_problem(false), torch::kCPU,
                               lamp::data::LoaderOptions(64).shuffle(false)),
      TrainerOptions().epochs(2).precision(lamp::Precision::kBF16).lr(0.05)
          .skip_non_finite(true));
  const auto stats = run->trainer->fit();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].skipped_steps, 2);
  EXPECT_EQ(stats[1].skipped_steps, 0);
  EXPECT_TRUE(std::isfinite(stats[1].train_loss));
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

TEST(ClassifierTrainer, StopsWithAClearErrorWhenTheLossStaysNonFinite) {
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
    EXPECT_NE(std::string(e.what()).find("training diverged"), std::string::npos)
        << e.what();
  }
}

// A wrongly typed field is lamp's error naming it, not an IValue assertion
// that asks for a PyTorch bug report.
TEST(ClassifierTrainer, RefusesWronglyTypedCheckpointFields) {
  const auto checkpoint = temp_path("typed.pt");
  const std::vector<std::pair<std::string, c10::IValue>> fields = {
      {"model_name", c10::IValue(int64_t{7})},
      {"seed", c10::IValue(std::string("9"))}};
  for (size_t wrong = 0; wrong < fields.size(); ++wrong) {
    torch::serialize::OutputArchive archive;
    archive.write("format", c10::IValue(std::string("lamp-classifier-trainer-1")));
    archive.write("model_name", wrong == 0 ? fields[0].second
                                           : c10::IValue(std::string("smallnet")));
    archive.write("seed", wrong == 1 ? fields[1].second : c10::IValue(int64_t{9}));
    archive.save_to(checkpoint);
    lamp_test::expect_error(
        [&] { make_run(lamp::Precision::kFP32, TrainerOptions().resume(checkpoint)); },
        "'" + fields[wrong].first + "' has type " +
            fields[wrong].second.tagKind() + " in the archive where " +
            (wrong == 0 ? "a string" : "an integer") + " is expected");
  }
  std::remove(checkpoint.c_str());
}

TEST(ClassifierTrainer, RefusesBadCheckpointsAndPaths) {
  const auto missing = temp_path("missing.pt");
  EXPECT_THROW(make_run(lamp::Precision::kFP32, TrainerOptions().resume(missing)),
               c10::Error);
  EXPECT_THROW(make_run(lamp::Precision::kFP32,
                        TrainerOptions().checkpoint("/nonexistent-dir/x.pt")),
               c10::Error);
  const auto checkpoint = temp_path("bf16.pt");
  auto run = make_run(lamp::Precision::kBF16, TrainerOptions().epochs(1).checkpoint(checkpoint));
  run->trainer->fit();
  // Another precision cannot resume it.
  EXPECT_THROW(make_run(lamp::Precision::kFP32, TrainerOptions().resume(checkpoint)),
               c10::Error);
  std::remove(checkpoint.c_str());
}

} // namespace
