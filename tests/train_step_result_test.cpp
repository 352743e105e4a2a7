// What a TrainStep reports about its step (StepResult::grad_norm) and how a
// TrainStep is held (moved, not copied or assigned).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "lamp/amp/train_step.h"
#include "lamp/optim/sgd.h"
#include "test_util.h"

namespace {

using lamp::Precision;
using lamp_test::SmallNet;

lamp::OptimizerFactory plain_sgd(double lr) {
  return [=](std::vector<torch::Tensor> params) {
    return std::make_unique<lamp::optim::SGD>(params,
                                              torch::optim::SGDOptions(lr));
  };
}

// A static loss scale of 1024 (a power of two: scaling and unscaling are
// exact), so that a norm of the scaled gradients would be 1024 times off.
lamp::TrainStepOptions scaled(Precision precision) {
  return lamp::TrainStepOptions(precision).force_loss_scaling(true).scaler(
      lamp::GradScalerOptions().init_scale(1024).dynamic(false));
}

// The L2 norm of the parameters' gradients, summed in double.
double grad_norm_of(const std::vector<torch::Tensor>& params) {
  double sum = 0;
  for (const auto& p : params) {
    if (p.grad().defined()) {
      sum += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    }
  }
  return std::sqrt(sum);
}

// grad_norm is the norm of the true (unscaled) gradients before clipping,
// and the gradients the optimizer then used are clipped to max_grad_norm.
// The reference is the same model's backward, run by hand before the step,
// its norm summed in double. Tolerance: the step sums n ~ 1.5e3 FP32
// squares (foreach norms, then their norm), relative error at most about
// n * 2^-24 ~ 9e-5 (Higham's bound for recursive summation; blocked
// summation does better), hence 1e-4 relative.
TEST(StepResultGradNorm, IsTheUnscaledNormBeforeClipping) {
  torch::manual_seed(0);
  const auto problem = lamp_test::make_problem(32, 4, 0);
  SmallNet model;
  const double max_norm = 0.01;
  lamp::TrainStep step(model.ptr(), plain_sgd(0.1),
                       scaled(Precision::kFP32).max_grad_norm(max_norm));
  const auto loss_fn = [&] {
    return torch::nn::functional::cross_entropy(model->forward(problem.inputs),
                                                problem.targets);
  };
  const auto params = model->parameters();
  loss_fn().backward();
  const double expected = grad_norm_of(params);
  ASSERT_GT(expected, 10 * max_norm); // so that clipping applies
  for (auto& p : params) {
    p.mutable_grad() = torch::Tensor();
  }

  const auto result = step.step(loss_fn);
  ASSERT_TRUE(result.optimizer_stepped());
  ASSERT_TRUE(result.grad_norm.defined());
  EXPECT_EQ(result.grad_norm.dim(), 0);
  EXPECT_EQ(result.grad_norm.scalar_type(), torch::kFloat);
  EXPECT_NEAR(result.grad_norm.item<double>(), expected, 1e-4 * expected);
  // Clipped: coefficient max_norm / (norm + 1e-6), as torch's
  // clip_grad_norm_; the gradients after the step are the clipped ones.
  EXPECT_NEAR(grad_norm_of(params), max_norm * expected / (expected + 1e-6),
              1e-4 * max_norm);
}

// The same in the modes with FP32 masters: the norm is the masters'.
TEST(StepResultGradNorm, IsTheMastersNormInBf16) {
  torch::nn::Linear linear(4, 1);
  lamp::TrainStep step(linear.ptr(), plain_sgd(1.0),
                       scaled(Precision::kBF16).max_grad_norm(0.5));
  ASSERT_NE(step.master_weights(), nullptr);
  const auto result = step.step([&] {
    return linear(step.cast_input(torch::full({1, 4}, 3.0)))
        .to(torch::kFloat)
        .sum();
  });
  ASSERT_TRUE(result.optimizer_stepped());
  // The gradient is (3, 3, 3, 3, 1), exact in BF16: norm sqrt(37), computed
  // from FP32 masters (one rounding of a 5-term sum: 1e-6 relative).
  EXPECT_NEAR(result.grad_norm.item<double>(), std::sqrt(37.0),
              1e-6 * std::sqrt(37.0));
  EXPECT_NEAR(grad_norm_of(step.master_weights()->master_params()), 0.5, 1e-6);
}

TEST(StepResultGradNorm, IsNonFiniteWhenTheStepOverflowed) {
  torch::nn::Linear linear(4, 1);
  lamp::TrainStep step(linear.ptr(), plain_sgd(1.0),
                       scaled(Precision::kFP32).max_grad_norm(1.0));
  const auto w0 = linear->weight.detach().clone();
  const auto result = step.step([&] {
    return (linear(torch::ones({1, 4})) *
            std::numeric_limits<float>::quiet_NaN())
        .sum();
  });
  EXPECT_TRUE(result.skipped());
  ASSERT_TRUE(result.grad_norm.defined());
  EXPECT_FALSE(std::isfinite(result.grad_norm.item<double>()));
  EXPECT_TRUE(torch::equal(linear->weight.detach(), w0));
}

TEST(StepResultGradNorm, IsUndefinedWithoutClippingOrBeforeTheCycleEnds) {
  torch::nn::Linear linear(4, 1);
  const auto loss_fn = [&] { return linear(torch::ones({1, 4})).sum(); };
  {
    lamp::TrainStep step(linear.ptr(), plain_sgd(0.1), Precision::kFP32);
    const auto result = step.step(loss_fn);
    EXPECT_TRUE(result.cycle_ended);
    EXPECT_FALSE(result.grad_norm.defined());
  }
  lamp::TrainStep step(linear.ptr(), plain_sgd(0.1),
                       lamp::TrainStepOptions(Precision::kFP32)
                           .accumulation_steps(2)
                           .max_grad_norm(1.0));
  const auto first = step.step(loss_fn);
  EXPECT_FALSE(first.cycle_ended);
  EXPECT_FALSE(first.grad_norm.defined());
  // Two micro-batches of gradient (1, 1, 1, 1, 1) / 2 each: norm sqrt(5).
  const auto second = step.step(loss_fn);
  EXPECT_TRUE(second.cycle_ended);
  EXPECT_NEAR(second.grad_norm.item<double>(), std::sqrt(5.0), 1e-6);
}

// ------------------------------------------------------------ move, no copy

static_assert(std::is_move_constructible<lamp::TrainStep>::value,
              "a TrainStep moves into containers and out of factories");
static_assert(!std::is_copy_constructible<lamp::TrainStep>::value,
              "a TrainStep owns its optimizer and graphs: not copyable");
static_assert(!std::is_move_assignable<lamp::TrainStep>::value &&
                  !std::is_copy_assignable<lamp::TrainStep>::value,
              "assignment would break the TF32 guards' nesting");

lamp::TrainStep make_step(const torch::nn::Linear& linear) {
  return lamp::TrainStep(linear.ptr(), plain_sgd(0.1),
                         scaled(Precision::kFP32));
}

// A moved TrainStep goes on where the first left off: same model, optimizer,
// scaler (its per-optimizer state and counts) and step count.
TEST(TrainStepMove, AMovedStepGoesOnTraining) {
  torch::nn::Linear linear(4, 1);
  const auto loss_fn = [&] { return linear(torch::ones({1, 4})).sum(); };
  std::vector<lamp::TrainStep> steps;
  steps.push_back(make_step(linear));
  EXPECT_TRUE(steps[0].step(loss_fn).optimizer_stepped());
  steps.push_back(make_step(linear)); // reallocates: moves steps[0]
  auto moved = std::make_unique<lamp::TrainStep>(std::move(steps[0]));
  const auto w = linear->weight.detach().clone();
  const auto result = moved->step(loss_fn);
  EXPECT_TRUE(result.optimizer_stepped());
  EXPECT_EQ(moved->scaler().steps_taken(), 2);
  EXPECT_EQ(moved->scaler().get_scale(), 1024.0);
  // SGD at lr 0.1 with gradient ones: each weight moved by 0.1.
  EXPECT_TRUE(torch::allclose(linear->weight.detach(), w - 0.1));
}

} // namespace
