// lamp's custom autograd Functions give first derivatives only: each
// refuses a backward that builds a graph for higher-order gradients
// (create_graph=true), naming itself and what gives them, instead of
// returning second derivatives that would miss terms. The weight casts'
// node, whose cast back is linear, differentiates again as autocast's own
// casts do.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lamp/amp/autocast.h"
#include "lamp/nn/float8.h"
#include "lamp/nn/linear.h"
#include "lamp/nn/weight_cast.h"
#include "lamp/ops/add_norm.h"
#include "lamp/ops/conv_batch_norm.h"
#include "lamp/ops/gelu_mlp.h"
#include "lamp/ops/linear_bgrad.h"
#include "lamp/ops/linear_cross_entropy.h"
#include "platform/compat.h"
#include "test_util.h"

namespace {

using lamp_test::BitEqual;

torch::Tensor leaf(std::vector<int64_t> shape) {
  return torch::randn(shape).requires_grad_(true);
}

// A first-order pass of `out` succeeds; one with create_graph=true throws
// "<who> is differentiable once", saying what gives them instead.
void expect_differentiable_once(const torch::Tensor& out,
                                const std::vector<torch::Tensor>& leaves,
                                const std::string& who,
                                const std::string& instead) {
  SCOPED_TRACE(who);
  const auto loss = out.to(torch::kFloat).square().sum();
  const auto first = torch::autograd::grad({loss}, leaves, {},
                                           /*retain_graph=*/true,
                                           /*create_graph=*/false);
  ASSERT_EQ(first.size(), leaves.size());
  const auto message = lamp_test::error_of([&] {
    torch::autograd::grad({loss}, leaves, {}, /*retain_graph=*/true,
                          /*create_graph=*/true);
  });
  EXPECT_NE(message.find(who + " is differentiable once"), std::string::npos)
      << message;
  EXPECT_NE(message.find("create_graph=true"), std::string::npos) << message;
  EXPECT_NE(message.find(instead), std::string::npos) << message;
}

TEST(DifferentiableOnce, TheFusedTransformerOps) {
  torch::manual_seed(1);
  const auto x = leaf({4, 8}), w = leaf({16, 8}), b = leaf({16});
  expect_differentiable_once(lamp::ops::linear_bgrad(x, w, b), {x, w, b},
                             "lamp::ops::linear_bgrad",
                             "torch::linear gives them");
  const auto w2 = leaf({8, 16}), b2 = leaf({8});
  expect_differentiable_once(lamp::ops::gelu_mlp(x, w, b, w2, b2), {x, w, w2},
                             "lamp::ops::gelu_mlp", "gelu_mlp_reference");
  const auto branch = leaf({4, 8}), g = leaf({8}), beta = leaf({8});
  expect_differentiable_once(
      lamp::ops::add_layer_norm(x, branch, g, beta).normed, {x, branch, g},
      "lamp::ops::add_layer_norm", "add_layer_norm_reference");
  expect_differentiable_once(lamp::ops::add_rms_norm(x, branch, g).normed,
                             {x, g}, "lamp::ops::add_rms_norm",
                             "add_rms_norm_reference");
  const auto targets = torch::randint(10, {4}, torch::kLong);
  const auto head = leaf({10, 8});
  expect_differentiable_once(lamp::ops::linear_cross_entropy(x, head, targets),
                             {x, head}, "lamp::ops::linear_cross_entropy",
                             "linear_cross_entropy_reference");
}

TEST(DifferentiableOnce, TheFoldedBatchNorm) {
  torch::manual_seed(2);
  const auto x = leaf({2, 3, 6, 6});
  torch::nn::BatchNorm2d bn(3);
  expect_differentiable_once(lamp::ops::folded_batch_norm(x, bn),
                             {x, bn->weight}, "lamp::ops::folded_batch_norm",
                             "--fused-bn on or off");
  const auto weight = leaf({4, 3, 3, 3});
  expect_differentiable_once(
      lamp::ops::folded_conv(x, weight, 1, 1, {}, {}).output, {x, weight},
      "lamp::ops::folded_conv", "--fused-bn on or off");
  lamp::ops::ConvBatchNormLayer layer{
      torch::nn::Conv2d(
          torch::nn::Conv2dOptions(3, 3, 3).padding(1).bias(false)),
      torch::nn::BatchNorm2d(3), "conv1"};
  expect_differentiable_once(
      lamp::ops::folded_residual_block(x, {layer}), {x, layer.conv->weight},
      "lamp::ops::folded_residual_block", "--fused-bn on or off");
}

TEST(DifferentiableOnce, AnFP8Linear) {
#if !LAMP_TORCH_FLOAT8
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no FP8 dtypes";
#else
  torch::manual_seed(3);
  auto layer = torch::nn::Linear(16, 32);
  lamp::nn::convert_to_float8(*layer);
  const auto x = leaf({4, 16});
  expect_differentiable_once(lamp::nn::linear(x, layer), {x, layer->weight},
                             "An FP8 Linear (lamp::nn::float8_linear)",
                             "Leave the layer out of convert_to_float8()");
#endif
}

TEST(DifferentiableOnce, TheWeightCastsDifferentiateAgainAsAutocasts) {
  // A gradient penalty through CastWeightsOnce's casts: the second
  // derivatives of autocast's own casts, bit for bit.
  torch::manual_seed(4);
  auto first = torch::nn::Linear(6, 12);
  auto second = torch::nn::Linear(12, 3);
  torch::nn::Sequential model(first, second);
  const auto x = torch::randn({5, 6});
  const auto penalty = [&](bool guard) {
    model->zero_grad(/*set_to_none=*/true);
    lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
    std::optional<lamp::nn::CastWeightsOnce> casts;
    if (guard) {
      casts.emplace(*model);
    }
    const auto y =
        lamp::nn::linear(torch::tanh(lamp::nn::linear(x, first)), second);
    casts.reset();
    const auto loss = y.to(torch::kFloat).square().sum();
    const auto g = torch::autograd::grad({loss}, {first->weight}, {},
                                         /*retain_graph=*/true,
                                         /*create_graph=*/true)[0];
    g.square().sum().backward();
    return std::vector<torch::Tensor>{g.detach(), first->weight.grad(),
                                      second->weight.grad()};
  };
  const auto want = penalty(false);
  const auto got = penalty(true);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << i;
    EXPECT_EQ(got[i].scalar_type(), torch::kFloat) << i;
    EXPECT_TRUE(BitEqual(got[i], want[i])) << i;
  }
}

} // namespace
