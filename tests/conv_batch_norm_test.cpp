// BatchNorm folded into the convolutions (lamp/ops/conv_batch_norm.h): the
// arithmetic the fused cuDNN graphs compute, against stock Conv2d +
// BatchNorm2d + ReLU (+ add) for every block shape of ResNet18 and
// ResNet50, forward and backward, training and eval, running statistics
// included.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace {

using lamp_test::error_of;

// |actual - expected| <= 1e-4 max|expected| + 1e-6 everywhere. Both sides
// are FP32 and compute the same quantities in another order: the folded
// variance is one pass (E[y^2] - E[y]^2) where BatchNorm's is two, its
// normalisation y scale + bias where BatchNorm's is (y - mean) inv_std
// weight + bias, and its backward sums dZ and dZ Y once per channel. Each
// differs by a few ulps per value; through a block's convolutions (sums of
// up to 2 x 32 x 32 x 9 terms) that stays near 1e-6 of the largest value.
// A wrong formula (a term of the backward left out, the biased variance in
// the running statistics, a scale applied twice) is off by 1e-2 or more.
::testing::AssertionResult Near(const torch::Tensor& actual,
                                const torch::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "sizes " << actual.sizes() << " vs " << expected.sizes();
  }
  const auto scale = expected.abs().max().item<double>();
  const auto error = (actual - expected).abs().max().item<double>();
  if (error <= 1e-4 * scale + 1e-6) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "max error " << error << " against a largest value of " << scale;
}

torch::nn::BatchNorm2d batch_norm_of(const torch::nn::Sequential& shortcut) {
  return torch::nn::BatchNorm2d(
      std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(shortcut->ptr(1)));
}

torch::nn::Conv2d conv_of(const torch::nn::Sequential& shortcut) {
  return torch::nn::Conv2d(
      std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(shortcut->ptr(0)));
}

// The residual of a block whose shortcut's BatchNorm folds too.
torch::Tensor folded_shortcut(const torch::nn::Sequential& shortcut,
                              const torch::Tensor& x) {
  if (shortcut.is_empty()) {
    return x;
  }
  return lamp::ops::folded_batch_norm(conv_of(shortcut)->forward(x),
                                      batch_norm_of(shortcut));
}

// A block through the folded arithmetic, as the fused graphs run it.
torch::Tensor folded_forward(lamp::models::BasicBlock& b,
                             const torch::Tensor& x) {
  auto out = lamp::ops::folded_batch_norm_relu(b->conv1->forward(x), b->bn1);
  return lamp::ops::folded_batch_norm_add_relu(
      b->conv2->forward(out), folded_shortcut(b->shortcut, x), b->bn2);
}

torch::Tensor folded_forward(lamp::models::Bottleneck& b,
                             const torch::Tensor& x) {
  auto out = lamp::ops::folded_batch_norm_relu(b->conv1->forward(x), b->bn1);
  out = lamp::ops::folded_batch_norm_relu(b->conv2->forward(out), b->bn2);
  return lamp::ops::folded_batch_norm_add_relu(
      b->conv3->forward(out), folded_shortcut(b->shortcut, x), b->bn3);
}

// Two identical blocks (stock BatchNorm, no cuDNN fusion): one runs its own
// forward, the other the folded arithmetic; two training steps' outputs,
// input and parameter gradients and running statistics, then eval mode's
// output and gradients, must agree.
template <typename Block>
void expect_folded_equals_stock(int64_t in_planes, int64_t planes,
                                int64_t stride, int64_t side) {
  SCOPED_TRACE("in " + std::to_string(in_planes) + ", planes " +
               std::to_string(planes) + ", stride " + std::to_string(stride) +
               ", " + std::to_string(side) + "x" + std::to_string(side));
  torch::manual_seed(7);
  Block stock(in_planes, planes, stride, /*fused_batch_norm=*/false);
  torch::manual_seed(7);
  Block folded(in_planes, planes, stride, /*fused_batch_norm=*/false);
  for (int pass = 0; pass < 3; ++pass) {
    const bool training = pass < 2;
    SCOPED_TRACE(training ? "training step " + std::to_string(pass)
                          : std::string("eval"));
    stock->train(training);
    folded->train(training);
    torch::manual_seed(100 + pass);
    // A mean away from 0, so that the one-pass variance is exercised.
    const auto x = torch::randn({2, in_planes, side, side}) + 0.5;
    const auto xs = x.clone().requires_grad_();
    const auto xf = x.clone().requires_grad_();
    const auto ys = stock->forward(xs);
    const auto yf = folded_forward(folded, xf);
    ASSERT_TRUE(Near(yf, ys));
    const auto probe = torch::randn(ys.sizes());
    (ys * probe).sum().backward();
    (yf * probe).sum().backward();
    EXPECT_TRUE(Near(xf.grad(), xs.grad())) << "the input's gradient";
    const auto ps = stock->named_parameters();
    const auto pf = folded->named_parameters();
    for (const auto& p : ps) {
      EXPECT_TRUE(Near(pf[p.key()].grad(), p.value().grad())) << p.key();
    }
    const auto bs = stock->named_buffers();
    const auto bf = folded->named_buffers();
    for (const auto& b : bs) {
      if (b.value().is_floating_point()) {
        EXPECT_TRUE(Near(bf[b.key()], b.value())) << b.key();
      } else {
        EXPECT_TRUE(torch::equal(bf[b.key()], b.value())) << b.key();
      }
    }
    stock->zero_grad();
    folded->zero_grad();
  }
}

TEST(ConvBatchNorm, EveryResNet18BlockShapeEqualsTheStockOps) {
  // CIFAR ResNet18: (in, planes, stride) of every stage's blocks, at the
  // stage's resolution.
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> shapes = {
      {64, 64, 1, 32},  {64, 128, 2, 32}, {128, 128, 1, 16}, {128, 256, 2, 16},
      {256, 256, 1, 8}, {256, 512, 2, 8}, {512, 512, 1, 4}};
  for (const auto& [in, planes, stride, side] : shapes) {
    expect_folded_equals_stock<lamp::models::BasicBlock>(in, planes, stride,
                                                         side);
  }
}

TEST(ConvBatchNorm, EveryResNet50BlockShapeEqualsTheStockOps) {
  // CIFAR ResNet50's bottlenecks: the first of each stage changes the
  // channels (a shortcut convolution), the others keep them.
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> shapes = {
      {64, 64, 1, 32},   {256, 64, 1, 32},  {256, 128, 2, 32},
      {512, 128, 1, 16}, {512, 256, 2, 16}, {1024, 256, 1, 8},
      {1024, 512, 2, 8}, {2048, 512, 1, 4}};
  for (const auto& [in, planes, stride, side] : shapes) {
    expect_folded_equals_stock<lamp::models::Bottleneck>(in, planes, stride,
                                                         side);
  }
}

// The finalize step against BatchNorm2d's own forward: the batch's mean and
// biased variance normalise, the running statistics take the unbiased one
// with the momentum, or the cumulative average when the momentum is unset.
TEST(ConvBatchNorm, FinalizeFollowsBatchNormsStatistics) {
  torch::manual_seed(3);
  for (const bool cumulative : {false, true}) {
    SCOPED_TRACE(cumulative ? "cumulative average" : "momentum 0.1");
    auto options = torch::nn::BatchNorm2dOptions(5);
    if (cumulative) {
      options.momentum(c10::nullopt);
    }
    torch::nn::BatchNorm2d stock(options), folded(options);
    torch::NoGradGuard no_grad;
    stock->weight.uniform_(0.5, 1.5);
    stock->bias.uniform_(-0.5, 0.5);
    folded->weight.copy_(stock->weight);
    folded->bias.copy_(stock->bias);
    for (int step = 0; step < 3; ++step) {
      const auto y = torch::randn({3, 5, 4, 6}) * (step + 1) + step;
      const auto expected = stock->forward(y);
      const auto got = lamp::ops::folded_batch_norm(y, folded);
      EXPECT_TRUE(Near(got, expected)) << "step " << step;
      EXPECT_TRUE(Near(folded->running_mean, stock->running_mean));
      EXPECT_TRUE(Near(folded->running_var, stock->running_var));
      EXPECT_EQ(folded->num_batches_tracked.item<int64_t>(), step + 1);
    }
    // The pieces: sums, count, fold.
    const auto y = torch::randn({2, 5, 3, 3});
    const auto stats = lamp::ops::channel_statistics(y);
    EXPECT_EQ(stats.count, 18);
    EXPECT_TRUE(Near(stats.sum, y.sum({0, 2, 3})));
    EXPECT_TRUE(Near(stats.sum_of_squares, (y * y).sum({0, 2, 3})));
    const auto f = lamp::ops::finalize_batch_norm(stats, stock->weight,
                                                  stock->bias, torch::Tensor(),
                                                  torch::Tensor(), 0.1, 1e-5);
    const auto var = y.var({0, 2, 3}, /*unbiased=*/false);
    EXPECT_TRUE(Near(f.mean, y.mean({0, 2, 3})));
    EXPECT_TRUE(Near(f.inv_std, (var + 1e-5).rsqrt()));
    EXPECT_TRUE(Near(f.scale, stock->weight * f.inv_std));
    EXPECT_TRUE(Near(f.bias, stock->bias - f.mean * f.scale));
    EXPECT_TRUE(
        Near(lamp::ops::scale_bias_relu(y, f),
             torch::relu(torch::batch_norm(y, stock->weight, stock->bias, {},
                                           {}, true, 0.1, 1e-5, false))));
  }
}

// The backward's coefficients against autograd through BatchNorm's formula:
// dY = A dZ + B Y + C, d_weight and d_bias.
TEST(ConvBatchNorm, BackwardCoefficientsAreBatchNormsGradient) {
  torch::manual_seed(4);
  const auto y = (torch::randn({4, 3, 5, 5}) + 1).requires_grad_();
  const auto weight = torch::rand({3}).add_(0.5).requires_grad_();
  const auto bias = torch::randn({3}).requires_grad_();
  const auto z =
      torch::batch_norm(y, weight, bias, {}, {}, true, 0.1, 1e-5, false);
  const auto dz = torch::randn(z.sizes());
  const auto grads = torch::autograd::grad({z}, {y, weight, bias}, {dz});
  torch::NoGradGuard no_grad;
  const auto f = lamp::ops::finalize_batch_norm(
      lamp::ops::channel_statistics(y), weight, bias, torch::Tensor(),
      torch::Tensor(), 0.1, 1e-5);
  const auto back = lamp::ops::batch_norm_backward(y, dz, f);
  EXPECT_TRUE(
      Near(lamp::ops::apply_batch_norm_backward(y, dz, back), grads[0]));
  EXPECT_TRUE(Near(back.grad_weight, grads[1]));
  EXPECT_TRUE(Near(back.grad_bias, grads[2]));
  EXPECT_TRUE(Near(back.a, f.scale));
}

// 16-bit activations: the arithmetic in FP32, the result in the input's
// type, within that type's rounding of the FP32 result.
TEST(ConvBatchNorm, SixteenBitActivationsRoundOnceFromFp32) {
  torch::manual_seed(5);
  torch::nn::BatchNorm2d bn(6), reference(6);
  const auto y = torch::randn({2, 6, 4, 4});
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    const auto got = lamp::ops::folded_batch_norm_relu(y.to(dtype), bn);
    EXPECT_EQ(got.scalar_type(), dtype);
    const auto expected =
        torch::relu(reference->forward(y.to(dtype).to(torch::kFloat)));
    // One rounding to the 16-bit type: half an ulp, 2^-11 (FP16) or 2^-8
    // (BF16) relative, of values below 4.
    const double ulp = dtype == torch::kHalf ? 1.0 / 1024 : 1.0 / 128;
    EXPECT_LE((got.to(torch::kFloat) - expected).abs().max().item<double>(),
              4 * ulp);
  }
}

TEST(ConvBatchNorm, BadInputIsNamed) {
  torch::nn::BatchNorm2d bn(4);
  EXPECT_NE(error_of([&] {
              lamp::ops::folded_batch_norm(torch::randn({2, 3, 2, 2}), bn);
            }).find("3 channels but the BatchNorm normalises 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              lamp::ops::folded_batch_norm(torch::randn({1, 4, 1, 1}), bn);
            }).find("more than one value per channel"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              lamp::ops::channel_statistics(torch::randn({4, 4}));
            }).find("[N, C, H, W]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              lamp::ops::folded_batch_norm_add_relu(
                  torch::randn({2, 4, 2, 2}), torch::randn({2, 4, 1, 1}), bn);
            }).find("the residual must have the output's shape"),
            std::string::npos);
  torch::nn::BatchNorm2d plain(torch::nn::BatchNorm2dOptions(4).affine(false));
  EXPECT_NE(error_of([&] {
              lamp::ops::folded_batch_norm(torch::randn({2, 4, 2, 2}), plain);
            }).find("must be affine"),
            std::string::npos);
}

} // namespace
