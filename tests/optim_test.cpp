#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "lamp/amp/grad_scaler.h"
#include "lamp/amp/train_step.h"
#include "lamp/optim/adam.h"
#include "lamp/optim/clip.h"
#include "lamp/optim/decay_groups.h"
#include "lamp/optim/optimizer.h"
#include "lamp/optim/sgd.h"
#include "lamp/platform/parameters.h"
#include "optim/internal.h"
#include "test_util.h"

namespace {

using lamp::optim::Implementation;
using lamp_test::AllClose;
using lamp_test::BitEqual;
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::optim::OptimizerParamGroup>)>;

bool fused_available() {
  torch::Tensor p = torch::zeros({1}, torch::requires_grad());
  lamp::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  return sgd.implementation() == Implementation::kFused;
}

#define LAMP_SKIP_WITHOUT_FUSED()                                         \
  do {                                                                    \
    if (!fused_available()) {                                             \
      GTEST_SKIP() << "this LibTorch has no fused CPU optimizer kernels " \
                      "(they arrived in 2.4)";                            \
    }                                                                     \
  } while (0)

// Three parameters of different shapes in two param groups (the second with
// its own learning rate), with fixed initial values.
std::vector<torch::Tensor> make_params() {
  torch::manual_seed(7);
  return {torch::randn({5, 3}).requires_grad_(),
          torch::randn({3}).requires_grad_(),
          torch::randn({2, 2, 3}).requires_grad_()};
}

std::vector<torch::optim::OptimizerParamGroup> groups_of(
    const std::vector<torch::Tensor>& params,
    const torch::optim::OptimizerOptions& second) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1]});
  groups.emplace_back(std::vector<torch::Tensor>{params[2]}, second.clone());
  return groups;
}

// Gradients of a fixed quadratic bowl plus seeded noise: they depend on the
// current parameters, as in training, and stay well-conditioned.
void set_grads(const std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(1000 + step);
  for (const auto& p : params) {
    p.mutable_grad() = (0.3 * p.detach() + 0.1 * torch::randn(p.sizes()));
  }
}

// Runs `steps` steps of the optimizer `make` builds; returns the parameters.
std::vector<torch::Tensor> trajectory(
    const Factory& make, const torch::optim::OptimizerOptions& second,
    int steps) {
  auto params = make_params();
  auto optimizer = make(groups_of(params, second));
  for (int i = 0; i < steps; ++i) {
    set_grads(params, i);
    optimizer->step();
  }
  return params;
}

struct OptimizerCase {
  std::string name;
  Factory reference;                                   // torch::optim
  std::function<Factory(Implementation)> lamp_factory; // lamp::optim
  std::shared_ptr<torch::optim::OptimizerOptions> second_group;
};

template <typename Torch, typename Lamp, typename Options>
OptimizerCase make_case(const std::string& name, const Options& options,
                        double second_lr) {
  auto second = std::make_shared<Options>(options);
  second->set_lr(second_lr);
  return {name,
          [options](std::vector<torch::optim::OptimizerParamGroup> groups) {
            return std::make_unique<Torch>(std::move(groups), options);
          },
          [options](Implementation implementation) -> Factory {
            return [options, implementation](
                       std::vector<torch::optim::OptimizerParamGroup> groups) {
              return std::make_unique<Lamp>(std::move(groups), options,
                                            implementation);
            };
          },
          second};
}

std::vector<OptimizerCase> optimizer_cases() {
  using torch::optim::AdamOptions;
  using torch::optim::AdamWOptions;
  using torch::optim::SGDOptions;
  return {
      make_case<torch::optim::SGD, lamp::optim::SGD>("sgd_plain",
                                                     SGDOptions(0.1), 0.05),
      make_case<torch::optim::SGD, lamp::optim::SGD>(
          "sgd_momentum_wd", SGDOptions(0.1).momentum(0.9).weight_decay(1e-2),
          0.05),
      make_case<torch::optim::SGD, lamp::optim::SGD>(
          "sgd_nesterov",
          SGDOptions(0.05).momentum(0.8).nesterov(true).weight_decay(5e-4),
          0.2),
      make_case<torch::optim::SGD, lamp::optim::SGD>(
          "sgd_dampening", SGDOptions(0.1).momentum(0.9).dampening(0.3), 0.01),
      make_case<torch::optim::Adam, lamp::optim::Adam>("adam",
                                                       AdamOptions(1e-2), 3e-3),
      make_case<torch::optim::Adam, lamp::optim::Adam>(
          "adam_amsgrad_wd", AdamOptions(1e-2).amsgrad(true).weight_decay(1e-2),
          3e-3),
      make_case<torch::optim::AdamW, lamp::optim::AdamW>(
          "adamw", AdamWOptions(1e-2), 3e-3),
      make_case<torch::optim::AdamW, lamp::optim::AdamW>(
          "adamw_amsgrad", AdamWOptions(1e-2).amsgrad(true).weight_decay(0.1),
          3e-3),
  };
}

class OptimCase : public ::testing::TestWithParam<OptimizerCase> {};

// The per-tensor path is torch::optim's own loop, and the foreach path runs
// the same elementwise ops on lists: both equal torch::optim bit for bit over
// 60 steps, in both param groups.
TEST_P(OptimCase, PerTensorAndForEachEqualTorchOptimBitForBit) {
  const auto& c = GetParam();
  const auto expected = trajectory(c.reference, *c.second_group, 60);
  for (auto implementation :
       {Implementation::kPerTensor, Implementation::kForEach}) {
    const auto got =
        trajectory(c.lamp_factory(implementation), *c.second_group, 60);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(BitEqual(got[i], expected[i]))
          << lamp::optim::to_string(implementation) << " param " << i;
    }
  }
}

// ATen's fused kernels compute the same rule in one pass with FP32 opmath
// (fused multiply-adds, the bias corrections from an FP32 step count), so
// the last bits differ. Over 60 steps of parameters of order 1 the measured
// difference is at most 4.8e-7 (LibTorch 2.11 CPU, AdamW; 0 for plain SGD);
// 1e-5 relative + 1e-6 absolute leaves room for other CPUs and CUDA, and
// still fails any wrong term (a missing bias correction or weight decay
// moves them by > 1e-3).
TEST_P(OptimCase, FusedFollowsTorchOptim) {
  LAMP_SKIP_WITHOUT_FUSED();
  const auto& c = GetParam();
  const auto expected = trajectory(c.reference, *c.second_group, 60);
  const auto got =
      trajectory(c.lamp_factory(Implementation::kFused), *c.second_group, 60);
  double largest = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(AllClose(got[i], expected[i], 1e-5, 1e-6)) << "param " << i;
    largest =
        std::max(largest, (got[i] - expected[i]).abs().max().item<double>());
  }
  std::cout << "[ fused    ] " << c.name
            << ": max |fused - torch::optim| after "
            << "60 steps = " << largest << "\n";
}

// A checkpoint of a lamp optimizer is a torch::optim checkpoint: train 20
// steps with lamp, load into torch::optim and go on; the result equals 40
// steps of torch::optim (exactly for per-tensor, to the fused tolerance).
TEST_P(OptimCase, CheckpointsAreTorchOptimCheckpoints) {
  const auto& c = GetParam();
  const auto expected = trajectory(c.reference, *c.second_group, 40);
  for (auto implementation :
       {Implementation::kPerTensor, Implementation::kFused}) {
    if (implementation == Implementation::kFused && !fused_available()) {
      continue; // the per-tensor round trip still ran; FusedFollowsTorchOptim
                // skips
    }
    auto params = make_params();
    auto lamp_optimizer =
        c.lamp_factory(implementation)(groups_of(params, *c.second_group));
    for (int i = 0; i < 20; ++i) {
      set_grads(params, i);
      lamp_optimizer->step();
    }
    std::stringstream stream;
    {
      torch::serialize::OutputArchive archive;
      lamp_optimizer->save(archive);
      archive.save_to(stream);
    }
    auto torch_optimizer = c.reference(groups_of(params, *c.second_group));
    torch::serialize::InputArchive archive;
    archive.load_from(stream);
    torch_optimizer->load(archive);
    for (int i = 20; i < 40; ++i) {
      set_grads(params, i);
      torch_optimizer->step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (implementation == Implementation::kPerTensor) {
        EXPECT_TRUE(BitEqual(params[i], expected[i])) << "param " << i;
      } else {
        EXPECT_TRUE(AllClose(params[i], expected[i], 1e-5, 1e-6))
            << "param " << i;
      }
    }
  }
}

// step_scaled(grad_scale, found_inf): a flagged step changes nothing (no
// parameter, no state: the following steps equal those of an optimizer that
// never saw it, even for SGD's first-step momentum with dampening), and a
// scaled gradient is divided by the scale (a power of two: exact). Any
// non-zero flag skips: 2 (a flag summed over two ranks or cycles) and 0.5
// (averaged) as well as 1; ATen's fused kernels skip only on exactly 1.
TEST_P(OptimCase, ScaledStepUnscalesAndSkipsOnTheDevice) {
  const auto& c = GetParam();
  for (auto implementation :
       {Implementation::kPerTensor, Implementation::kForEach,
        Implementation::kFused}) {
    if (implementation == Implementation::kFused && !fused_available()) {
      continue;
    }
    auto reference =
        trajectory(c.lamp_factory(implementation), *c.second_group, 6);
    auto params = make_params();
    auto optimizer =
        c.lamp_factory(implementation)(groups_of(params, *c.second_group));
    auto* scaled = dynamic_cast<lamp::optim::AmpStep*>(optimizer.get());
    ASSERT_NE(scaled, nullptr);
    const auto scale = torch::full({}, 1024.0f);
    const auto clean = torch::zeros({});
    int taken = 0;
    for (int i = 0; i < 9; ++i) {
      const bool skip = i == 0 || i == 4 || i == 5; // the very first one too
      if (skip) {
        for (auto& p : params) {
          p.mutable_grad() =
              torch::full(p.sizes(), std::numeric_limits<float>::infinity());
        }
        scaled->step_scaled(scale, torch::full({}, i == 0   ? 2.0f
                                                   : i == 4 ? 1.0f
                                                            : 0.5f));
        continue;
      }
      set_grads(params, taken++);
      for (auto& p : params) {
        p.mutable_grad().mul_(1024);
      }
      scaled->step_scaled(scale, clean);
    }
    ASSERT_EQ(taken, 6);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(BitEqual(params[i], reference[i]))
          << lamp::optim::to_string(implementation) << " param " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, OptimCase, ::testing::ValuesIn(optimizer_cases()),
                         [](const auto& info) { return info.param.name; });

// The flag the fused kernels get: exactly 1 for any non-zero flag (a sum over
// ranks or cycles, an average), 0 for 0, in the flag's own dtype and shape;
// undefined (no flag) stays undefined. Tested here directly because its
// callers, the fused kernels, need LibTorch >= 2.4.
TEST(Optim, SkipFlagIsExactlyOneWhereTheFlagIsNonZero) {
  using lamp::optim::internal::skip_flag;
  // A negative or NaN flag too (sign() gave -1 and NaN, on which ATen's
  // fused kernels step, and Adam's step count moved by 2).
  for (const float value :
       {0.0f, 1.0f, 2.0f, 3.0f, 0.5f, 1e-30f, -1.0f, std::nanf("")}) {
    const auto flag = skip_flag(torch::full({}, value));
    EXPECT_EQ(flag.scalar_type(), torch::kFloat);
    EXPECT_EQ(flag.dim(), 0);
    EXPECT_EQ(flag.item<float>(), value == 0.0f ? 0.0f : 1.0f) << value;
  }
  const auto summed = torch::tensor({0.0f, 2.0f, 1.0f}, torch::kDouble);
  EXPECT_TRUE(
      skip_flag(summed).equal(torch::tensor({0.0, 1.0, 1.0}, torch::kDouble)));
  EXPECT_FALSE(skip_flag(torch::Tensor()).defined());
}

TEST(Optim, FusedAdamCountsOnlyTakenStepsInItsCheckpoint) {
  LAMP_SKIP_WITHOUT_FUSED();
  auto params = make_params();
  lamp::optim::Adam adam(params, torch::optim::AdamOptions(1e-2),
                         Implementation::kFused);
  for (int i = 0; i < 7; ++i) {
    set_grads(params, i);
    adam.step_scaled(torch::Tensor(),
                     torch::full({}, i % 3 == 1 ? 1.0f : 0.0f));
  }
  std::stringstream stream;
  {
    torch::serialize::OutputArchive archive;
    adam.save(archive);
    archive.save_to(stream);
  }
  ASSERT_EQ(adam.state().size(), params.size());
  for (const auto& item : adam.state()) {
    const auto& state =
        static_cast<const torch::optim::AdamParamState&>(*item.second);
    EXPECT_EQ(state.step(), 5); // 7 steps, 2 skipped (i = 1, 4)
  }
  // Saving leaves the device counts in use (a captured graph holds them):
  // two more taken steps, saved again, count 7.
  for (int i = 7; i < 9; ++i) {
    set_grads(params, i);
    adam.step_scaled(torch::Tensor(), torch::zeros({}));
  }
  {
    torch::serialize::OutputArchive again;
    adam.save(again);
  }
  for (const auto& item : adam.state()) {
    EXPECT_EQ(
        static_cast<const torch::optim::AdamParamState&>(*item.second).step(),
        7);
  }
  // And the first checkpoint says 5: a torch::optim::Adam loading it agrees.
  torch::optim::Adam reference(params, torch::optim::AdamOptions(1e-2));
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  reference.load(archive);
  for (const auto& item : reference.state()) {
    EXPECT_EQ(
        static_cast<const torch::optim::AdamParamState&>(*item.second).step(),
        5);
  }
}

// load() replaces the state, as Python's load_state_dict: a checkpoint made
// before any step holds no state, so after loading it a stepped optimizer's
// next step is a first step, bit for bit a fresh torch::optim's (LibTorch's
// load keeps the old momentum and moments beside it).
template <typename Lamp, typename Torch, typename Options>
void expect_load_replaces_the_state(const Options& options) {
  auto params = make_params();
  Lamp stepped(params, options, Implementation::kPerTensor);
  for (int i = 0; i < 3; ++i) {
    set_grads(params, i);
    stepped.step();
  }
  ASSERT_EQ(stepped.state().size(), params.size());
  std::stringstream stream;
  {
    auto other = make_params();
    Lamp fresh(other, options, Implementation::kPerTensor);
    torch::serialize::OutputArchive archive;
    fresh.save(archive);
    archive.save_to(stream);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  stepped.load(archive);
  EXPECT_TRUE(stepped.state().empty());
  std::vector<torch::Tensor> copies;
  for (const auto& p : params) {
    copies.push_back(p.detach().clone().requires_grad_());
  }
  Torch reference(copies, options);
  set_grads(params, 3);
  set_grads(copies, 3);
  stepped.step();
  reference.step();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(BitEqual(params[i], copies[i])) << i;
  }
}

TEST(Optim, LoadReplacesTheStateAsPythons) {
  {
    SCOPED_TRACE("SGD");
    expect_load_replaces_the_state<lamp::optim::SGD, torch::optim::SGD>(
        torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.5));
  }
  {
    SCOPED_TRACE("Adam");
    expect_load_replaces_the_state<lamp::optim::Adam, torch::optim::Adam>(
        torch::optim::AdamOptions(1e-2));
  }
}

TEST(Optim, ImplementationsAreChosenAndRefusedClearly) {
  torch::Tensor p = torch::zeros({2}, torch::requires_grad());
  lamp::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(sgd.requested_implementation(), Implementation::kAuto);
  EXPECT_EQ(sgd.skips_on_device(), fused_available());
  EXPECT_EQ(lamp::optim::parse_implementation("foreach"),
            Implementation::kForEach);
  EXPECT_EQ(lamp::optim::to_string(Implementation::kPerTensor), "per-tensor");
  EXPECT_THROW(lamp::optim::parse_implementation("apex"), c10::Error);
  // Integer parameters have no fused kernel: kFused is refused with a message
  // that names the alternatives, kAuto falls back.
  torch::Tensor ints = torch::zeros({2}, torch::kLong);
  lamp::optim::SGD int_sgd({ints}, torch::optim::SGDOptions(0.1),
                           Implementation::kFused);
  try {
    int_sgd.step();
    FAIL() << "fused SGD accepted int64 parameters";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Implementation::kAuto"),
              std::string::npos)
        << e.what();
  }
  lamp::optim::SGD auto_sgd({ints}, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(auto_sgd.implementation(), Implementation::kPerTensor);
}

TEST(Optim, MakeOptimizerBuildsEachByName) {
  auto params = make_params();
  const auto config =
      lamp::optim::OptimizerOptions().lr(0.01).weight_decay(1e-3);
  auto sgd = lamp::optim::make_optimizer(
      params, lamp::optim::OptimizerOptions(config).name("sgd"));
  auto* as_sgd = dynamic_cast<lamp::optim::SGD*>(sgd.get());
  ASSERT_NE(as_sgd, nullptr);
  EXPECT_EQ(static_cast<const torch::optim::SGDOptions&>(as_sgd->defaults())
                .momentum(),
            0.9);
  EXPECT_NE(dynamic_cast<lamp::optim::Adam*>(
                lamp::optim::make_optimizer(
                    params, lamp::optim::OptimizerOptions(config).name("adam"))
                    .get()),
            nullptr);
  auto adamw = lamp::optim::make_optimizer(
      params, lamp::optim::OptimizerOptions(config).name("adamw"));
  auto* as_adamw = dynamic_cast<lamp::optim::AdamW*>(adamw.get());
  ASSERT_NE(as_adamw, nullptr);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(as_adamw->defaults())
                .weight_decay(),
            1e-3);
  EXPECT_EQ(lamp::optim::optimizer_names(),
            (std::vector<std::string>{"sgd", "adam", "adamw"}));
  try {
    lamp::optim::make_optimizer(
        params, lamp::optim::OptimizerOptions(config).name("lamb"));
    FAIL() << "accepted an unknown optimizer";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sgd, adam and adamw"),
              std::string::npos);
  }
}

// lamp's clip keeps the norm on the device and scales like LibTorch's.
TEST(Optim, ClipGradNormMatchesLibTorchs) {
  for (double max_norm : {0.5, 100.0}) {
    auto a = make_params(), b = make_params();
    set_grads(a, 3);
    set_grads(b, 3);
    a[1].mutable_grad() = torch::Tensor(); // no gradient: ignored
    b[1].mutable_grad() = torch::Tensor();
    const double expected = torch::nn::utils::clip_grad_norm_(a, max_norm);
    const auto got = lamp::optim::clip_grad_norm_(b, max_norm);
    EXPECT_EQ(got.dim(), 0);
    // _foreach_norm may sum in another order than Tensor::norm: FP32 ulps.
    EXPECT_NEAR(got.item<double>(), expected, 1e-6 * expected);
    for (size_t i : {0u, 2u}) {
      EXPECT_TRUE(AllClose(b[i].grad(), a[i].grad(), 1e-6, 1e-7)) << i;
    }
    EXPECT_FALSE(b[1].grad().defined());
  }
  EXPECT_THROW(lamp::optim::clip_grad_norm_(make_params(), 0.0), c10::Error);
  EXPECT_THROW(lamp::optim::clip_grad_norm_(
                   make_params(), std::numeric_limits<double>::quiet_NaN()),
               c10::Error);
  // An infinite max_norm measures the norm and scales by 1 (Python's and
  // LibTorch's clip take it too).
  auto a = make_params(), b = make_params();
  set_grads(a, 3);
  set_grads(b, 3);
  const double inf = std::numeric_limits<double>::infinity();
  const double expected = torch::nn::utils::clip_grad_norm_(a, inf);
  const auto got = lamp::optim::clip_grad_norm_(b, inf);
  EXPECT_NEAR(got.item<double>(), expected, 1e-6 * expected);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(BitEqual(b[i].grad(), a[i].grad())) << i;
  }
}

// A rank without gradients still joins the sharded clip's reduction, with
// a one-element FP32 zero on its parameters' device (where the process
// group wants it), and clips nothing.
void expect_empty_rank_reduces_on(const torch::Device& device) {
  const auto p =
      torch::zeros({3}, torch::TensorOptions().device(device)).requires_grad_();
  torch::Tensor seen;
  const auto norm =
      lamp::optim::clip_grad_norm_({p}, 1.0, [&](torch::Tensor& square_sum) {
        seen = square_sum.clone();
        square_sum.fill_(16.0f); // the other ranks' squares
      });
  ASSERT_TRUE(seen.defined());
  EXPECT_EQ(seen.device(), device);
  EXPECT_EQ(seen.scalar_type(), torch::kFloat);
  EXPECT_EQ(seen.numel(), 1);
  EXPECT_EQ(seen.cpu().item<float>(), 0.0f);
  EXPECT_EQ(norm.cpu().item<float>(), 4.0f);
}

TEST(Optim, ShardedClipOnARankWithoutGradients) {
  expect_empty_rank_reduces_on(torch::kCPU);
}

TEST(Optim, ShardedClipOnARankWithoutGradients_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  expect_empty_rank_reduces_on(torch::Device(torch::kCUDA, 0));
}

// A sparse gradient (an Embedding's with sparse(true)) takes torch::optim's
// own step under kAuto, on every device, as Python's foreach SGD falls back
// for it; kForEach refuses it naming kPerTensor.
void expect_sparse_sgd_steps_on(const torch::Device& device) {
  const auto options = torch::TensorOptions().device(device);
  torch::manual_seed(21);
  const auto init = torch::randn({6, 3}, options);
  const auto ids = torch::tensor({1, 4, 1}, options.dtype(torch::kLong));
  auto lamp_weight = init.clone().requires_grad_();
  auto torch_weight = init.clone().requires_grad_();
  const auto sgd_options = torch::optim::SGDOptions(0.1).momentum(0.9);
  lamp::optim::SGD sgd({lamp_weight}, sgd_options);
  torch::optim::SGD reference({torch_weight}, sgd_options);
  for (int step = 0; step < 2; ++step) {
    for (auto* w : {&lamp_weight, &torch_weight}) {
      w->mutable_grad() = torch::Tensor();
      torch::embedding(*w, ids, -1, false, /*sparse=*/true).sum().backward();
      ASSERT_TRUE(w->grad().is_sparse());
    }
    EXPECT_EQ(sgd.implementation(), Implementation::kPerTensor);
    sgd.step();
    reference.step();
  }
  EXPECT_TRUE(BitEqual(lamp_weight, torch_weight));
  lamp::optim::SGD foreach ({lamp_weight}, sgd_options,
                            Implementation::kForEach);
  const auto message = lamp_test::error_of([&] {
    foreach
      .step();
  });
  EXPECT_NE(message.find("Implementation::kPerTensor"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("SparseAdam"), std::string::npos) << message;
}

TEST(Optim, SparseGradientsTakeThePerTensorStep) {
  expect_sparse_sgd_steps_on(torch::kCPU);
}

TEST(Optim, SparseGradientsTakeThePerTensorStep_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  expect_sparse_sgd_steps_on(torch::Device(torch::kCUDA, 0));
}

// The sync-free path (the fused optimizer unscales and skips on the device)
// and the synchronous one (unscale, read the flag, step) give the same
// weights, scales and counts, bit for bit, through overflows and growth.
TEST(Optim, SyncFreeScalerEqualsTheSynchronousPath) {
  LAMP_SKIP_WITHOUT_FUSED();
  for (const std::string name : {"sgd", "adam", "adamw"}) {
    std::vector<std::vector<torch::Tensor>> finals;
    std::vector<std::vector<double>> scales;
    std::vector<int64_t> skipped;
    for (bool sync_free : {true, false}) {
      auto params = make_params();
      auto optimizer = lamp::optim::make_optimizer(
          params, lamp::optim::OptimizerOptions().name(name).lr(0.01));
      lamp::GradScaler scaler(lamp::GradScalerOptions()
                                  .init_scale(1024)
                                  .growth_interval(3)
                                  .sync_free(sync_free));
      std::vector<double> seen;
      for (int i = 0; i < 20; ++i) {
        const auto scale = scaler.scale(torch::ones({}));
        set_grads(params, i);
        for (auto& p : params) {
          p.mutable_grad().mul_(scale);
          if (i % 7 == 3) {
            p.mutable_grad()[0] = std::numeric_limits<float>::infinity();
          }
        }
        if (i % 5 == 2) {
          scaler.unscale_(*optimizer); // e.g. before clipping
        }
        const auto found_inf = scaler.step_async(*optimizer);
        EXPECT_EQ(found_inf.item<float>(), i % 7 == 3 ? 1.0f : 0.0f)
            << name << i;
        scaler.update();
        seen.push_back(scaler.get_scale());
      }
      finals.push_back(params);
      scales.push_back(seen);
      skipped.push_back(scaler.steps_skipped());
      EXPECT_EQ(scaler.steps_taken() + scaler.steps_skipped(), 20);
      EXPECT_FALSE(scaler.last_step_skipped());
    }
    EXPECT_EQ(scales[0], scales[1]) << name;
    EXPECT_EQ(skipped[0], 3) << name; // i = 3, 10, 17
    EXPECT_EQ(skipped[1], 3) << name;
    for (size_t i = 0; i < finals[0].size(); ++i) {
      EXPECT_TRUE(BitEqual(finals[0][i], finals[1][i]))
          << name << " param " << i;
    }
  }
}

// TrainStep with a fused optimizer runs the sync-free path: the result's
// overflow flag is a tensor, the counts are exact, and the weights equal the
// per-tensor optimizer's to the fused tolerance.
TEST(Optim, TrainStepRunsTheSyncFreePathWithFusedOptimizers) {
  LAMP_SKIP_WITHOUT_FUSED();
  std::vector<std::vector<torch::Tensor>> weights;
  for (auto implementation :
       {Implementation::kFused, Implementation::kPerTensor}) {
    torch::manual_seed(3);
    lamp_test::SmallNet model;
    lamp::TrainStep step(
        model.ptr(),
        [&](std::vector<torch::Tensor> params) {
          return std::make_unique<lamp::optim::SGD>(
              std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9),
              implementation);
        },
        lamp::TrainStepOptions(lamp::Precision::kBF16)
            .force_loss_scaling(true)
            .max_grad_norm(1.0)
            .scaler(
                lamp::GradScalerOptions().init_scale(256).growth_interval(4)));
    EXPECT_EQ(
        dynamic_cast<lamp::optim::AmpStep&>(step.optimizer()).skips_on_device(),
        implementation == Implementation::kFused);
    const auto problem = lamp_test::make_problem(32, 4, 1);
    for (int i = 0; i < 10; ++i) {
      const auto result = step.step([&] {
        auto loss = torch::nn::functional::cross_entropy(
            model->forward(step.cast_input(problem.inputs)).to(torch::kFloat),
            problem.targets);
        return i == 6 ? loss * std::numeric_limits<float>::infinity() : loss;
      });
      ASSERT_TRUE(result.found_inf.defined());
      EXPECT_EQ(result.skipped(), i == 6);
    }
    EXPECT_EQ(step.scaler().steps_skipped(), 1);
    EXPECT_EQ(step.scaler().steps_taken(), 9);
    EXPECT_EQ(step.scaler().get_scale(),
              256.0); // grew at 4, backed off at 6, 7..9
    weights.push_back(step.master_weights()->master_params());
  }
  for (size_t i = 0; i < weights[0].size(); ++i) {
    EXPECT_TRUE(AllClose(weights[0][i], weights[1][i], 1e-5, 1e-6)) << i;
  }
}

// With device learning rates on (what the CUDA-graph mode sets), eager steps
// still follow the param groups' learning rate: TrainStep refreshes the
// device copies before each step.
TEST(Optim, DeviceLearningRatesFollowTheParamGroups) {
  LAMP_SKIP_WITHOUT_FUSED();
  std::vector<torch::Tensor> weights;
  for (bool device_lr : {true, false}) {
    torch::manual_seed(3);
    torch::nn::Linear model(4, 2);
    lamp::TrainStep step(
        model.ptr(),
        [](std::vector<torch::Tensor> params) {
          return std::make_unique<lamp::optim::SGD>(
              std::move(params), torch::optim::SGDOptions(0.1).momentum(0.9));
        },
        lamp::TrainStepOptions(lamp::Precision::kFP32));
    auto& optimizer = dynamic_cast<lamp::optim::SGD&>(step.optimizer());
    optimizer.set_device_lr(device_lr);
    for (int i = 0; i < 6; ++i) {
      optimizer.param_groups()[0].options().set_lr(0.1 / (i + 1));
      step.step([&] { return model(torch::ones({3, 4}) * i).pow(2).mean(); });
    }
    weights.push_back(model->weight.detach().clone());
  }
  EXPECT_TRUE(BitEqual(weights[0], weights[1]));
}

} // namespace

// No bias decay: the tensors of at most one dimension (biases, norms' weights
// and biases) go to a second param group without weight decay. With zero
// gradients only weight decay moves a tensor, so only the decayed one moves.
// The recipe's defaults live in OptimizerOptions alone (the trainer and the
// programs read them from there), and what torch::optim would refuse or
// silently misuse is refused with the option's name.
TEST(Optim, OptimizerOptionsHoldTheRecipeAndRefuseBadValues) {
  const lamp::optim::OptimizerOptions defaults;
  EXPECT_EQ(defaults.name(), "sgd");
  EXPECT_EQ(defaults.lr(), 0.1);
  EXPECT_EQ(defaults.momentum(), 0.9);
  EXPECT_TRUE(defaults.nesterov());
  EXPECT_EQ(defaults.weight_decay(), 5e-4);
  EXPECT_EQ(defaults.beta1(), 0.9); // Python's Adam
  EXPECT_EQ(defaults.beta2(), 0.999);
  auto params = make_params();
  // Nesterov without momentum: plain SGD, where torch::optim would throw.
  auto sgd = lamp::optim::make_optimizer(
      params, lamp::optim::OptimizerOptions().momentum(0.0));
  EXPECT_FALSE(
      static_cast<const torch::optim::SGDOptions&>(sgd->defaults()).nesterov());
  for (const double lr : {0.0, -1.0, std::nan("")}) {
    try {
      lamp::optim::make_optimizer(params,
                                  lamp::optim::OptimizerOptions().lr(lr));
      FAIL() << "accepted lr " << lr;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("OptimizerOptions::lr"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(lamp::optim::make_optimizer(
                   params, lamp::optim::OptimizerOptions().weight_decay(-1)),
               c10::Error);
  // Nothing to train, with or without the decay groups.
  for (const bool groups : {false, true}) {
    EXPECT_NE(lamp_test::error_of([&] {
                lamp::optim::make_optimizer(
                    {}, lamp::optim::OptimizerOptions().no_bias_decay(groups));
              }).find("the parameter list is empty"),
              std::string::npos)
        << groups;
  }
}

TEST(Optim, NoBiasDecayLeavesBiasesAndNormsUndecayed) {
  for (const std::string name : {"sgd", "adam", "adamw"}) {
    SCOPED_TRACE(name);
    auto weight = torch::ones({3, 2}).requires_grad_();
    auto bias = torch::ones({3}).requires_grad_();
    const auto config = lamp::optim::OptimizerOptions()
                            .name(name)
                            .lr(0.1)
                            .momentum(0.0)
                            .weight_decay(0.5)
                            .no_bias_decay(true);
    auto optimizer = lamp::optim::make_optimizer({bias, weight}, config);
    const auto& groups = optimizer->param_groups();
    ASSERT_EQ(groups.size(), 2u);
    ASSERT_EQ(groups[0].params().size(), 1u);
    EXPECT_TRUE(groups[0].params()[0].is_same(weight));
    ASSERT_EQ(groups[1].params().size(), 1u);
    EXPECT_TRUE(groups[1].params()[0].is_same(bias));
    weight.mutable_grad() = torch::zeros_like(weight);
    bias.mutable_grad() = torch::zeros_like(bias);
    optimizer->step();
    EXPECT_TRUE(weight.lt(1.0).all().item<bool>()) << weight;
    EXPECT_TRUE(torch::equal(bias, torch::ones({3}))) << bias;
    // Off, or with no decay at all: one group, as torch::optim.
    EXPECT_EQ(lamp::optim::make_optimizer(
                  {bias, weight},
                  lamp::optim::OptimizerOptions(config).no_bias_decay(false))
                  ->param_groups()
                  .size(),
              1u);
    EXPECT_EQ(lamp::optim::make_optimizer(
                  {bias, weight},
                  lamp::optim::OptimizerOptions(config).weight_decay(0.0))
                  ->param_groups()
                  .size(),
              1u);
  }
}

// OptimizerOptions' betas reach Adam and AdamW, in every implementation:
// 20 steps with betas (0.8, 0.95) equal torch::optim's with those betas, bit
// for bit per-tensor and foreach, to FusedFollowsTorchOptim's tolerance
// fused.
TEST(Optim, MakeOptimizerHandsAdamItsBetas) {
  const auto betas = std::make_tuple(0.8, 0.95);
  for (const std::string name : {"adam", "adamw"}) {
    std::vector<Implementation> implementations = {Implementation::kPerTensor,
                                                   Implementation::kForEach};
    if (fused_available()) {
      implementations.push_back(Implementation::kFused);
    }
    for (const auto implementation : implementations) {
      SCOPED_TRACE(name + " " + lamp::optim::to_string(implementation));
      auto expected = make_params();
      std::unique_ptr<torch::optim::Optimizer> reference;
      if (name == "adam") {
        reference = std::make_unique<torch::optim::Adam>(
            expected,
            torch::optim::AdamOptions(1e-2).betas(betas).weight_decay(1e-2));
      } else {
        reference = std::make_unique<torch::optim::AdamW>(
            expected,
            torch::optim::AdamWOptions(1e-2).betas(betas).weight_decay(1e-2));
      }
      auto got = make_params();
      auto optimizer =
          lamp::optim::make_optimizer(got, lamp::optim::OptimizerOptions()
                                               .name(name)
                                               .lr(1e-2)
                                               .beta1(0.8)
                                               .beta2(0.95)
                                               .weight_decay(1e-2)
                                               .implementation(implementation));
      for (int i = 0; i < 20; ++i) {
        set_grads(expected, i);
        reference->step();
        set_grads(got, i);
        optimizer->step();
      }
      for (size_t i = 0; i < got.size(); ++i) {
        if (implementation == Implementation::kFused) {
          EXPECT_TRUE(AllClose(got[i], expected[i], 1e-5, 1e-6)) << i;
        } else {
          EXPECT_TRUE(BitEqual(got[i], expected[i])) << i;
        }
      }
    }
  }
}

// A beta outside [0, 1) is refused by make_optimizer naming the option and
// its value, for every optimizer (SGD ignores betas, but a NaN is a mistake
// whichever optimizer runs).
TEST(Optim, MakeOptimizerRefusesBetasOutsideZeroToOne) {
  const auto params = make_params();
  for (const std::string name : {"sgd", "adam", "adamw"}) {
    for (const double beta : {-0.1, 1.0, std::nan("")}) {
      for (const bool first : {true, false}) {
        auto options = lamp::optim::OptimizerOptions().name(name);
        if (first) {
          options.beta1(beta);
        } else {
          options.beta2(beta);
        }
        std::ostringstream expected;
        expected << "OptimizerOptions::" << (first ? "beta1" : "beta2")
                 << " must be in [0, 1), got " << beta << ";";
        EXPECT_NE(lamp_test::error_of([&] {
                    lamp::optim::make_optimizer(params, options);
                  }).find(expected.str()),
                  std::string::npos)
            << name << " " << expected.str();
      }
    }
  }
}

// ------------------------------------------------ the weight-decay rule

namespace {

// Every kind of parameter the rule sorts: an embedding, a Linear's weight
// and bias, a norm's 1-D parameters and a norm's 2-D ones.
struct EveryKindImpl : torch::nn::Module {
  EveryKindImpl()
      : embed(register_module("embed", torch::nn::Embedding(5, 4))),
        fc(register_module("fc", torch::nn::Linear(4, 3))),
        norm(register_module(
            "norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})))),
        plane(register_module(
            "plane",
            torch::nn::LayerNorm(torch::nn::LayerNormOptions({2, 2})))) {}
  torch::nn::Embedding embed;
  torch::nn::Linear fc;
  torch::nn::LayerNorm norm, plane;
};
TORCH_MODULE(EveryKind);

// nanoGPT's layout in small: a token embedding, a norm, and the output head
// tied to the embedding and registered under its own name, as a C++ port of
// nanoGPT registers `lm_head.weight` (the same tensor as `wte.weight`).
struct TiedHeadImpl : torch::nn::Module {
  static constexpr int64_t kVocab = 7, kWidth = 4;
  TiedHeadImpl()
      : wte(register_module("wte", torch::nn::Embedding(kVocab, kWidth))),
        ln(register_module(
            "ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})))),
        lm_head(
            register_module("lm_head", std::make_shared<torch::nn::Module>())),
        head(lm_head->register_parameter("weight", wte->weight)) {}
  torch::Tensor forward(const torch::Tensor& tokens) {
    return torch::nn::functional::linear(ln(wte(tokens)), head);
  }
  torch::nn::Embedding wte;
  torch::nn::LayerNorm ln;
  std::shared_ptr<torch::nn::Module> lm_head;
  torch::Tensor head; // lm_head.weight: wte's weight
};
TORCH_MODULE(TiedHead);

} // namespace

// One rule: no_decay_names exempts what make_optimizer's no_bias_decay puts
// in its no-decay group (decays_by_shape), parameter for parameter, but for
// the documented difference: a norm's 2-D weight and bias, which
// no_decay_names exempts and no_bias_decay (which sees no modules) decays.
// Embeddings decay under both unless exempt_embeddings.
TEST(DecayGroups, NoDecayNamesAndNoBiasDecayApplyOneRule) {
  EveryKind model;
  const auto names = lamp::optim::no_decay_names(*model);
  EXPECT_EQ(names, (std::set<std::string>{"fc.bias", "norm.weight", "norm.bias",
                                          "plane.weight", "plane.bias"}));
  auto with_embeddings = names;
  with_embeddings.insert("embed.weight");
  EXPECT_EQ(
      lamp::optim::no_decay_names(
          *model, lamp::optim::DecayRuleOptions().exempt_embeddings(true)),
      with_embeddings);

  const auto named = lamp::unique_named_parameters(*model);
  auto optimizer = lamp::optim::make_optimizer(named.values(),
                                               lamp::optim::OptimizerOptions()
                                                   .name("adamw")
                                                   .weight_decay(0.1)
                                                   .no_bias_decay(true));
  const auto& groups = optimizer->param_groups();
  ASSERT_EQ(groups.size(), 2u);
  for (const auto& item : named) {
    SCOPED_TRACE(item.key());
    bool decayed = false;
    for (const auto& p : groups[0].params()) {
      decayed = decayed || p.is_same(item.value());
    }
    EXPECT_EQ(decayed, lamp::optim::decays_by_shape(item.value()));
    const bool norm_2d = item.key().rfind("plane.", 0) == 0;
    EXPECT_EQ(decayed, names.count(item.key()) == 0 || norm_2d);
  }
}

// A head tied to the embedding under its own name: no_decay_names names the
// tensor once, under the name a TrainStep hands its optimizer factory, so
// the documented recipe runs, and the tied tensor is in the decayed group
// (2-D) unless exempt_embeddings. A name that is no parameter given, a typo
// or the tie's second name, is still refused, naming it.
namespace {

// A TrainStep whose optimizer is GPT trainers' recipe: AdamW over
// decay_groups(p, exempt, defaults).
std::unique_ptr<lamp::TrainStep> decay_group_step(
    const std::shared_ptr<torch::nn::Module>& model,
    const std::set<std::string>& exempt,
    const torch::optim::AdamWOptions& defaults) {
  return std::make_unique<lamp::TrainStep>(
      model,
      [exempt, defaults](const lamp::NamedParameters& p) {
        return std::make_unique<lamp::optim::AdamW>(
            lamp::optim::decay_groups(p, exempt, defaults), defaults);
      },
      lamp::TrainStepOptions(lamp::Precision::kFP32));
}

} // namespace

TEST(DecayGroups, ATiedHeadUnderItsOwnNameRunsThroughATrainStep) {
  for (const bool exempt_embeddings : {false, true}) {
    SCOPED_TRACE(exempt_embeddings ? "embeddings exempt" : "embeddings decay");
    torch::manual_seed(5);
    TiedHead model;
    ASSERT_EQ(model->named_parameters().size(), 4u); // lm_head.weight too
    const auto exempt = lamp::optim::no_decay_names(
        *model,
        lamp::optim::DecayRuleOptions().exempt_embeddings(exempt_embeddings));
    std::set<std::string> expected = {"ln.weight", "ln.bias"};
    if (exempt_embeddings) {
      expected.insert("wte.weight");
    }
    EXPECT_EQ(exempt, expected);
    const auto defaults =
        torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).weight_decay(0.1);
    const auto train = decay_group_step(model.ptr(), exempt, defaults);
    auto& step = *train;
    // The decayed group comes first; with embeddings exempt it is empty and
    // left out.
    const auto& groups = step.optimizer().param_groups();
    const auto& tied = model->wte->weight;
    ASSERT_EQ(groups.size(), exempt_embeddings ? 1u : 2u);
    const auto& with_tied = groups[0];
    ASSERT_EQ(with_tied.params().size(), exempt_embeddings ? 3u : 1u);
    EXPECT_TRUE(with_tied.params()[0].is_same(tied));
    EXPECT_EQ(
        static_cast<const torch::optim::AdamWOptions&>(with_tied.options())
            .weight_decay(),
        exempt_embeddings ? 0.0 : 0.1);

    const auto before = tied.detach().clone();
    const auto tokens = torch::arange(6).remainder(TiedHeadImpl::kVocab);
    const auto result = step.step([&] {
      return torch::nn::functional::cross_entropy(model->forward(tokens),
                                                  (tokens + 1).remainder(7));
    });
    EXPECT_TRUE(std::isfinite(result.loss.item<double>()));
    EXPECT_FALSE(torch::equal(tied, before));

    // The model's own names, the tie's second one among them: each tensor
    // still goes to one group, once.
    const auto all_names =
        lamp::optim::decay_groups(model->named_parameters(), exempt, defaults);
    size_t count = 0;
    for (const auto& group : all_names) {
      count += group.params().size();
    }
    EXPECT_EQ(count, 3u);
  }
  TiedHead model;
  const auto defaults = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  for (const std::string name : {"wte.wieght", "lm_head.weight"}) {
    const auto error = lamp_test::error_of([&] {
      lamp::optim::decay_groups(lamp::unique_named_parameters(*model), {name},
                                defaults);
    });
    EXPECT_NE(error.find("'" + name + "' is not among the 3 parameters given"),
              std::string::npos)
        << error;
  }
}

// A model with frozen parameters (fine-tuning a part of it): the TrainStep
// hands the factory the trainable ones, and the recipe still runs, the
// frozen bias named by no group.
TEST(DecayGroups, FrozenParametersAreLeftOutOfTheNames) {
  torch::manual_seed(3);
  TiedHead model;
  model->ln->bias.set_requires_grad(false);
  const auto exempt = lamp::optim::no_decay_names(*model);
  EXPECT_EQ(exempt, (std::set<std::string>{"ln.weight"}));
  const auto defaults = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  const auto train = decay_group_step(model.ptr(), exempt, defaults);
  size_t count = 0;
  for (const auto& group : train->optimizer().param_groups()) {
    count += group.params().size();
  }
  EXPECT_EQ(count, 2u); // wte.weight (the tied head) and ln.weight
}

// LibTorch 2.15's add_param_group replaces each option of a group that equals
// the options class's constructor default by the optimizer's default (PyTorch
// issue 141884): weight_decay(0) and momentum(0) below would become 0.5 and
// 0.9 there. lamp's optimizers keep a group's options as given on every
// LibTorch, as 1.13 to 2.14 do; a group without options takes the defaults.
TEST(Optim, ParamGroupsKeepTheirExplicitOptionsOnEveryLibTorch) {
  auto groups_of = [](torch::Tensor w, torch::Tensor b,
                      std::unique_ptr<torch::optim::OptimizerOptions> nodecay) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{w});
    groups.emplace_back(std::vector<torch::Tensor>{b}, std::move(nodecay));
    return groups;
  };
  auto check = [](torch::optim::Optimizer& optimizer, torch::Tensor w,
                  torch::Tensor b) {
    ASSERT_EQ(optimizer.param_groups().size(), 2u);
    w.mutable_grad() = torch::zeros_like(w);
    b.mutable_grad() = torch::zeros_like(b);
    optimizer.step();
    // Zero gradients: only weight decay moves a parameter.
    EXPECT_TRUE(w.lt(1.0).all().item<bool>()) << w;
    EXPECT_TRUE(torch::equal(b, torch::ones({3}))) << b;
  };
  {
    SCOPED_TRACE("sgd");
    auto w = torch::ones({3, 2}).requires_grad_();
    auto b = torch::ones({3}).requires_grad_();
    const auto defaults =
        torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.5);
    lamp::optim::SGD sgd(
        groups_of(
            w, b,
            std::make_unique<torch::optim::SGDOptions>(
                torch::optim::SGDOptions(0.1).momentum(0.0).weight_decay(0.0))),
        defaults);
    const auto& own = static_cast<const torch::optim::SGDOptions&>(
        sgd.param_groups()[1].options());
    EXPECT_EQ(own.weight_decay(), 0.0);
    EXPECT_EQ(own.momentum(), 0.0);
    const auto& inherited = static_cast<const torch::optim::SGDOptions&>(
        sgd.param_groups()[0].options());
    EXPECT_EQ(inherited.weight_decay(), 0.5);
    EXPECT_EQ(inherited.momentum(), 0.9);
    check(sgd, w, b);
  }
  {
    SCOPED_TRACE("adam");
    auto w = torch::ones({3, 2}).requires_grad_();
    auto b = torch::ones({3}).requires_grad_();
    lamp::optim::Adam adam(
        groups_of(w, b,
                  std::make_unique<torch::optim::AdamOptions>(
                      torch::optim::AdamOptions(0.1).weight_decay(0.0))),
        torch::optim::AdamOptions(0.1).weight_decay(0.5));
    EXPECT_EQ(static_cast<const torch::optim::AdamOptions&>(
                  adam.param_groups()[1].options())
                  .weight_decay(),
              0.0);
    check(adam, w, b);
  }
  {
    SCOPED_TRACE("adamw");
    auto w = torch::ones({3, 2}).requires_grad_();
    auto b = torch::ones({3}).requires_grad_();
    lamp::optim::AdamW adamw(
        groups_of(w, b,
                  std::make_unique<torch::optim::AdamWOptions>(
                      torch::optim::AdamWOptions(0.1).weight_decay(0.0))),
        torch::optim::AdamWOptions(0.1).weight_decay(0.5));
    EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(
                  adamw.param_groups()[1].options())
                  .weight_decay(),
              0.0);
    check(adamw, w, b);
  }
}

// Every group's options are checked, at construction and at each step: a
// group holding another optimizer's options (the step would read SGD's as
// Adam's: undefined behaviour) and values no step can use were accepted,
// LibTorch checking only the defaults and only their signs.
TEST(Optim, EveryParamGroupsOptionsAreChecked) {
  using torch::optim::AdamOptions;
  using torch::optim::AdamWOptions;
  using torch::optim::OptimizerParamGroup;
  using torch::optim::SGDOptions;
  const auto w = torch::ones({3, 2}).requires_grad_();
  const auto b = torch::ones({3}).requires_grad_();
  // Group 0 takes the defaults; group 1 holds `options`.
  const auto groups = [&](std::unique_ptr<torch::optim::OptimizerOptions> o) {
    std::vector<OptimizerParamGroup> result;
    result.emplace_back(std::vector<torch::Tensor>{w});
    result.emplace_back(std::vector<torch::Tensor>{b}, std::move(o));
    return result;
  };
  const auto refused = [](const std::function<void()>& build,
                          const std::string& expected) {
    const auto message = lamp_test::error_of(build);
    EXPECT_NE(message.find(expected), std::string::npos)
        << "expected '" << expected << "' in: " << message;
  };
  refused(
      [&] {
        lamp::optim::Adam(groups(std::make_unique<SGDOptions>(0.1)),
                          AdamOptions(1e-3));
      },
      "lamp::optim::Adam: param group 1 holds another optimizer's options "
      "(or none); give it torch::optim::AdamOptions");
  refused(
      [&] {
        lamp::optim::AdamW(groups(std::make_unique<AdamOptions>(0.1)),
                           AdamWOptions(1e-3));
      },
      "give it torch::optim::AdamWOptions");
  refused(
      [&] {
        lamp::optim::SGD(groups(std::make_unique<AdamWOptions>(0.1)),
                         SGDOptions(0.1));
      },
      "give it torch::optim::SGDOptions");
  refused(
      [&] {
        lamp::optim::Adam(groups(std::make_unique<AdamOptions>(
                              AdamOptions(0.1).betas({1.5, 0.999}))),
                          AdamOptions(1e-3));
      },
      "param group 1's options betas[0] is 1.5; give one in [0, 1)");
  refused(
      [&] {
        lamp::optim::AdamW(
            groups(std::make_unique<AdamWOptions>(AdamWOptions(0.1).eps(-1))),
            AdamWOptions(1e-3));
      },
      "param group 1's options eps is -1; give a finite eps >= 0.");
  refused(
      [&] {
        lamp::optim::SGD(groups(std::make_unique<SGDOptions>(-0.5)),
                         SGDOptions(0.1));
      },
      "param group 1's options lr is -0.5; give a finite lr >= 0.");
  refused(
      [&] {
        lamp::optim::SGD(groups(std::make_unique<SGDOptions>(
                             SGDOptions(0.1).nesterov(true))),
                         SGDOptions(0.1).momentum(0.9));
      },
      "param group 1's options ask for Nesterov momentum with momentum 0 and "
      "dampening 0; Nesterov needs momentum > 0 and dampening 0.");
  // Values the defaults' own check lets through: one group, "its options".
  refused(
      [&] {
        lamp::optim::AdamW({w}, AdamWOptions(1e-3).weight_decay(INFINITY));
      },
      "lamp::optim::AdamW: its options weight_decay is inf; give a finite "
      "weight_decay >= 0.");
  refused([&] { lamp::optim::SGD({w}, SGDOptions(0.1).momentum(INFINITY)); },
          "its options momentum is inf");
  // At a step: a learning rate set to NaN since, a group added with
  // another optimizer's options; nothing is updated.
  w.mutable_grad() = torch::ones_like(w);
  b.mutable_grad() = torch::ones_like(b);
  lamp::optim::Adam adam({w}, AdamOptions(1e-3));
  adam.param_groups()[0].options().set_lr(std::nan(""));
  refused([&] { adam.step(); }, "lamp::optim::Adam: its options lr is nan");
  adam.param_groups()[0].options().set_lr(1e-3);
  // (Set anew: LibTorch 2.15's add_param_group merges an added group's
  // options into the optimizer's own options type.)
  adam.add_param_group(OptimizerParamGroup({b}));
  adam.param_groups()[1].set_options(std::make_unique<SGDOptions>(0.1));
  refused([&] { adam.step(); }, "param group 1 holds another optimizer's");
  EXPECT_TRUE(torch::equal(w, torch::ones({3, 2})));
  EXPECT_TRUE(torch::equal(b, torch::ones({3})));
  // OptimizerOptions: an infinite weight decay or momentum.
  for (const auto& options :
       {lamp::optim::OptimizerOptions().weight_decay(INFINITY),
        lamp::optim::OptimizerOptions().momentum(INFINITY)}) {
    refused([&] { lamp::optim::make_optimizer({w}, options); },
            "momentum and weight_decay must be finite and >= 0");
  }
}
