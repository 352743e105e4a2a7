#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "lamp/backends.h"
#include "lamp/train_step.h"
#include "test_util.h"

namespace {

using lamp::Precision;
using lamp_test::BitEqual;
using lamp_test::SmallNet;

lamp::OptimizerFactory sgd(double lr, double momentum = 0.9) {
  return [=](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(lr).momentum(momentum));
  };
}

bool fp16_runs_on_cpu(Precision p) {
  return !lamp::uses_fp16(p) || lamp::fp16_compute_available(torch::kCPU);
}

// Trains SmallNet on the fixed synthetic problem; returns the mean loss of
// the last `tail` steps and the first step's loss.
std::pair<double, double> train(Precision precision, int steps,
                                torch::Device device = torch::kCPU) {
  const auto problem = lamp_test::make_problem(256, 4, 0);
  torch::manual_seed(1);
  SmallNet model;
  model->to(device);
  lamp::TrainStep step(model.ptr(), sgd(0.05), precision);
  double first = 0, tail_sum = 0;
  const int tail = 5;
  for (int i = 0; i < steps; ++i) {
    const auto idx = torch::arange((i % 4) * 64, (i % 4 + 1) * 64);
    const auto x = problem.images.index_select(0, idx).to(device);
    const auto y = problem.labels.index_select(0, idx).to(device);
    const auto result = step.step([&] {
      return torch::nn::functional::cross_entropy(
          model->forward(step.cast_input(x)).to(torch::kFloat), y);
    });
    const double loss = result.loss.item<double>();
    if (i == 0) first = loss;
    if (i >= steps - tail) tail_sum += loss;
  }
  return {first, tail_sum / tail};
}

// fp32, amp-bf16 and bf16 train the same net on the same data to nearby
// losses. BF16 keeps 8 significant bits (relative rounding up to 2^-9 per
// op), so the trajectories drift apart a little; measured on LibTorch 1.13
// CPU: loss 1.357 -> 0.2126, with the BF16 modes within 1.1e-4 of FP32. The
// bound, 0.02 (about 10% of the final loss, a few BF16 ulps of the logits
// compounded), leaves room for other CPUs and LibTorch builds yet fails a
// mode that loses small updates (no master weights) or trains wrongly.
TEST(TrainStep, CpuModesConvergeToTheFp32Loss) {
  const auto fp32 = train(Precision::kFP32, 60);
  EXPECT_LT(fp32.second, 0.5 * fp32.first);
  for (auto precision : {Precision::kAMPBF16, Precision::kBF16,
                         Precision::kAMP, Precision::kHalf}) {
    if (!fp16_runs_on_cpu(precision)) {
      continue;  // refused by design; see RefusesFp16ModesWithoutFp16Kernels
    }
    const auto result = train(precision, 60);
    std::cout << "[ loss     ] " << lamp::to_string(precision) << ": first "
              << result.first << ", last " << result.second << " (fp32 "
              << fp32.second << ")\n";
    EXPECT_LT(result.second, 0.5 * result.first) << lamp::to_string(precision);
    EXPECT_NEAR(result.second, fp32.second, 0.02) << lamp::to_string(precision);
  }
}

TEST(TrainStep, RefusesFp16ModesWithoutFp16Kernels) {
  for (auto precision : {Precision::kAMP, Precision::kHalf}) {
    SmallNet model;
    if (fp16_runs_on_cpu(precision)) {
      // A modest scale keeps this one step's FP16 gradients finite.
      lamp::TrainStep step(
          model.ptr(), sgd(0.1),
          lamp::TrainStepOptions(precision).scaler(
              lamp::GradScalerOptions().init_scale(1024)));
      const auto result = step.step([&] {
        return model->forward(step.cast_input(torch::randn({2, 3, 8, 8})))
            .to(torch::kFloat)
            .pow(2)
            .mean();
      });
      EXPECT_TRUE(result.optimizer_stepped) << lamp::to_string(precision);
      EXPECT_EQ(result.scale.item<double>(), 1024.0);
      continue;
    }
    try {
      lamp::TrainStep step(model.ptr(), sgd(0.1), precision);
      FAIL() << lamp::to_string(precision) << " accepted on CPU";
    } catch (const c10::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'amp-bf16' or 'bf16'"), std::string::npos) << what;
    }
    // Refused before touching the model.
    EXPECT_EQ(model->conv1->weight.scalar_type(), torch::kFloat);
  }
}

TEST(TrainStep, Bf16ModeConvertsTheModelAndOptimizesFp32Masters) {
  SmallNet model;
  lamp::TrainStep step(model.ptr(), sgd(0.1), Precision::kBF16);
  EXPECT_EQ(model->conv1->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->bn1->weight.scalar_type(), torch::kFloat);
  ASSERT_NE(step.master_weights(), nullptr);
  for (const auto& group : step.optimizer().param_groups()) {
    for (const auto& p : group.params()) {
      EXPECT_EQ(p.scalar_type(), torch::kFloat);
    }
  }
  EXPECT_EQ(step.cast_input(torch::ones({1})).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(step.cast_input(torch::arange(2)).scalar_type(), torch::kLong);
  EXPECT_FALSE(step.scaler().is_enabled());
  const auto before = model->fc->weight.detach().clone();
  const auto result = step.step([&] {
    return model->forward(step.cast_input(torch::randn({4, 3, 8, 8})))
        .to(torch::kFloat)
        .pow(2)
        .mean();
  });
  EXPECT_TRUE(result.optimizer_stepped);
  EXPECT_EQ(result.scale.item<double>(), 1.0);
  EXPECT_FALSE(BitEqual(model->fc->weight.detach(), before));
  // The model holds the masters' values, rounded to BF16 (fc.bias is the
  // last parameter).
  EXPECT_TRUE(BitEqual(model->fc->bias.detach(),
                       step.master_weights()->master_params().back().detach()
                           .to(torch::kBFloat16)));
}

// Two micro-batches of 8 with accumulation_steps(2) equal one batch of 16.
TEST(TrainStep, AccumulationMatchesOneLargeBatch) {
  torch::manual_seed(3);
  const auto x = torch::randn({16, 5});
  const auto y = torch::randn({16, 2});
  torch::nn::Linear a(5, 2), b(5, 2);
  {
    torch::NoGradGuard no_grad;
    b->weight.copy_(a->weight);
    b->bias.copy_(a->bias);
  }
  lamp::TrainStep big(a.ptr(), sgd(0.1), Precision::kFP32);
  lamp::TrainStep small(b.ptr(), sgd(0.1),
                        lamp::TrainStepOptions(Precision::kFP32).accumulation_steps(2));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(big.step([&] { return torch::mse_loss(a(x), y); }).optimizer_stepped);
    EXPECT_FALSE(small.step([&] {
                        return torch::mse_loss(b(x.slice(0, 0, 8)), y.slice(0, 0, 8));
                      }).optimizer_stepped);
    EXPECT_TRUE(small.step([&] {
                       return torch::mse_loss(b(x.slice(0, 8, 16)), y.slice(0, 8, 16));
                     }).optimizer_stepped);
  }
  // Summation order differs (two halves vs one reduction): FP32 rounding,
  // a few ulps on values of order 1.
  EXPECT_TRUE(lamp_test::AllClose(b->weight, a->weight, 1e-5, 1e-6));
  EXPECT_TRUE(lamp_test::AllClose(b->bias, a->bias, 1e-5, 1e-6));
}

TEST(TrainStep, SkipsNonFiniteStepsWhenAsked) {
  SmallNet model;
  lamp::TrainStep step(
      model.ptr(), sgd(0.1),
      lamp::TrainStepOptions(Precision::kBF16).skip_non_finite(true));
  const auto before = model->conv1->weight.detach().clone();
  const auto result = step.step([&] {
    auto out = model->forward(step.cast_input(torch::randn({2, 3, 8, 8})));
    return out.to(torch::kFloat).sum() * std::numeric_limits<float>::infinity();
  });
  EXPECT_FALSE(result.optimizer_stepped);
  EXPECT_TRUE(result.skipped);
  EXPECT_TRUE(BitEqual(model->conv1->weight.detach(), before));
  EXPECT_EQ(step.scaler().steps_skipped(), 1);
}

TEST(TrainStep, ClipsTheUnscaledGradientNorm) {
  torch::nn::Linear linear(4, 1);
  const auto w0 = linear->weight.detach().clone();
  const auto b0 = linear->bias.detach().clone();
  lamp::TrainStep step(
      linear.ptr(), sgd(1.0, /*momentum=*/0.0),
      lamp::TrainStepOptions(Precision::kFP32).max_grad_norm(0.5));
  step.step([&] { return linear(torch::full({1, 4}, 100.0)).sum(); });
  // SGD with lr 1 moves the parameters by exactly the clipped gradient.
  const auto moved = torch::cat({(linear->weight.detach() - w0).flatten(),
                                 linear->bias.detach() - b0});
  EXPECT_NEAR(moved.norm().item<double>(), 0.5, 1e-5);
  EXPECT_THROW(lamp::TrainStep(linear.ptr(), sgd(1.0),
                               lamp::TrainStepOptions().max_grad_norm(-1)),
               c10::Error);
}

TEST(TrainStep, SaveAndLoadResumeBitIdentically) {
  const auto problem = lamp_test::make_problem(64, 4, 2);
  auto run = [&](lamp::TrainStep& step, SmallNet& model, int steps) {
    std::vector<float> losses;
    for (int i = 0; i < steps; ++i) {
      losses.push_back(step.step([&] {
                             return torch::nn::functional::cross_entropy(
                                 model->forward(step.cast_input(problem.images))
                                     .to(torch::kFloat),
                                 problem.labels);
                           })
                           .loss.item<float>());
    }
    return losses;
  };
  torch::manual_seed(4);
  SmallNet model;
  lamp::TrainStep step(model.ptr(), sgd(0.05), Precision::kBF16);
  run(step, model, 3);
  std::stringstream checkpoint;
  {
    torch::serialize::OutputArchive archive;
    step.save(archive);
    archive.save_to(checkpoint);
  }
  const auto straight = run(step, model, 3);

  torch::manual_seed(99);  // a different initialisation, overwritten by load
  SmallNet resumed_model;
  lamp::TrainStep resumed(resumed_model.ptr(), sgd(0.05), Precision::kBF16);
  torch::serialize::InputArchive archive;
  archive.load_from(checkpoint);
  resumed.load(archive);
  const auto continued = run(resumed, resumed_model, 3);
  EXPECT_EQ(continued, straight);

  SmallNet other;
  lamp::TrainStep fp32(other.ptr(), sgd(0.05), Precision::kFP32);
  EXPECT_THROW(fp32.load(archive), c10::Error);
}

TEST(TrainStep, RefusesToSaveInTheMiddleOfAnAccumulationCycle) {
  torch::nn::Linear linear(2, 1);
  lamp::TrainStep step(linear.ptr(), sgd(0.1),
                       lamp::TrainStepOptions().accumulation_steps(2));
  const auto loss = [&] { return linear(torch::ones({1, 2})).sum(); };
  step.step(loss);
  torch::serialize::OutputArchive archive;
  EXPECT_THROW(step.save(archive), c10::Error);
  step.step(loss);
  step.save(archive);  // the cycle ended: fine
}

TEST(TrainStep, AmpAndHalfTrainOnGpu_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto fp32 = train(Precision::kFP32, 60, torch::kCUDA);
  for (auto precision : {Precision::kAMP, Precision::kHalf,
                         Precision::kAMPBF16, Precision::kBF16}) {
    const auto result = train(precision, 60, torch::kCUDA);
    EXPECT_LT(result.second, 0.5 * result.first) << lamp::to_string(precision);
    EXPECT_NEAR(result.second, fp32.second, 0.02) << lamp::to_string(precision);
  }
}

} // namespace
