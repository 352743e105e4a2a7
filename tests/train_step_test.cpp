#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "lamp/amp/precision_support.h"
#include "lamp/amp/train_step.h"
#include "lamp/optim/sgd.h"
#include "lamp/platform/backends.h"
#include "test_util.h"

namespace {

using lamp::Precision;
using lamp_test::BitEqual;
using lamp_test::expect_error;
using lamp_test::SmallNet;

lamp::OptimizerFactory sgd(double lr, double momentum = 0.9) {
  return [=](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(lr).momentum(momentum));
  };
}

// A second Linear(5, 2) with `a`'s weights, for two runs from one start.
torch::nn::Linear twin_of(const torch::nn::Linear& a) {
  torch::nn::Linear b(5, 2);
  torch::NoGradGuard no_grad;
  b->weight.copy_(a->weight);
  b->bias.copy_(a->bias);
  return b;
}

bool fp16_runs_on_cpu(Precision p) {
  return !lamp::uses_fp16(p) || lamp::fp16_compute_available(torch::kCPU);
}

// A static loss scale of 1024 through TrainStep: exact for finite gradients
// (a power of two), and it exercises scale, unscale and skip in every mode,
// also where FP16 cannot run.
lamp::TrainStepOptions static_scaling(Precision precision,
                                      double scale = 1024) {
  return lamp::TrainStepOptions(precision).force_loss_scaling(true).scaler(
      lamp::GradScalerOptions().init_scale(scale).dynamic(false));
}

// Trains SmallNet on the fixed synthetic problem; returns the first step's
// loss and the mean loss of the last `tail` steps.
std::pair<double, double> train(const lamp::TrainStepOptions& options,
                                int steps, torch::Device device = torch::kCPU) {
  const auto problem = lamp_test::make_problem(256, 4, 0);
  torch::manual_seed(1);
  SmallNet model;
  model->to(device);
  lamp::TrainStep step(model.ptr(), sgd(0.05), options);
  double first = 0, tail_sum = 0;
  const int tail = 5;
  for (int i = 0; i < steps; ++i) {
    const auto idx = torch::arange((i % 4) * 64, (i % 4 + 1) * 64);
    const auto x = problem.inputs.index_select(0, idx).to(device);
    const auto y = problem.targets.index_select(0, idx).to(device);
    const auto result = step.step([&] {
      return torch::nn::functional::cross_entropy(
          model->forward(step.cast_input(x)).to(torch::kFloat), y);
    });
    const double loss = result.loss.item<double>();
    if (i == 0)
      first = loss;
    if (i >= steps - tail)
      tail_sum += loss;
  }
  return {first, tail_sum / tail};
}

#define LAMP_SKIP_WITHOUT_FP16_CPU_KERNELS(precision)                        \
  do {                                                                       \
    if (!fp16_runs_on_cpu(precision)) {                                      \
      GTEST_SKIP() << "'" << lamp::to_string(precision)                      \
                   << "' needs FP16 CPU kernels, which this LibTorch lacks " \
                      "(see RefusesFp16ModesWithoutFp16Kernels)";            \
    }                                                                        \
  } while (0)

class TrainStepMode : public ::testing::TestWithParam<Precision> {};

std::string mode_name(const ::testing::TestParamInfo<Precision>& info) {
  auto name = lamp::to_string(info.param);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// Every mode trains the same net on the same data to nearby losses. BF16
// keeps 8 significant bits (relative rounding up to 2^-9 per op), so the
// trajectories drift apart a little; measured on LibTorch 1.13 CPU: loss
// 1.357 -> 0.2126, with the BF16 modes within 1.1e-4 of FP32. The bound,
// 0.02 (about 10% of the final loss, a few BF16 ulps of the logits
// compounded), leaves room for FP16, other CPUs and LibTorch builds yet
// fails a mode that loses small updates (no master weights) or trains
// wrongly.
TEST_P(TrainStepMode, ConvergesToTheFp32Loss) {
  const auto precision = GetParam();
  LAMP_SKIP_WITHOUT_FP16_CPU_KERNELS(precision);
  const auto fp32 = train(Precision::kFP32, 60);
  EXPECT_LT(fp32.second, 0.5 * fp32.first);
  const auto result = train(precision, 60);
  std::cout << "[ loss     ] " << lamp::to_string(precision) << ": first "
            << result.first << ", last " << result.second << " (fp32 "
            << fp32.second << ")\n";
  EXPECT_LT(result.second, 0.5 * result.first);
  EXPECT_NEAR(result.second, fp32.second, 0.02);
}

// Clipping sees the true (unscaled) gradients: with SGD at lr 1 and no
// momentum the parameters (the masters in "half"/"bf16") move by exactly the
// clipped gradient, whatever the loss scale.
void expect_clipped_update(Precision precision, torch::Device device) {
  torch::nn::Linear linear(4, 1);
  linear->to(device);
  lamp::TrainStep step(linear.ptr(), sgd(1.0, /*momentum=*/0.0),
                       static_scaling(precision).max_grad_norm(0.5));
  const auto params =
      step.master_weights() != nullptr
          ? step.master_weights()->master_params()
          : std::vector<torch::Tensor>{linear->weight, linear->bias};
  const auto w0 = params[0].detach().clone();
  const auto b0 = params[1].detach().clone();
  const auto result = step.step([&] {
    return linear(step.cast_input(torch::full({1, 4}, 3.0, device)))
        .to(torch::kFloat)
        .sum();
  });
  ASSERT_TRUE(result.optimizer_stepped()) << lamp::to_string(precision);
  EXPECT_EQ(result.scale.item<double>(), 1024.0);
  // The gradient is (3, 3, 3, 3, 1), norm sqrt(37) ~ 6.08, clipped to 0.5.
  // Unclipped, or clipped before unscaling (to 0.5 / 1024), it is far off.
  const auto moved = torch::cat(
      {(params[0].detach() - w0).flatten(), params[1].detach() - b0});
  EXPECT_NEAR(moved.norm().item<double>(), 0.5, 1e-5)
      << lamp::to_string(precision);
  // The step reports the norm before clipping, unscaled (FP32: 1e-6 of it
  // is a few roundings of a 5-term sum).
  ASSERT_TRUE(result.grad_norm.defined()) << lamp::to_string(precision);
  EXPECT_NEAR(result.grad_norm.item<double>(), std::sqrt(37.0), 1e-5)
      << lamp::to_string(precision);
}

TEST_P(TrainStepMode, ClipsTheUnscaledGradientNorm) {
  LAMP_SKIP_WITHOUT_FP16_CPU_KERNELS(GetParam());
  expect_clipped_update(GetParam(), torch::kCPU);
}

// The scale really multiplies the loss: a gradient of 1e36 is finite, but
// times 1024 it overflows FP32, so the step is skipped, and a dynamic scaler
// backs off.
TEST_P(TrainStepMode, ForcedLossScalingSkipsOverflowingSteps) {
  const auto precision = GetParam();
  LAMP_SKIP_WITHOUT_FP16_CPU_KERNELS(precision);
  for (bool dynamic : {false, true}) {
    torch::nn::Linear linear(2, 1);
    auto options = static_scaling(precision);
    options.scaler().dynamic(dynamic);
    lamp::TrainStep step(linear.ptr(), sgd(1e-3, 0.0), options);
    const auto before = linear->weight.detach().clone();
    const auto result = step.step([&] {
      return linear(step.cast_input(torch::ones({1, 2})))
                 .to(torch::kFloat)
                 .sum() *
             1e36;
    });
    EXPECT_TRUE(result.skipped()) << "dynamic " << dynamic;
    EXPECT_FALSE(result.optimizer_stepped());
    EXPECT_TRUE(BitEqual(linear->weight.detach(), before));
    EXPECT_EQ(result.scale.item<double>(), dynamic ? 512.0 : 1024.0);
    EXPECT_EQ(step.scaler().steps_skipped(), 1);
  }
}

// With the default options every mode skips a step whose gradients are
// NaN (a NaN batch): the weights, and the masters, stay as they were, and the
// step counts as skipped. Before lamp 0.4 the modes without loss scaling
// stepped and left NaN weights.
TEST_P(TrainStepMode, SkipsANanBatchByDefault) {
  const auto precision = GetParam();
  LAMP_SKIP_WITHOUT_FP16_CPU_KERNELS(precision);
  torch::manual_seed(4);
  torch::nn::Linear linear(3, 2);
  lamp::TrainStep step(linear.ptr(), sgd(0.1), precision);
  const auto weight = linear->weight.detach().clone();
  const auto bias = linear->bias.detach().clone();
  const auto input = torch::full({4, 3}, std::nan(""));
  const auto result =
      step.step(input, torch::zeros({4, 2}), [&](const auto& x, const auto& y) {
        return torch::mse_loss(linear(x).to(torch::kFloat), y);
      });
  EXPECT_TRUE(result.skipped());
  EXPECT_EQ(step.scaler().steps_skipped(), 1);
  EXPECT_TRUE(BitEqual(linear->weight.detach(), weight));
  EXPECT_TRUE(BitEqual(linear->bias.detach(), bias));
  if (step.master_weights() != nullptr) {
    EXPECT_TRUE(BitEqual(step.master_weights()->master_params()[0].detach(),
                         weight.to(torch::kFloat)));
  }
  // The next finite batch trains.
  EXPECT_TRUE(step.step(torch::ones({4, 3}), torch::zeros({4, 2}),
                        [&](const auto& x, const auto& y) {
                          return torch::mse_loss(linear(x).to(torch::kFloat),
                                                 y);
                        })
                  .optimizer_stepped());
}

INSTANTIATE_TEST_SUITE_P(, TrainStepMode,
                         ::testing::Values(Precision::kFP32, Precision::kAMP,
                                           Precision::kAMPBF16,
                                           Precision::kHalf, Precision::kBF16),
                         mode_name);

// In the modes with FP32's exponent range, a static power-of-two scale with
// finite gradients is exact: the same losses as an unscaled run, bit for bit.
// (Not in FP16, where the scale changes which gradients underflow: that is
// what it is for.)
class TrainStepWideRangeMode : public ::testing::TestWithParam<Precision> {};

TEST_P(TrainStepWideRangeMode, StaticLossScalingIsExact) {
  const auto precision = GetParam();
  EXPECT_EQ(train(static_scaling(precision), 12), train(precision, 12));
}

INSTANTIATE_TEST_SUITE_P(, TrainStepWideRangeMode,
                         ::testing::Values(Precision::kFP32,
                                           Precision::kAMPBF16,
                                           Precision::kBF16),
                         mode_name);

TEST(TrainStep, RefusesFp16ModesWithoutFp16Kernels) {
  for (auto precision : {Precision::kAMP, Precision::kHalf}) {
    SmallNet model;
    if (fp16_runs_on_cpu(precision)) {
      // A modest scale keeps this one step's FP16 gradients finite.
      lamp::TrainStep step(model.ptr(), sgd(0.1),
                           lamp::TrainStepOptions(precision).scaler(
                               lamp::GradScalerOptions().init_scale(1024)));
      const auto result = step.step([&] {
        return model->forward(step.cast_input(torch::randn({2, 3, 8, 8})))
            .to(torch::kFloat)
            .pow(2)
            .mean();
      });
      EXPECT_TRUE(result.optimizer_stepped()) << lamp::to_string(precision);
      EXPECT_EQ(result.scale.item<double>(), 1024.0);
      continue;
    }
    try {
      lamp::TrainStep step(model.ptr(), sgd(0.1), precision);
      FAIL() << lamp::to_string(precision) << " accepted on CPU";
    } catch (const c10::Error& e) {
      // The advice follows this CPU: BF16 where it has BF16 hardware, else
      // fp32, saying why not BF16.
      const std::string what = e.what();
      const bool bf16_native =
          lamp::precision_support(torch::kCPU).of(Precision::kAMPBF16).level ==
          lamp::SupportLevel::kNative;
      const std::string advice =
          bf16_native ? "Use precision 'amp-bf16' or 'bf16' on the CPU"
                      : "Use precision 'fp32' (amp-bf16 and bf16 run here, but "
                        "emulated: the CPU has no AVX512-BF16 or AMX-BF16";
      EXPECT_NE(what.find(advice), std::string::npos) << what;
      EXPECT_NE(what.find("or train on a CUDA device"), std::string::npos)
          << what;
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
  // No loss scaling in BF16: the scaler only skips non-finite steps, at a
  // static scale of 1.
  EXPECT_FALSE(step.scaler().options().dynamic());
  EXPECT_EQ(step.scaler().get_scale(), 1.0);
  const auto before = model->fc->weight.detach().clone();
  const auto result = step.step([&] {
    return model->forward(step.cast_input(torch::randn({4, 3, 8, 8})))
        .to(torch::kFloat)
        .pow(2)
        .mean();
  });
  EXPECT_TRUE(result.optimizer_stepped());
  EXPECT_EQ(result.scale.item<double>(), 1.0);
  EXPECT_FALSE(BitEqual(model->fc->weight.detach(), before));
  // The model holds the masters' values, rounded to BF16 (fc.bias is the
  // last parameter).
  EXPECT_TRUE(
      BitEqual(model->fc->bias.detach(),
               step.master_weights()->master_params().back().detach().to(
                   torch::kBFloat16)));
}

// A model network_to_half() already converted trains in the mode it was
// converted for, keeping its names; one converted for another mode is
// refused with the parameter, its dtype and what to pass instead.
// A step or forward given no function to run says so, rather than
// throwing std::bad_function_call from inside the step.
TEST(TrainStep, RefusesAMissingFunctionNamingIt) {
  torch::nn::Linear model(3, 2);
  lamp::TrainStep step(model.ptr(), sgd(0.1), Precision::kFP32);
  const auto x = torch::randn({4, 3});
  lamp_test::expect_error([&] { step.step(std::function<torch::Tensor()>()); },
                          "lamp::TrainStep::step: no loss closure given");
  lamp_test::expect_error(
      [&] {
        step.step(x, torch::randn({4, 2}), lamp::TrainStep::BatchLossFn());
      },
      "lamp::TrainStep::step: no loss function given");
  lamp_test::expect_error(
      [&] {
        step.forward(std::function<torch::Tensor(const torch::Tensor&)>(), x);
      },
      "lamp::TrainStep::forward: no forward function given");
  // Nothing ran: the next step trains as ever.
  EXPECT_TRUE(step.step([&] { return model(x).sum(); }).optimizer_stepped());
}

// An optimizer step that throws (out of memory, say) discards its cycle:
// the next step unscales its own gradients, as a fresh step does, and ends
// where a run without the failed step ends, to the bit (without the reset,
// the scaler would remember the failed step's unscale and step on
// gradients 65,536 times too large).
TEST(TrainStep, AStepThatThrowsDiscardsItsCycle) {
  struct FailingSGD : torch::optim::SGD {
    FailingSGD(std::vector<torch::Tensor> params, bool* fail)
        : torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.1)),
          fail(fail) {}
    torch::Tensor step(LossClosure closure = nullptr) override {
      if (*fail) {
        *fail = false;
        TORCH_CHECK(false, "out of memory (the test's)");
      }
      return torch::optim::SGD::step(std::move(closure));
    }
    bool* fail;
  };
  torch::manual_seed(4);
  const auto x = torch::randn({8, 5});
  const auto y = torch::randn({8, 2});
  torch::nn::Linear a(5, 2);
  auto b = twin_of(a);
  const auto options =
      lamp::TrainStepOptions(Precision::kAMPBF16).force_loss_scaling(true);
  bool fail = true;
  lamp::TrainStep failing(
      a.ptr(),
      [&](std::vector<torch::Tensor> params) {
        return std::make_unique<FailingSGD>(std::move(params), &fail);
      },
      options);
  lamp::TrainStep clean(b.ptr(), sgd(0.1, 0.0), options);
  lamp_test::expect_error(
      [&] { failing.step([&] { return torch::mse_loss(a(x), y); }); },
      "out of memory (the test's)");
  EXPECT_FALSE(fail);
  for (int i = 0; i < 2; ++i) {
    failing.step([&] { return torch::mse_loss(a(x), y); });
    clean.step([&] { return torch::mse_loss(b(x), y); });
  }
  EXPECT_TRUE(BitEqual(a->weight, b->weight));
  EXPECT_TRUE(BitEqual(a->bias, b->bias));
  EXPECT_EQ(failing.scaler().get_scale(), clean.scaler().get_scale());
}

TEST(TrainStep, ChecksTheConversionOfAConvertedModel) {
  SmallNet model;
  auto half = lamp::network_to_half(model, torch::kBFloat16);
  lamp::TrainStep step(half.ptr(), sgd(0.1), Precision::kBF16);
  EXPECT_EQ(model->conv1->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->bn1->weight.scalar_type(), torch::kFloat);
  for (auto precision : {Precision::kFP32, Precision::kAMPBF16}) {
    SCOPED_TRACE(lamp::to_string(precision));
    SmallNet converted;
    lamp::network_to_half(converted, torch::kBFloat16);
    lamp_test::expect_error(
        [&] { lamp::TrainStep(converted.ptr(), sgd(0.1), precision); },
        "parameter 'conv1.weight' is BFloat16 but precision '" +
            lamp::to_string(precision) + "' trains FP32 parameters");
  }
  // A model its owner converted with options of its own stays so: the head
  // it kept FP32 is not rounded to BF16 by the step's default options.
  SmallNet kept;
  const auto head = kept->fc->weight.detach().clone();
  lamp::network_to_half(kept, lamp::HalfOptions(torch::kBFloat16)
                                  .keep_fp32([](const std::string& name,
                                                const torch::nn::Module&) {
                                    return name == "fc";
                                  }));
  lamp::TrainStep kept_step(kept.ptr(), sgd(0.1), Precision::kBF16);
  EXPECT_EQ(kept->conv1->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(kept->fc->weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(kept->fc->weight, head));
  SmallNet fp16;
  lamp::convert_network(*fp16, torch::kHalf);
  lamp_test::expect_error(
      [&] { lamp::TrainStep(fp16.ptr(), sgd(0.1), Precision::kBF16); },
      "is Half but precision 'bf16' converts the model to BFloat16");
}

// Two micro-batches of 8 with accumulation_steps(2) equal one batch of 16.
TEST(TrainStep, AccumulationMatchesOneLargeBatch) {
  torch::manual_seed(3);
  const auto x = torch::randn({16, 5});
  const auto y = torch::randn({16, 2});
  torch::nn::Linear a(5, 2);
  auto b = twin_of(a);
  lamp::TrainStep big(a.ptr(), sgd(0.1), Precision::kFP32);
  lamp::TrainStep small(
      b.ptr(), sgd(0.1),
      lamp::TrainStepOptions(Precision::kFP32).accumulation_steps(2));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(
        big.step([&] { return torch::mse_loss(a(x), y); }).optimizer_stepped());
    EXPECT_FALSE(small
                     .step([&] {
                       return torch::mse_loss(b(x.slice(0, 0, 8)),
                                              y.slice(0, 0, 8));
                     })
                     .optimizer_stepped());
    EXPECT_TRUE(small
                    .step([&] {
                      return torch::mse_loss(b(x.slice(0, 8, 16)),
                                             y.slice(0, 8, 16));
                    })
                    .optimizer_stepped());
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
  EXPECT_FALSE(result.optimizer_stepped());
  EXPECT_TRUE(result.skipped());
  EXPECT_TRUE(BitEqual(model->conv1->weight.detach(), before));
  EXPECT_EQ(step.scaler().steps_skipped(), 1);
}

// skip_non_finite(false) keeps the step on: a NaN batch then reaches the
// weights, as the option says.
TEST(TrainStep, StepsNonFiniteGradientsWhenSkippingIsOff) {
  torch::nn::Linear linear(3, 2);
  lamp::TrainStep step(
      linear.ptr(), sgd(0.1),
      lamp::TrainStepOptions(Precision::kFP32).skip_non_finite(false));
  const auto result = step.step([&] {
    return linear(torch::full({1, 3}, std::nan(""))).sum();
  });
  EXPECT_TRUE(result.optimizer_stepped());
  EXPECT_TRUE(torch::isnan(linear->weight).all().item<bool>());
}

// A checkpoint of lamp 0.3's default (no skip, so no scaler state) loads
// into a step that skips, and training goes on from it.
TEST(TrainStep, LoadsACheckpointSavedWithoutTheSkip) {
  torch::manual_seed(5);
  torch::nn::Linear saved(3, 2), loaded(3, 2);
  const auto loss = [](torch::nn::Linear& linear) {
    return [&linear] { return linear(torch::ones({1, 3})).sum(); };
  };
  lamp::TrainStep before(
      saved.ptr(), sgd(0.1),
      lamp::TrainStepOptions(Precision::kFP32).skip_non_finite(false));
  before.step(loss(saved));
  torch::serialize::OutputArchive archive;
  before.save(archive);
  lamp::TrainStep after(loaded.ptr(), sgd(0.1), Precision::kFP32);
  after.load(*lamp_test::reopened(archive));
  EXPECT_TRUE(BitEqual(loaded->weight.detach(), saved->weight.detach()));
  EXPECT_TRUE(after.step(loss(loaded)).optimizer_stepped());
}

TEST(TrainStep, RefusesANegativeMaxGradNorm) {
  torch::nn::Linear linear(4, 1);
  EXPECT_THROW(lamp::TrainStep(linear.ptr(), sgd(1.0),
                               lamp::TrainStepOptions().max_grad_norm(-1)),
               c10::Error);
}

// A resume case: a precision and what its scaler does.
struct ResumeCase {
  std::string name;
  lamp::TrainStepOptions options;
};

lamp::TrainStepOptions dynamic_scaling(lamp::TrainStepOptions options) {
  // Growth every 2 finite steps and hysteresis 2: the scale, the growth
  // tracker and the overflow count all change within a few steps.
  return options.scaler(
      lamp::GradScalerOptions().init_scale(1024).growth_interval(2).hysteresis(
          2));
}

class TrainStepResume : public ::testing::TestWithParam<ResumeCase> {};

// Save after 3 steps, resume in a fresh TrainStep over a differently
// initialised model: the next 3 steps give the same losses and scales, bit for
// bit, as running straight on. Where a scaler is on, steps 2 and 3 overflow
// (loss times inf): at the checkpoint the scale has grown once and one
// overflow is pending, so the resumed scaler backs off on step 3 only if its
// whole state (scale, tracker, overflow count) was saved.
TEST_P(TrainStepResume, SaveAndLoadResumeBitIdentically) {
  const auto& options = GetParam().options;
  LAMP_SKIP_WITHOUT_FP16_CPU_KERNELS(options.precision());
  const auto problem = lamp_test::make_problem(64, 4, 2);
  const bool scaler_on = lamp::uses_loss_scaling(options.precision()) ||
                         options.force_loss_scaling() ||
                         options.skip_non_finite();
  struct Trace {
    std::vector<float> losses, scales;
  };
  auto run = [&](lamp::TrainStep& step, SmallNet& model, int from, int to) {
    Trace trace;
    for (int i = from; i < to; ++i) {
      const bool overflow = scaler_on && (i == 2 || i == 3);
      const auto result = step.step([&] {
        const auto loss = torch::nn::functional::cross_entropy(
            model->forward(step.cast_input(problem.inputs)).to(torch::kFloat),
            problem.targets);
        return overflow ? loss * std::numeric_limits<float>::infinity() : loss;
      });
      EXPECT_EQ(result.skipped(), overflow) << "step " << i;
      trace.losses.push_back(result.loss.item<float>());
      trace.scales.push_back(result.scale.item<float>());
    }
    return trace;
  };
  torch::manual_seed(4);
  SmallNet model;
  lamp::TrainStep step(model.ptr(), sgd(0.05), options);
  run(step, model, 0, 3);
  std::stringstream checkpoint;
  torch::save(step, checkpoint); // TrainStep::save, as for a module
  const auto straight = run(step, model, 3, 6);

  torch::manual_seed(99); // a different initialisation, overwritten by load
  SmallNet resumed_model;
  lamp::TrainStep resumed(resumed_model.ptr(), sgd(0.05), options);
  torch::load(resumed, checkpoint);
  const auto continued = run(resumed, resumed_model, 3, 6);
  EXPECT_EQ(continued.losses, straight.losses);
  EXPECT_EQ(continued.scales, straight.scales);
  if (options.force_loss_scaling() ||
      lamp::uses_loss_scaling(options.precision())) {
    // 1024, grown to 2048 after steps 0-1; the 2nd overflow in a row (step
    // 3) backs off to 1024; steps 4-5 grow it again.
    EXPECT_EQ(straight.scales, (std::vector<float>{1024, 1024, 2048}));
  }

  SmallNet other;
  lamp::TrainStep different(other.ptr(), sgd(0.05),
                            options.precision() == Precision::kFP32
                                ? Precision::kBF16
                                : Precision::kFP32);
  checkpoint.clear();
  checkpoint.seekg(0);
  torch::serialize::InputArchive archive;
  archive.load_from(checkpoint);
  EXPECT_THROW(different.load(archive), c10::Error);
}

INSTANTIATE_TEST_SUITE_P(
    , TrainStepResume,
    ::testing::Values(
        ResumeCase{"fp32", Precision::kFP32},
        ResumeCase{"amp_bf16", Precision::kAMPBF16},
        ResumeCase{"bf16", Precision::kBF16},
        ResumeCase{"amp", dynamic_scaling(Precision::kAMP)},
        ResumeCase{"half", dynamic_scaling(Precision::kHalf)},
        ResumeCase{"amp_bf16_scaled",
                   dynamic_scaling(lamp::TrainStepOptions(Precision::kAMPBF16)
                                       .force_loss_scaling(true))},
        ResumeCase{"bf16_scaled",
                   dynamic_scaling(lamp::TrainStepOptions(Precision::kBF16)
                                       .force_loss_scaling(true))},
        ResumeCase{
            "bf16_skip_non_finite",
            lamp::TrainStepOptions(Precision::kBF16).skip_non_finite(true)}),
    [](const auto& info) { return info.param.name; });

TEST(TrainStep, RefusesToSaveInTheMiddleOfAnAccumulationCycle) {
  torch::nn::Linear linear(2, 1);
  lamp::TrainStep step(linear.ptr(), sgd(0.1),
                       lamp::TrainStepOptions().accumulation_steps(2));
  const auto loss = [&] { return linear(torch::ones({1, 2})).sum(); };
  step.step(loss);
  torch::serialize::OutputArchive archive;
  EXPECT_THROW(step.save(archive), c10::Error);
  step.step(loss);
  step.save(archive); // the cycle ended: fine
}

// In every mode the same message, at construction: not MasterWeights' "no
// parameters given", nor autograd's complaint at the first backward.
TEST(TrainStep, RefusesAModelWithoutTrainableParameters) {
  for (const auto precision :
       {Precision::kFP32, Precision::kAMPBF16, Precision::kBF16}) {
    torch::nn::Linear linear(3, 2);
    for (auto& p : linear->parameters()) {
      p.requires_grad_(false);
    }
    expect_error(
        [&] { lamp::TrainStep(linear.ptr(), sgd(0.1), precision); },
        "lamp::TrainStep: the model has no trainable parameters (all 2 have requires_grad=false)");
    EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat)
        << "converted before refusing, in " << lamp::to_string(precision);
  }
}

// An optimizer built over model->parameters() rather than the factory's
// argument steps the 16-bit model where TrainStep trains FP32 masters (which
// it copies over the model after each step): it would train nothing, so it
// is refused at construction, as is an optimizer of no parameters. In fp32
// the model's parameters are what TrainStep hands: fine.
TEST(TrainStep, RefusesAFactoryOptimizerOverOtherTensorsOrNone) {
  for (const auto precision : {Precision::kFP32, Precision::kBF16}) {
    torch::nn::Linear linear(3, 2);
    const lamp::OptimizerFactory over_model =
        [linear](std::vector<torch::Tensor>) {
          return std::make_unique<torch::optim::SGD>(
              linear->parameters(), torch::optim::SGDOptions(0.1));
        };
    if (precision == Precision::kFP32) {
      lamp::TrainStep step(linear.ptr(), over_model, precision);
      continue;
    }
    expect_error(
        [&] { lamp::TrainStep(linear.ptr(), over_model, precision); },
        "lamp::TrainStep: 2 of the 2 parameters of the factory's optimizer "
        "are not among those TrainStep handed the factory (in this mode, the "
        "FP32 master copies): build the optimizer over the factory's "
        "argument, not model->parameters()");
  }
  torch::nn::Linear linear(3, 2);
  expect_error(
      [&] {
        lamp::TrainStep(linear.ptr(), [](std::vector<torch::Tensor>) {
          return std::make_unique<torch::optim::SGD>(
              std::vector<torch::Tensor>{}, torch::optim::SGDOptions(0.1));
        });
      },
      "lamp::TrainStep: the optimizer factory's optimizer holds no "
      "parameters");
}

// What a closure returns is checked before the backward: one element, and
// a gradient to take (not detached, not under NoGradGuard, not an integer),
// named as the loss's fault rather than autograd's "element 0 of tensors
// does not require grad".
TEST(TrainStep, RefusesALossWithoutAGradientOrOfManyElements) {
  torch::nn::Linear linear(3, 2);
  lamp::TrainStep step(linear.ptr(), sgd(0.1));
  const auto x = torch::ones({4, 3});
  expect_error([&] { step.step([&] { return linear(x); }); },
               "loss_fn must return a one-element loss tensor, got [4, 2]");
  expect_error([&] { step.step([&] { return linear(x).sum().detach(); }); },
               "lamp::TrainStep::step: the loss loss_fn returned has no "
               "gradient to take (a Float tensor that does not require grad)");
  expect_error(
      [&] {
        step.step([&] {
          torch::NoGradGuard no_grad;
          return linear(x).sum();
        });
      },
      "has no gradient to take");
  expect_error([&] { step.step([&] { return x.to(torch::kLong).sum(); }); },
               "(a Long tensor that does not require grad)");
  // A loss that has one still trains.
  step.step([&] { return linear(x).sum(); });
}

// A closure that hands the 16-bit model an FP32 input (cast_input()
// forgotten) fails in LibTorch; the error keeps LibTorch's words and names
// the fix. Other errors, and the same closure in a mode whose model stays
// FP32, are not touched.
TEST(TrainStep, AForgottenCastInputNamesTheFix) {
  torch::nn::Linear linear(3, 2);
  lamp::TrainStep step(linear.ptr(), sgd(0.1), Precision::kBF16);
  const auto x = torch::ones({4, 3});
  expect_error([&] { step.step([&] { return linear(x).sum(); }); },
               "The model's floating-point weights are BFloat16 in this "
               "mode: pass each input through step.cast_input(x) inside "
               "loss_fn, or call step.step(input, target, loss)");
  try {
    step.step(
        [&]() -> torch::Tensor { TORCH_CHECK(false, "the data ran out"); });
    ADD_FAILURE() << "the closure's error was lost";
  } catch (const c10::Error& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()).find("cast_input"),
              std::string::npos)
        << e.what_without_backtrace();
  }
  // A loss whose target has the wrong type names no 16-bit type: no hint.
  try {
    step.step([&] {
      return torch::nn::functional::cross_entropy(linear(step.cast_input(x)),
                                                  torch::zeros({4}));
    });
    ADD_FAILURE() << "a Float class target ran";
  } catch (const c10::Error& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()).find("cast_input"),
              std::string::npos)
        << e.what_without_backtrace();
  }
  // With the cast it trains.
  step.step([&] { return linear(step.cast_input(x)).sum(); });

  torch::nn::Linear fp32_linear(3, 2);
  lamp::TrainStep fp32_step(fp32_linear.ptr(), sgd(0.1));
  try {
    fp32_step.step([&] { return fp32_linear(x.to(torch::kDouble)).sum(); });
    ADD_FAILURE() << "an FP64 input to an FP32 Linear ran";
  } catch (const c10::Error& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()).find("cast_input"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

// A SmallNet with `classes` outputs and its TrainStep after two steps (so
// that momentum buffers exist), with the scaler on in every mode.
struct Trained {
  Trained(Precision precision, int64_t classes, uint64_t seed)
      : model(classes) {
    torch::manual_seed(seed);
    model = SmallNet(classes);
    step = std::make_unique<lamp::TrainStep>(
        model.ptr(), sgd(0.05),
        lamp::TrainStepOptions(precision).force_loss_scaling(true).scaler(
            lamp::GradScalerOptions().init_scale(256).growth_interval(3)));
    const auto problem = lamp_test::make_problem(16, classes, seed);
    for (int i = 0; i < 2; ++i) {
      step->step([&] {
        return torch::nn::functional::cross_entropy(
            model->forward(step->cast_input(problem.inputs)).to(torch::kFloat),
            problem.targets);
      });
    }
  }
  std::string checkpoint() const {
    torch::serialize::OutputArchive archive;
    step->save(archive);
    std::stringstream stream;
    archive.save_to(stream);
    return stream.str();
  }
  // The momentum buffer of the optimizer's parameter that trains `name`.
  torch::Tensor momentum(const std::string& name) {
    auto trained = model->named_parameters()[name];
    if (auto* master = step->master_weights()) {
      const auto& params = master->model_params();
      const auto at =
          std::find_if(params.begin(), params.end(),
                       [&](const auto& p) { return p.is_same(trained); });
      trained = master->master_params()[at - params.begin()];
    }
    // The state's keys are the parameters' TensorImpl addresses (a string
    // in LibTorch 1.13, a pointer in 2.x): both print the same way.
    std::ostringstream wanted;
    wanted << trained.unsafeGetTensorImpl();
    for (auto& item : step->optimizer().state()) {
      std::ostringstream key;
      key << item.first;
      if (key.str() == wanted.str()) {
        return dynamic_cast<torch::optim::SGDParamState&>(*item.second)
            .momentum_buffer();
      }
    }
    return {};
  }
  SmallNet model;
  std::unique_ptr<lamp::TrainStep> step;
};

// Everything TrainStep::load may change, copied: model parameters and
// buffers, master weights, optimizer state, the scaler's scale and tracker.
struct Snapshot {
  explicit Snapshot(Trained& t) {
    for (const auto& p : t.model->parameters()) {
      tensors.push_back(p.detach().clone());
    }
    for (const auto& b : t.model->buffers()) {
      tensors.push_back(b.clone());
    }
    if (auto* master = t.step->master_weights()) {
      for (const auto& m : master->master_params()) {
        tensors.push_back(m.detach().clone());
      }
    }
    for (const auto& item : t.step->optimizer().state()) {
      std::ostringstream key;
      key << item.first;
      momentum[key.str()] =
          dynamic_cast<torch::optim::SGDParamState&>(*item.second)
              .momentum_buffer()
              .clone();
    }
    scale = t.step->scaler().get_scale();
    tracker = t.step->scaler().growth_tracker();
  }
  void expect_equal(const Snapshot& after, const std::string& context) const {
    ASSERT_EQ(after.tensors.size(), tensors.size()) << context;
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_TRUE(BitEqual(after.tensors[i], tensors[i]))
          << "tensor " << i << " after: " << context;
    }
    ASSERT_EQ(after.momentum.size(), momentum.size()) << context;
    for (const auto& item : momentum) {
      ASSERT_EQ(after.momentum.count(item.first), 1u) << context;
      EXPECT_TRUE(BitEqual(after.momentum.at(item.first), item.second))
          << "momentum after: " << context;
    }
    EXPECT_EQ(after.scale, scale) << context;
    EXPECT_EQ(after.tracker, tracker) << context;
  }
  std::vector<torch::Tensor> tensors;
  std::map<std::string, torch::Tensor> momentum;
  double scale = 0;
  int64_t tracker = 0;
};

void load(lamp::TrainStep& step, const std::string& checkpoint) {
  std::stringstream stream(checkpoint);
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  step.load(archive);
}

// Loading into a model of another size would reshape fc silently (Module's
// own load does): every tensor is compared with the live one first.
TEST(TrainStep, LoadRefusesAnotherModelsShapesAndChangesNothing) {
  for (const auto precision : {Precision::kFP32, Precision::kBF16}) {
    const std::string mode = lamp::to_string(precision);
    const auto checkpoint = Trained(precision, 3, 1).checkpoint();
    Trained live(precision, 4, 2);
    const Snapshot before(live);
    expect_error(
        [&] { load(*live.step, checkpoint); },
        "lamp::TrainStep::load: model parameter 'fc.weight' has shape [3, 16] in the archive but [4, 16] here");
    before.expect_equal(Snapshot(live), mode);
    EXPECT_EQ(live.model->fc->weight.sizes(), (std::vector<int64_t>{4, 16}));
  }
}

// A checkpoint of a deeper or shallower model (another --layers) names the
// part only one of them has, by its path, not "corrupt" or the optimizer.
TEST(TrainStep, LoadRefusesAModelOfAnotherDepthNamingThePart) {
  const auto model = [](int blocks) {
    torch::nn::ModuleList list;
    for (int i = 0; i < blocks; ++i) {
      list->push_back(torch::nn::Linear(4, 4));
    }
    auto net = std::make_shared<torch::nn::Module>();
    net->register_module("blocks", list);
    return net;
  };
  const auto checkpoint_of = [&](int blocks) {
    lamp::TrainStep step(model(blocks), sgd(0.1));
    torch::serialize::OutputArchive archive;
    step.save(archive);
    std::stringstream stream;
    archive.save_to(stream);
    return stream.str();
  };
  for (
      const auto& [saved, live, message] :
      std::vector<std::tuple<int, int, std::string>>{
          {2, 1,
           "lamp::TrainStep::load: the archive holds 'blocks.1', which this "
           "model does not have: it was saved from another model (another "
           "depth or architecture)."},
          {1, 2,
           "lamp::TrainStep::load: the model has 'blocks.1', which the archive "
           "does not hold: it was saved from another model (another depth "
           "or architecture)."}}) {
    const auto checkpoint = checkpoint_of(saved);
    lamp::TrainStep step(model(live), sgd(0.1));
    expect_error([&] { load(step, checkpoint); }, message);
  }
}

// An optimizer's own load that refuses after it has loaded (LoadFailsLast)
// is refused with its message, and TrainStep::load puts back the momentum
// buffers and the learning rate it had changed: a load that throws changes
// nothing.
TEST(TrainStep, AnOptimizerLoadThatFailsLatePutsItsStateBack) {
  torch::manual_seed(0);
  SmallNet model(3);
  lamp::TrainStep step(model.ptr(), [](std::vector<torch::Tensor> params) {
    return std::make_unique<lamp_test::LoadFailsLast<lamp::optim::SGD>>(
        std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9));
  });
  const auto problem = lamp_test::make_problem(16, 3, 0);
  const auto train = [&] {
    step.step([&] {
      return torch::nn::functional::cross_entropy(
          model->forward(step.cast_input(problem.inputs)), problem.targets);
    });
  };
  const auto momenta = [&] {
    std::map<std::string, torch::Tensor> out;
    for (const auto& item : step.optimizer().state()) {
      std::ostringstream key;
      key << item.first;
      out[key.str()] = dynamic_cast<torch::optim::SGDParamState&>(*item.second)
                           .momentum_buffer()
                           .clone();
    }
    return out;
  };
  train();
  torch::serialize::OutputArchive saved;
  step.save(saved);
  std::stringstream stream;
  saved.save_to(stream);
  const auto checkpoint = stream.str();
  train();
  train();
  const auto before = momenta();
  std::vector<torch::Tensor> weights;
  for (const auto& p : model->parameters()) {
    weights.push_back(p.detach().clone());
  }
  auto& optimizer = dynamic_cast<lamp_test::LoadFailsLast<lamp::optim::SGD>&>(
      step.optimizer());
  optimizer.fail = true;
  expect_error([&] { load(step, checkpoint); },
               "LoadFailsLast: its own check failed.");
  EXPECT_EQ(optimizer.param_groups()[0].options().get_lr(), 0.05);
  const auto after = momenta();
  ASSERT_EQ(after.size(), before.size());
  for (const auto& item : before) {
    EXPECT_TRUE(BitEqual(after.at(item.first), item.second)) << item.first;
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_TRUE(BitEqual(model->parameters()[i], weights[i])) << i;
  }
  // The same load without the failure takes the checkpoint's momenta.
  optimizer.fail = false;
  load(step, checkpoint);
  const auto loaded = momenta();
  ASSERT_EQ(loaded.size(), before.size());
  for (const auto& item : before) {
    EXPECT_FALSE(BitEqual(loaded.at(item.first), item.second)) << item.first;
  }
}

// Another kind of optimizer's state (SGD's into AdamW) is refused by name,
// before anything is loaded (LibTorch's load stops at an INTERNAL ASSERT).
TEST(TrainStep, LoadRefusesAnotherKindOfOptimizerAndChangesNothing) {
  const auto checkpoint = Trained(Precision::kBF16, 3, 1).checkpoint();
  torch::manual_seed(2);
  SmallNet model(3);
  lamp::TrainStep live(
      model.ptr(),
      [](std::vector<torch::Tensor> params) {
        return std::make_unique<torch::optim::AdamW>(
            params, torch::optim::AdamWOptions(1e-3));
      },
      lamp::TrainStepOptions(Precision::kBF16).force_loss_scaling(true));
  const auto weight = model->fc->weight.detach().clone();
  expect_error([&] { load(live, checkpoint); },
               "lamp::TrainStep::load: the optimizer state was written by "
               "another kind of optimizer (its options: dampening, lr, "
               "momentum, nesterov, weight_decay; this optimizer's: amsgrad, "
               "betas, eps, lr, weight_decay); build the optimizer the run "
               "saved with.");
  EXPECT_TRUE(BitEqual(model->fc->weight, weight));
}

// A checkpoint written after training diverged (or damaged) is refused with
// the tensor's name, and a refused load changes nothing: every part is read
// and checked before the first is loaded.
TEST(TrainStep, LoadRefusesNonFiniteOrCorruptStateAndChangesNothing) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  struct Corruption {
    std::string fragment;
    std::function<std::string(Trained&)> checkpoint;
    bool needs_master;
  };
  const std::vector<Corruption> corruptions = {
      {"lamp::TrainStep::load: model parameter 'fc.weight' holds non-finite values (NaN or inf) in the archive",
       [](Trained& t) {
         torch::NoGradGuard no_grad;
         t.model->fc->weight[1][2] = kNaN;
         return t.checkpoint();
       },
       false},
      {"lamp::TrainStep::load: optimizer state 'momentum_buffer' of 'conv2.weight' holds non-finite values",
       [](Trained& t) {
         t.momentum("conv2.weight")[0][0][0][0] = kInf;
         return t.checkpoint();
       },
       false},
      {"lamp::MasterWeights::load: master tensor 7 ('fc.bias') holds non-finite values",
       [](Trained& t) {
         torch::NoGradGuard no_grad;
         t.step->master_weights()->master_params()[7][0] = -kInf;
         return t.checkpoint();
       },
       true},
      {"lamp::GradScaler::load: _growth_tracker is -5, outside [0, 2^31 - 1]",
       [](Trained& t) {
         // TrainStep::save's layout, with the scaler's tracker out of range.
         torch::serialize::OutputArchive archive;
         archive.write(
             "precision",
             c10::IValue(lamp::to_string(t.step->options().precision())));
         torch::serialize::OutputArchive model, optimizer, scaler, master;
         t.model->save(model);
         archive.write("model", model);
         t.step->optimizer().save(optimizer);
         archive.write("optimizer", optimizer);
         scaler.write("scale", c10::IValue(t.step->scaler().get_scale()));
         scaler.write("growth_factor", c10::IValue(2.0));
         scaler.write("backoff_factor", c10::IValue(0.5));
         scaler.write("growth_interval", c10::IValue(int64_t{3}));
         scaler.write("_growth_tracker", c10::IValue(int64_t{-5}));
         archive.write("scaler", scaler);
         if (auto* m = t.step->master_weights()) {
           m->save(master);
           archive.write("master_weights", master);
         }
         std::stringstream stream;
         archive.save_to(stream);
         return stream.str();
       },
       false},
  };
  for (const auto precision : {Precision::kFP32, Precision::kBF16}) {
    for (const auto& corruption : corruptions) {
      if (corruption.needs_master && precision == Precision::kFP32) {
        continue;
      }
      const std::string context =
          lamp::to_string(precision) + ": " + corruption.fragment;
      Trained source(precision, 4, 1);
      const auto checkpoint = corruption.checkpoint(source);
      Trained live(precision, 4, 2);
      const Snapshot before(live);
      expect_error([&] { load(*live.step, checkpoint); }, corruption.fragment);
      before.expect_equal(Snapshot(live), context);
    }
  }
}

TEST(TrainStep, AmpAndHalfTrainOnGpu_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto fp32 = train(Precision::kFP32, 60, torch::kCUDA);
  for (auto precision : {Precision::kAMP, Precision::kHalf, Precision::kAMPBF16,
                         Precision::kBF16}) {
    const auto result = train(precision, 60, torch::kCUDA);
    EXPECT_LT(result.second, 0.5 * result.first) << lamp::to_string(precision);
    EXPECT_NEAR(result.second, fp32.second, 0.02) << lamp::to_string(precision);
  }
}

TEST(TrainStep, ClipsTheUnscaledGradientNormOnGpu_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  for (auto precision : {Precision::kFP32, Precision::kAMP, Precision::kHalf,
                         Precision::kAMPBF16, Precision::kBF16}) {
    expect_clipped_update(precision, torch::kCUDA);
  }
}

// The batch form of step() is the closure form with cast_input applied.
TEST(TrainStep, BatchStepEqualsTheClosureStep) {
  const auto problem = lamp_test::make_problem(32, 4, 5);
  std::vector<torch::Tensor> weights;
  for (bool batch_form : {true, false}) {
    torch::manual_seed(8);
    SmallNet model;
    lamp::TrainStep step(model.ptr(), sgd(0.05), Precision::kBF16);
    for (int i = 0; i < 3; ++i) {
      if (batch_form) {
        step.step(problem.inputs, problem.targets,
                  [&](const torch::Tensor& x, const torch::Tensor& y) {
                    EXPECT_EQ(x.scalar_type(), torch::kBFloat16);
                    return torch::nn::functional::cross_entropy(
                        model->forward(x).to(torch::kFloat), y);
                  });
      } else {
        step.step([&] {
          return torch::nn::functional::cross_entropy(
              model->forward(step.cast_input(problem.inputs)).to(torch::kFloat),
              problem.targets);
        });
      }
    }
    weights.push_back(model->fc->weight.detach().clone());
  }
  EXPECT_TRUE(BitEqual(weights[0], weights[1]));
}

lamp::OptimizerFactory lamp_sgd(lamp::optim::Implementation implementation) {
  return [=](std::vector<torch::Tensor> params) {
    return std::make_unique<lamp::optim::SGD>(
        std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9),
        implementation);
  };
}

// What a CUDA graph cannot capture is named by cuda_graph_unavailable_reason:
// kAuto then runs eager steps, kOn refuses the first step with the reason
// and the fix, before anything changed.
TEST(TrainStep, CudaGraphReasonsAutoFallsBackOnRefuses) {
  struct Case {
    const char* name;
    lamp::OptimizerFactory optimizer;
    lamp::TrainStepOptions options;
    const char* reason;
  };
  // Fused kernels on the CPU: LibTorch >= 2.4.
  const bool fused_on_cpu =
      lamp::optim::SGD({torch::zeros({2}, torch::requires_grad())},
                       torch::optim::SGDOptions(0.1))
          .implementation() == lamp::optim::Implementation::kFused;
  std::vector<Case> cases = {
      {"accumulation", lamp_sgd(lamp::optim::Implementation::kAuto),
       lamp::TrainStepOptions(Precision::kFP32).accumulation_steps(2),
       "accumulation_steps 2 is not supported"},
      {"torch::optim", sgd(0.05), lamp::TrainStepOptions(Precision::kFP32),
       "one of lamp::optim's SGD, Adam or AdamW on its fused kernels"},
      {"foreach", lamp_sgd(lamp::optim::Implementation::kForEach),
       lamp::TrainStepOptions(Precision::kFP32),
       "one of lamp::optim's SGD, Adam or AdamW on its fused kernels"},
  };
  if (fused_on_cpu) {
    cases.push_back(
        {"diagnosing scaler", lamp_sgd(lamp::optim::Implementation::kFused),
         lamp::TrainStepOptions(Precision::kFP32)
             .force_loss_scaling(true)
             .scaler(lamp::GradScalerOptions().diagnose_overflow(true)),
         "sync-free GradScaler"});
    cases.push_back({"cpu", lamp_sgd(lamp::optim::Implementation::kFused),
                     lamp::TrainStepOptions(Precision::kFP32),
                     "CUDA graphs need a CUDA device; the model is on cpu"});
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    for (auto mode : {lamp::CudaGraphMode::kOff, lamp::CudaGraphMode::kAuto,
                      lamp::CudaGraphMode::kOn}) {
      SCOPED_TRACE(lamp::to_string(mode));
      torch::manual_seed(0);
      SmallNet model;
      lamp::TrainStep step(model.ptr(), c.optimizer,
                           lamp::TrainStepOptions(c.options).cuda_graph(mode));
      EXPECT_NE(step.cuda_graph_unavailable_reason().find(c.reason),
                std::string::npos)
          << step.cuda_graph_unavailable_reason();
      EXPECT_EQ(step.cuda_graph_enabled(), mode == lamp::CudaGraphMode::kOn);
      EXPECT_EQ(step.cuda_graph_pool_bytes(), 0);
      EXPECT_EQ(step.cuda_graph_pool_reserved_bytes(), 0);
      const auto before = model->fc->weight.detach().clone();
      const auto run = [&] {
        return step.step(
            torch::randn({2, 3, 8, 8}), torch::zeros({2}, torch::kLong),
            [&](const torch::Tensor& x, const torch::Tensor& y) {
              return torch::nn::functional::cross_entropy(model->forward(x), y);
            });
      };
      if (mode == lamp::CudaGraphMode::kOn) {
        try {
          run();
          FAIL() << "a CUDA graph was accepted";
        } catch (const c10::Error& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find(c.reason), std::string::npos) << what;
          EXPECT_NE(what.find("TrainStepOptions::cuda_graph kAuto"),
                    std::string::npos)
              << what;
        }
        EXPECT_TRUE(BitEqual(model->fc->weight.detach(), before));
      } else {
        // An eager step: the weights move (or, accumulating, the gradients
        // fill) and no graph memory is held.
        run();
        const bool changed = !BitEqual(model->fc->weight.detach(), before);
        EXPECT_EQ(changed, c.options.accumulation_steps() == 1);
        EXPECT_EQ(step.cuda_graph_pool_bytes(), 0);
        EXPECT_EQ(step.cuda_graph_captures(), 0);
      }
    }
  }
}

TEST(TrainStep, CudaGraphModeNames) {
  for (auto mode : {lamp::CudaGraphMode::kOff, lamp::CudaGraphMode::kOn,
                    lamp::CudaGraphMode::kAuto}) {
    EXPECT_EQ(lamp::parse_cuda_graph_mode(lamp::to_string(mode)), mode);
  }
  EXPECT_EQ(lamp::to_string(lamp::CudaGraphMode::kAuto), "auto");
  EXPECT_EQ(lamp::TrainStepOptions().cuda_graph(), lamp::CudaGraphMode::kOff);
  EXPECT_EQ(lamp::TrainStepOptions().cuda_graph(true).cuda_graph(),
            lamp::CudaGraphMode::kOn);
  EXPECT_EQ(lamp::TrainStepOptions()
                .cuda_graph(lamp::CudaGraphMode::kAuto)
                .cuda_graph(false)
                .cuda_graph(),
            lamp::CudaGraphMode::kOff);
  expect_error(
      [] { lamp::parse_cuda_graph_mode("yes"); },
      "unknown CUDA-graph mode 'yes'; valid CUDA-graph modes are auto, on and off.");
}

// The step's policy is the mode's, and what it casts inputs to and whether
// it scales follow it.
TEST(TrainStep, FollowsItsPrecisionPolicy) {
  for (auto precision :
       {Precision::kFP32, Precision::kAMPBF16, Precision::kBF16}) {
    SCOPED_TRACE(lamp::to_string(precision));
    SmallNet model;
    lamp::TrainStep step(model.ptr(), sgd(0.05), precision);
    const auto expected = lamp::precision_policy(precision);
    EXPECT_EQ(step.policy().model_dtype, expected.model_dtype);
    EXPECT_EQ(step.policy().autocast_dtype, expected.autocast_dtype);
    EXPECT_EQ(step.cast_input(torch::ones({1})).scalar_type(),
              expected.model_dtype.value_or(torch::kFloat));
    // Without loss scaling the scaler only skips non-finite steps
    // (skip_non_finite): a static scale of 1.
    EXPECT_EQ(step.scaler().options().dynamic(), expected.loss_scaling);
    EXPECT_EQ(step.scaler().get_scale() == 1.0, !expected.loss_scaling);
    EXPECT_EQ(step.master_weights() != nullptr, expected.master_weights);
  }
}

// TF32 is a CUDA switch: a CPU TrainStep leaves it as it is, whatever the
// precision or option.
TEST(TrainStep, Tf32IsLeftAloneOnCpu) {
  for (bool before : {true, false}) {
    lamp::set_tf32(before);
    for (const auto& options :
         {lamp::TrainStepOptions(Precision::kFP32),
          lamp::TrainStepOptions(Precision::kTF32),
          lamp::TrainStepOptions(Precision::kFP32).tf32(!before)}) {
      SmallNet model;
      lamp::TrainStep step(model.ptr(), sgd(0.05), options);
      EXPECT_EQ(lamp::tf32(), before);
    }
  }
  lamp::set_tf32(false);
}

// TF32 follows the precision (or the explicit option) while a CUDA
// TrainStep lives, and is restored when it goes away.
TEST(TrainStep, Tf32FollowsThePrecisionAndIsRestored_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  struct Case {
    lamp::TrainStepOptions options;
    bool tf32_inside;
  };
  const Case cases[] = {
      {lamp::TrainStepOptions(Precision::kFP32), false},
      {lamp::TrainStepOptions(Precision::kTF32), true},
      {lamp::TrainStepOptions(Precision::kFP32).tf32(true), true},
      {lamp::TrainStepOptions(Precision::kAMP), true}, // left as it was
  };
  for (bool before : {true, false}) {
    for (const auto& c : cases) {
      lamp::set_tf32(before);
      {
        SmallNet model;
        model->to(torch::kCUDA);
        lamp::TrainStep step(model.ptr(), sgd(0.05), c.options);
        const bool expected =
            c.options.precision() == Precision::kAMP ? before : c.tf32_inside;
        EXPECT_EQ(lamp::tf32(), expected)
            << lamp::to_string(c.options.precision());
      }
      EXPECT_EQ(lamp::tf32(), before);
    }
  }
}

// Graph and eager steps give the same weights over 50 steps with a forced
// overflow (skipped on the device, the scale backing off) and a learning
// rate change in the middle (read from the optimizer's device tensor), and
// the same gradient norms (StepResult::grad_norm, inf at the overflow).
TEST(TrainStep, CudaGraphStepsEqualEagerSteps_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto problem = lamp_test::make_problem(64, 4, 6);
  const auto images = problem.inputs.to(torch::kCUDA);
  const auto labels = problem.targets.to(torch::kCUDA);
  for (auto precision : {Precision::kAMP, Precision::kHalf, Precision::kBF16}) {
    for (const std::string optimizer : {"sgd", "adamw"}) {
      SCOPED_TRACE(optimizer);
      std::vector<std::vector<torch::Tensor>> weights;
      std::vector<int64_t> skipped;
      std::vector<std::vector<double>> norms;
      for (bool graph : {true, false}) {
        norms.emplace_back();
        torch::manual_seed(9);
        SmallNet model;
        model->to(torch::kCUDA);
        lamp::TrainStep step(
            model.ptr(),
            [&](std::vector<torch::Tensor> params) {
              return lamp::optim::make_optimizer(
                  std::move(params), lamp::optim::OptimizerOptions()
                                         .name(optimizer)
                                         .lr(optimizer == "sgd" ? 0.05 : 1e-3)
                                         .momentum(0.9)
                                         .weight_decay(1e-2));
            },
            lamp::TrainStepOptions(precision)
                .cuda_graph(graph)
                .max_grad_norm(2.0)
                .force_loss_scaling(true)
                .scaler(
                    lamp::GradScalerOptions().init_scale(1024).growth_interval(
                        10)));
        for (int i = 0; i < 50; ++i) {
          if (i == 25) {
            for (auto& group : step.optimizer().param_groups()) {
              group.options().set_lr(0.01);
            }
          }
          // The overflow comes with the data (a graph replays the loss
          // function as captured: a constant in it would stay the same).
          const auto input =
              i == 30 ? images * std::numeric_limits<float>::infinity()
                      : images;
          const auto result =
              step.step(input, labels,
                        [&](const torch::Tensor& x, const torch::Tensor& y) {
                          return torch::nn::functional::cross_entropy(
                              model->forward(x).to(torch::kFloat), y);
                        });
          ASSERT_TRUE(result.grad_norm.defined()) << "step " << i;
          norms.back().push_back(result.grad_norm.item<double>());
        }
        std::vector<torch::Tensor> w;
        for (const auto& p : model->parameters())
          w.push_back(p.detach().cpu());
        weights.push_back(w);
        skipped.push_back(step.scaler().steps_skipped());
        EXPECT_EQ(step.scaler().steps_taken() + step.scaler().steps_skipped(),
                  50);
        EXPECT_EQ(step.scaler().steps_skipped(), 1)
            << lamp::to_string(precision);
      }
      EXPECT_EQ(skipped[0], skipped[1]) << lamp::to_string(precision);
      for (size_t i = 0; i < norms[0].size(); ++i) {
        if (i == 30) {
          EXPECT_FALSE(std::isfinite(norms[0][i])) << "step " << i;
          EXPECT_FALSE(std::isfinite(norms[1][i])) << "step " << i;
        } else {
          // As the weights: only cuDNN's algorithms may differ.
          EXPECT_NEAR(norms[0][i], norms[1][i], 1e-3 * norms[1][i] + 1e-5)
              << lamp::to_string(precision) << " step " << i;
        }
      }
      for (size_t i = 0; i < weights[0].size(); ++i) {
        // The same kernels in the same order; only cuDNN's choice of
        // algorithm may differ between the two runs (a few ulps).
        EXPECT_TRUE(
            lamp_test::AllClose(weights[0][i], weights[1][i], 1e-3, 1e-5))
            << lamp::to_string(precision) << " parameter " << i;
      }
    }
  }
}

} // namespace

// A named factory gets every trainable parameter's name in named_parameters()
// order with the tensor the optimizer trains: the model's own in fp32, the
// FP32 master copy in bf16. Groups chosen by name reach the optimizer.
TEST(TrainStep, NamedFactoryGetsNamesAndTheTensorsItTrains) {
  for (auto precision : {lamp::Precision::kFP32, lamp::Precision::kBF16}) {
    SCOPED_TRACE(lamp::to_string(precision));
    torch::manual_seed(0);
    SmallNet net;
    const auto model_params = net->named_parameters();
    std::vector<std::string> names;
    std::vector<torch::Tensor> tensors;
    lamp::TrainStep step(
        net.ptr(),
        [&](const lamp::NamedParameters& named) {
          std::vector<torch::Tensor> head, body;
          for (const auto& item : named) {
            names.push_back(item.key());
            tensors.push_back(item.value());
            (item.key().rfind("fc.", 0) == 0 ? head : body)
                .push_back(item.value());
          }
          std::vector<torch::optim::OptimizerParamGroup> groups;
          groups.emplace_back(body);
          groups.emplace_back(head,
                              std::make_unique<torch::optim::SGDOptions>(0.5));
          return std::make_unique<lamp::optim::SGD>(
              groups, torch::optim::SGDOptions(0.1));
        },
        lamp::TrainStepOptions(precision));
    EXPECT_EQ(names, model_params.keys());
    ASSERT_EQ(tensors.size(), model_params.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(tensors[i].scalar_type(), torch::kFloat) << names[i];
      EXPECT_EQ(tensors[i].sizes(), model_params[names[i]].sizes()) << names[i];
      const bool is_model_param = tensors[i].is_same(model_params[names[i]]);
      EXPECT_EQ(is_model_param, precision == lamp::Precision::kFP32)
          << names[i];
      if (precision == lamp::Precision::kBF16) {
        EXPECT_TRUE(
            tensors[i].is_same(step.master_weights()->master_params()[i]));
      }
    }
    const auto& groups = step.optimizer().param_groups();
    ASSERT_EQ(groups.size(), 2u);
    EXPECT_EQ(groups[1].params().size(), 2u); // fc.weight, fc.bias
    EXPECT_EQ(groups[1].options().get_lr(), 0.5);
  }
}

namespace {

// A GradientSync that records what TrainStep asks of it, in order, and can
// claim an overflow on another replica.
struct RecordingSync final : lamp::GradientSync {
  std::vector<std::string>* events;
  torch::Device on;
  bool other_replica_overflows = false;

  RecordingSync(std::vector<std::string>* e, torch::Device d)
      : events(e), on(d) {}
  void before_forward() override { events->push_back("forward"); }
  void set_sync(bool sync) override {
    events->push_back(sync ? "sync" : "no_sync");
  }
  void finish_gradient_sync() override { events->push_back("finish"); }
  void reduce_found_inf(torch::Tensor& found_inf) override {
    events->push_back("found_inf");
    if (other_replica_overflows) {
      found_inf.fill_(1.0);
    }
  }
  torch::Device device() const override { return on; }
};

} // namespace

TEST(TrainStep, CallsItsGradientSyncInStepOrder) {
  const auto problem = lamp_test::make_problem(16, 4, 3);
  std::vector<std::string> events;
  torch::manual_seed(2);
  SmallNet model;
  torch::Dtype dtype_seen = torch::kFloat;
  lamp::TrainStep step(
      model.ptr(), sgd(0.05),
      static_scaling(Precision::kBF16)
          .accumulation_steps(2)
          .gradient_sync([&](const std::shared_ptr<torch::nn::Module>& m) {
            // Built after the conversion: replicas synchronise BF16 weights.
            EXPECT_EQ(m.get(), model.ptr().get());
            dtype_seen = model->fc->weight.scalar_type();
            // Before the master copy: what the sync does to the weights
            // (rank 0's broadcast) is what the masters start from.
            torch::NoGradGuard no_grad;
            model->fc->weight.fill_(0.5);
            return std::make_unique<RecordingSync>(&events, torch::kCPU);
          }));
  EXPECT_EQ(dtype_seen, torch::kBFloat16);
  ASSERT_NE(step.gradient_sync(), nullptr);
  ASSERT_NE(step.master_weights(), nullptr);
  EXPECT_TRUE(step.master_weights()->master_params().size() > 0);
  bool found_fc = false;
  for (const auto& master : step.master_weights()->master_params()) {
    if (master.sizes() == model->fc->weight.sizes()) {
      EXPECT_TRUE(torch::all(master == 0.5).item<bool>());
      found_fc = true;
    }
  }
  EXPECT_TRUE(found_fc);
  for (int i = 0; i < 4; ++i) {
    step.step(problem.inputs, problem.targets,
              [&](const torch::Tensor& x, const torch::Tensor& y) {
                return torch::nn::functional::cross_entropy(
                    model->forward(x).to(torch::kFloat), y);
              });
  }
  const std::vector<std::string> cycle = {"forward", "no_sync", "forward",
                                          "sync",    "finish",  "found_inf"};
  std::vector<std::string> expected = cycle;
  expected.insert(expected.end(), cycle.begin(), cycle.end());
  EXPECT_EQ(events, expected);
}

TEST(TrainStep, AnOverflowOnAnotherReplicaSkipsTheStepHere) {
  const auto problem = lamp_test::make_problem(16, 4, 3);
  std::vector<std::string> events;
  RecordingSync* sync = nullptr;
  torch::manual_seed(2);
  SmallNet model;
  lamp::TrainStep step(
      model.ptr(), sgd(0.05),
      lamp::TrainStepOptions(Precision::kFP32)
          .force_loss_scaling(true)
          .scaler(lamp::GradScalerOptions().init_scale(1024.0))
          .gradient_sync([&](const std::shared_ptr<torch::nn::Module>&) {
            auto made = std::make_unique<RecordingSync>(&events, torch::kCPU);
            sync = made.get();
            return made;
          }));
  ASSERT_NE(sync, nullptr);
  // CUDA graphs do not capture the communication.
  EXPECT_NE(step.cuda_graph_unavailable_reason().find("gradient synchroniser"),
            std::string::npos)
      << step.cuda_graph_unavailable_reason();
  const auto loss = [&](const torch::Tensor& x, const torch::Tensor& y) {
    return torch::nn::functional::cross_entropy(model->forward(x), y);
  };
  const auto before = model->fc->weight.detach().clone();
  sync->other_replica_overflows = true;
  auto result = step.step(problem.inputs, problem.targets, loss);
  EXPECT_TRUE(result.skipped()); // this replica's gradients were finite
  EXPECT_TRUE(BitEqual(model->fc->weight, before));
  EXPECT_EQ(result.scale.item<double>(), 512.0);
  sync->other_replica_overflows = false;
  result = step.step(problem.inputs, problem.targets, loss);
  EXPECT_TRUE(result.optimizer_stepped());
  EXPECT_FALSE(BitEqual(model->fc->weight, before));
}

TEST(TrainStep, GradientSyncOnAnotherDeviceOrNoneAtAll) {
  SmallNet model;
  std::vector<std::string> events;
  expect_error(
      [&] {
        lamp::TrainStep step(
            model.ptr(), sgd(0.05),
            lamp::TrainStepOptions(Precision::kFP32)
                .gradient_sync([&](const std::shared_ptr<torch::nn::Module>&) {
                  return std::make_unique<RecordingSync>(
                      &events, torch::Device(torch::kCUDA, 0));
                }));
      },
      "gradient synchroniser communicates on cuda:0");
  // A factory may decline (a one-process group): plain training.
  lamp::TrainStep plain(
      model.ptr(), sgd(0.05),
      lamp::TrainStepOptions(Precision::kFP32)
          .gradient_sync([](const std::shared_ptr<torch::nn::Module>&) {
            return std::unique_ptr<lamp::GradientSync>();
          }));
  EXPECT_EQ(plain.gradient_sync(), nullptr);
}

TEST(TrainStep, ForwardCastsAndAutocastsAsTheStepDoes) {
  const auto x = torch::randn({2, 3, 8, 8});
  {
    SmallNet model;
    lamp::TrainStep step(model.ptr(), sgd(0.05), Precision::kBF16);
    torch::Dtype seen = torch::kFloat;
    const auto out = step.forward(
        [&](const torch::Tensor& input) {
          seen = input.scalar_type();
          return model->forward(input);
        },
        x);
    EXPECT_EQ(seen, torch::kBFloat16);
    EXPECT_TRUE(BitEqual(out, model->forward(x.to(torch::kBFloat16))));
  }
  {
    SmallNet model;
    lamp::TrainStep step(model.ptr(), sgd(0.05), Precision::kAMPBF16);
    const auto a = torch::randn({2, 2});
    // Under the step's autocast, a matmul of FP32 tensors runs in BF16.
    const auto out =
        step.forward([&](const torch::Tensor& input) { return input.mm(a); },
                     torch::randn({2, 2}));
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(torch::randn({2, 2}).mm(a).scalar_type(), torch::kFloat);
  }
}

TEST(TrainStep, ANetworkToHalfModelTrainsLikeTheStepsOwnConversion) {
  // The seed's recipe (network_to_half, whose InputCast casts the inputs)
  // and TrainStep's own conversion with cast_input: the same steps.
  const auto problem = lamp_test::make_problem(32, 4, 5);
  std::vector<torch::Tensor> weights;
  for (bool converted_by_caller : {true, false}) {
    torch::manual_seed(8);
    SmallNet model;
    std::function<torch::Tensor(const torch::Tensor&)> forward;
    if (converted_by_caller) {
      auto half = lamp::network_to_half(model, torch::kBFloat16);
      forward = [half](const torch::Tensor& x) mutable {
        return half->forward(x);
      };
    }
    lamp::TrainStep step(model.ptr(), sgd(0.05), Precision::kBF16);
    for (int i = 0; i < 3; ++i) {
      step.step([&] {
        const auto logits =
            converted_by_caller
                ? forward(problem.inputs)
                : model->forward(step.cast_input(problem.inputs));
        return torch::nn::functional::cross_entropy(logits.to(torch::kFloat),
                                                    problem.targets);
      });
    }
    EXPECT_EQ(model->fc->weight.scalar_type(), torch::kBFloat16);
    weights.push_back(model->fc->weight.detach().clone());
  }
  EXPECT_TRUE(BitEqual(weights[0], weights[1]));
}

namespace {

// One TrainStep used by two threads at once: the second caller gets an error
// naming the misuse instead of a data race. Deterministic: the first step is
// held inside its loss function until the second call has returned.
TEST(TrainStep, RefusesAStepFromASecondThreadWhileOneRuns) {
  torch::nn::Linear linear(3, 2);
  lamp::TrainStep step(linear.ptr(), sgd(0.1), Precision::kFP32);
  const auto loss = [&] { return linear(torch::ones({1, 3})).sum(); };
  std::promise<void> inside;
  std::promise<void> second_done;
  auto second_returned = second_done.get_future().share();
  std::thread first([&] {
    step.step([&] {
      inside.set_value();
      second_returned.wait();
      return loss();
    });
  });
  inside.get_future().wait();
  std::string error;
  std::thread second([&] {
    error = lamp_test::error_of([&] { step.step(loss); });
    second_done.set_value();
  });
  second.join();
  first.join();
  EXPECT_NE(error.find("lamp::TrainStep::step called from two threads at once"),
            std::string::npos)
      << error;
  // One thread at a time, whichever: the object works on.
  std::thread([&] { EXPECT_TRUE(step.step(loss).optimizer_stepped()); }).join();
  EXPECT_TRUE(step.step(loss).optimizer_stepped());
  EXPECT_EQ(step.scaler().steps_taken(), 3);
}

} // namespace
