// BatchNorm folded into the convolutions (lamp/ops/conv_batch_norm.h): the
// arithmetic the fused cuDNN graphs compute, against stock Conv2d +
// BatchNorm2d + ReLU (+ add) for every block shape of ResNet18 and
// ResNet50, forward and backward, training and eval, running statistics
// included.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "autograd_nodes.h"
#include "ops/conv_batch_norm_cudnn.h"
#include "test_util.h"
#include "ulps.h"

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

// How the folded side of a comparison runs a block.
enum class Path {
  // folded_batch_norm(_relu, _add_relu) after the stock convolutions.
  kArithmetic,
  // The block's forward_folded(): lamp::ops::folded_residual_block with
  // folded_conv(), the autograd structure the GPU's graphs run in, on its
  // ATen reference.
  kBlock,
};

// Two identical blocks (stock BatchNorm, no cuDNN fusion): one runs its own
// forward, the other the folded arithmetic; two training steps' outputs,
// input and parameter gradients and running statistics, then eval mode's
// output and gradients, must agree.
template <typename Block>
void expect_folded_equals_stock(int64_t in_planes, int64_t planes,
                                int64_t stride, int64_t side, Path path) {
  SCOPED_TRACE("in " + std::to_string(in_planes) + ", planes " +
               std::to_string(planes) + ", stride " + std::to_string(stride) +
               ", " + std::to_string(side) + "x" + std::to_string(side) +
               (path == Path::kBlock ? ", folded_residual_block"
                                     : ", folded_batch_norm"));
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
    const auto yf =
        path == Path::kBlock
            ? folded->forward_folded(xf, lamp::ops::FoldedBackend::kReference)
            : folded_forward(folded, xf);
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
    for (const auto path : {Path::kArithmetic, Path::kBlock}) {
      expect_folded_equals_stock<lamp::models::BasicBlock>(in, planes, stride,
                                                           side, path);
    }
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
    for (const auto path : {Path::kArithmetic, Path::kBlock}) {
      expect_folded_equals_stock<lamp::models::Bottleneck>(in, planes, stride,
                                                           side, path);
    }
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
  // The functional steps: a one-value scale broadcast to every channel, a
  // gradient broadcast to the output's shape, statistics of another width
  // were taken without a word (or with a bare broadcasting error).
  const auto y = torch::randn({2, 4, 3, 3});
  const auto stats = lamp::ops::channel_statistics(y);
  const auto folded = lamp::ops::finalize_batch_norm(
      stats, bn->weight, bn->bias, {}, {}, 0.1, 1e-5);
  auto one_scale = folded;
  one_scale.scale = torch::ones({1});
  const auto refused = [](const std::function<void()>& call,
                          const std::string& expected) {
    const auto message = error_of(call);
    EXPECT_NE(message.find(expected), std::string::npos)
        << "expected '" << expected << "' in: " << message;
  };
  refused([&] { lamp::ops::scale_bias_relu(y, one_scale); },
          "lamp::ops::scale_bias_relu: the folded scale must be [4] (one "
          "value per channel), got [1].");
  refused([&] { lamp::ops::scale_bias_add_relu(y, one_scale, y); },
          "scale_bias_add_relu: the folded scale must be [4]");
  refused([&] { lamp::ops::batch_norm_backward(y, y, one_scale); },
          "batch_norm_backward: the folded scale must be [4]");
  const auto back = lamp::ops::batch_norm_backward(y, y, folded);
  refused(
      [&] { lamp::ops::apply_batch_norm_backward(y, y.narrow(3, 0, 1), back); },
      "apply_batch_norm_backward: the gradient [2, 4, 3, 1] must have the "
      "output's shape [2, 4, 3, 3].");
  auto short_back = back;
  short_back.c = back.c.narrow(0, 0, 2);
  refused([&] { lamp::ops::apply_batch_norm_backward(y, y, short_back); },
          "the backward's c must be [4]");
  auto narrow = stats;
  narrow.sum_of_squares = stats.sum_of_squares.narrow(0, 0, 3);
  refused(
      [&] {
        lamp::ops::finalize_batch_norm(narrow, bn->weight, bn->bias, {}, {},
                                       0.1, 1e-5);
      },
      "finalize_batch_norm: the statistics' sum_of_squares must be [4]");
  refused(
      [&] {
        lamp::ops::finalize_batch_norm(stats, torch::ones({3}), bn->bias, {},
                                       {}, 0.1, 1e-5);
      },
      "finalize_batch_norm: the weight must be [4]");
  refused(
      [&] {
        lamp::ops::fold_running_batch_norm(
            bn->weight, bn->bias, bn->running_mean, torch::ones({5}), 1e-5);
      },
      "fold_running_batch_norm: the running variance must be [4]");
}

// One side of a folded_conv() comparison: fresh leaves (x, weight and, with
// a prologue, scale and bias) and what `run` made of them.
struct ConvSide {
  std::vector<torch::Tensor> leaves;
  lamp::ops::FoldedConv got;
};

ConvSide conv_side(const torch::Tensor& x, const torch::Tensor& w,
                   const torch::Tensor& s, const torch::Tensor& b,
                   const std::function<lamp::ops::FoldedConv(
                       const torch::Tensor&, const torch::Tensor&,
                       const torch::Tensor&, const torch::Tensor&)>& run) {
  ConvSide side;
  side.leaves = {x.clone().requires_grad_(), w.clone().requires_grad_()};
  if (s.defined()) {
    side.leaves.push_back(s.clone().requires_grad_());
    side.leaves.push_back(b.clone().requires_grad_());
  }
  const auto& l = side.leaves;
  side.got = run(l[0], l[1], s.defined() ? l[2] : torch::Tensor(),
                 s.defined() ? l[3] : torch::Tensor());
  return side;
}

// The plain composition folded_conv() stands for: conv(relu(scale x +
// bias)) and its output's sums, differentiated by autograd.
lamp::ops::FoldedConv composed_conv(const torch::Tensor& x,
                                    const torch::Tensor& w, int64_t stride,
                                    int64_t padding, const torch::Tensor& s,
                                    const torch::Tensor& b) {
  const auto a =
      s.defined()
          ? torch::relu(x * s.view({1, -1, 1, 1}) + b.view({1, -1, 1, 1}))
          : x;
  lamp::ops::FoldedConv out;
  out.output = torch::conv2d(a, w, {}, stride, padding);
  out.sum = out.output.sum({0, 2, 3});
  out.sum_of_squares = (out.output * out.output).sum({0, 2, 3});
  return out;
}

// folded_conv()'s forward and every gradient (through the output and both
// sums) against autograd's of the composition, with and without the
// prologue, for 3x3 and 1x1 convolutions at strides 1 and 2.
TEST(ConvBatchNorm, FoldedConvEqualsTheComposition) {
  for (const bool prologue : {false, true}) {
    for (const auto& [kernel, stride] :
         std::vector<std::pair<int64_t, int64_t>>{
             {3, 1}, {3, 2}, {1, 1}, {1, 2}}) {
      SCOPED_TRACE(std::string(prologue ? "prologue, " : "") + "kernel " +
                   std::to_string(kernel) + ", stride " +
                   std::to_string(stride));
      torch::manual_seed(11);
      const int64_t padding = kernel / 2;
      const auto x = torch::randn({2, 6, 9, 9}) + 0.3;
      const auto w = torch::randn({5, 6, kernel, kernel}) * 0.3;
      const auto s = prologue ? torch::rand({6}) + 0.5 : torch::Tensor();
      const auto b = prologue ? torch::randn({6}) * 0.5 : torch::Tensor();
      const ConvSide sides[2] = {
          conv_side(x, w, s, b,
                    [&](const auto& xl, const auto& wl, const auto& sl,
                        const auto& bl) {
                      return composed_conv(xl, wl, stride, padding, sl, bl);
                    }),
          conv_side(x, w, s, b,
                    [&](const auto& xl, const auto& wl, const auto& sl,
                        const auto& bl) {
                      return lamp::ops::folded_conv(
                          xl, wl, stride, padding, sl, bl, "test.conv",
                          lamp::ops::FoldedBackend::kReference);
                    })};
      const lamp::ops::FoldedConv got[2] = {sides[0].got, sides[1].got};
      ASSERT_TRUE(Near(got[1].output, got[0].output));
      EXPECT_TRUE(Near(got[1].sum, got[0].sum));
      EXPECT_TRUE(Near(got[1].sum_of_squares, got[0].sum_of_squares));
      torch::manual_seed(12);
      const auto py = torch::randn(got[0].output.sizes());
      const auto ps = torch::randn({5});
      const auto pq = torch::randn({5}) * 0.01;
      for (int side = 0; side < 2; ++side) {
        ((got[side].output * py).sum() + (got[side].sum * ps).sum() +
         (got[side].sum_of_squares * pq).sum())
            .backward();
      }
      const char* names[] = {"x", "weight", "scale", "bias"};
      for (size_t i = 0; i < sides[0].leaves.size(); ++i) {
        EXPECT_TRUE(Near(sides[1].leaves[i].grad(), sides[0].leaves[i].grad()))
            << names[i] << "'s gradient";
      }
    }
  }
}

// folded_conv() computes in x's dtype under autocast too: an FP32 x gives
// what it gives outside autocast, forward and backward, bit for bit (an
// autocast conv inside made a BF16 output whose backward the FP32 x and
// weight refused).
TEST(ConvBatchNorm, FoldedConvUnderAutocastComputesInXsDtype) {
  for (const bool prologue : {false, true}) {
    SCOPED_TRACE(prologue ? "prologue" : "no prologue");
    torch::manual_seed(14);
    const auto x0 = torch::randn({2, 4, 5, 5});
    const auto w0 = torch::randn({3, 4, 3, 3}) * 0.3;
    const auto s = prologue ? torch::rand({4}) + 0.5 : torch::Tensor();
    const auto b = prologue ? torch::randn({4}) * 0.5 : torch::Tensor();
    torch::Tensor outputs[2], grads[2][2];
    for (int autocast = 0; autocast < 2; ++autocast) {
      const auto x = x0.clone().requires_grad_();
      const auto w = w0.clone().requires_grad_();
      c10::optional<lamp::Autocast> guard;
      if (autocast == 1) {
        guard.emplace(torch::kCPU, torch::kBFloat16);
      }
      const auto c =
          lamp::ops::folded_conv(x, w, 1, 1, s, b, "autocast.conv",
                                 lamp::ops::FoldedBackend::kReference);
      ASSERT_EQ(c.output.scalar_type(), torch::kFloat);
      (c.output.sum() + c.sum_of_squares.sum() * 0.01).backward();
      outputs[autocast] = c.output;
      grads[autocast][0] = x.grad();
      grads[autocast][1] = w.grad();
    }
    EXPECT_TRUE(lamp_test::BitEqual(outputs[1], outputs[0]));
    EXPECT_TRUE(lamp_test::BitEqual(grads[1][0], grads[0][0]));
    EXPECT_TRUE(lamp_test::BitEqual(grads[1][1], grads[0][1]));
  }
}

// On the CPU, kAuto is the reference: no graph is tried, so no layer is
// reported as refused, and the reason names why.
TEST(ConvBatchNorm, FoldedConvOnTheCpuRunsTheReference) {
  torch::manual_seed(13);
  const auto x = torch::randn({2, 4, 5, 5});
  const auto w = torch::randn({3, 4, 3, 3});
  const auto before = lamp::ops::folded_conv_fallbacks().size();
  EXPECT_FALSE(lamp::ops::folded_conv_fallback_reason(x).empty());
  const auto a = lamp::ops::folded_conv(x, w, 1, 1, {}, {}, "cpu.conv");
  const auto b = lamp::ops::folded_conv(x, w, 1, 1, {}, {}, "cpu.conv",
                                        lamp::ops::FoldedBackend::kReference);
  EXPECT_TRUE(torch::equal(a.output, b.output));
  EXPECT_EQ(lamp::ops::folded_conv_fallbacks().size(), before);
  std::string why = "(unset)";
  const bool built = lamp::ops::conv_batch_norm_fusion_built(&why);
  EXPECT_EQ(built, why.empty()) << why;
}

// A ResNet with fold_batch_norm where it does not apply (the CPU) is the
// network of the level below, bit for bit, with the same state-dict names.
TEST(ConvBatchNorm, ResNetFoldLevelKeepsNamesAndFallsBackOffTheGpu) {
  for (const auto& name : {std::string("resnet18"), std::string("resnet50")}) {
    SCOPED_TRACE(name);
    torch::manual_seed(3);
    lamp::models::ResNet plain(lamp::models::resnet_options(name));
    torch::manual_seed(3);
    lamp::models::ResNet folded(
        lamp::models::resnet_options(name).fold_batch_norm(true));
    EXPECT_TRUE(folded->options().fold_batch_norm());
    const auto a = plain->named_parameters();
    const auto b = folded->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& p : a) {
      ASSERT_TRUE(b.contains(p.key())) << p.key();
    }
    EXPECT_EQ(plain->named_buffers().keys(), folded->named_buffers().keys());
    const auto x = torch::randn({2, 3, 16, 16});
    EXPECT_TRUE(torch::equal(folded->forward(x), plain->forward(x)));
    // The programs' `--fused-bn conv`: make_model passes the level on.
    for (const bool fold : {false, true}) {
      const auto built = lamp::models::make_model(name, 10, 3, true, fold);
      const auto* resnet =
          dynamic_cast<const lamp::models::ResNetImpl*>(built.module.get());
      ASSERT_NE(resnet, nullptr);
      EXPECT_EQ(resnet->options().fold_batch_norm(), fold);
      EXPECT_TRUE(resnet->options().fused_batch_norm());
    }
  }
}

TEST(ConvBatchNorm, FoldedBadInputIsNamed) {
  const auto x = torch::randn({2, 4, 5, 5});
  const auto w = torch::randn({3, 4, 3, 3});
  const auto conv = [](int64_t in, int64_t out, bool bias) {
    return torch::nn::Conv2d(
        torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(bias));
  };
  // Layers a folded block cannot take.
  const lamp::ops::ConvBatchNormLayer biased{
      conv(4, 4, true), torch::nn::BatchNorm2d(4), "layer9.0.conv1"};
  const lamp::ops::ConvBatchNormLayer mismatched{
      conv(4, 4, false), torch::nn::BatchNorm2d(6), "layer9.0.conv2"};
  const lamp::ops::ConvBatchNormLayer widening{
      conv(4, 8, false), torch::nn::BatchNorm2d(8), "layer9.0.conv3"};
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] {
         lamp::ops::folded_conv(x, torch::randn({3, 5, 3, 3}), 1, 1, {}, {},
                                "stem");
       },
       "stem: the weight must be [C_out, 4, kH, kW]"},
      {[&] { lamp::ops::folded_conv(x, w, 1, 1, torch::ones({4}), {}); },
       "both a scale and a bias"},
      {[&] {
         lamp::ops::folded_conv(x, w, 1, 1, torch::ones({3}),
                                torch::zeros({3}));
       },
       "one value per input channel (4)"},
      {[&] { lamp::ops::folded_conv(x, w, 0, 1, {}, {}); },
       "stride must be at least 1"},
      // A tensor on another device (the meta device stands for one here)
      // is named before any kernel is handed its pointer.
      {[&] {
         lamp::ops::folded_conv(x, torch::empty({3, 4, 3, 3}, torch::kMeta), 1,
                                1, {}, {}, "stem");
       },
       "stem: the weight (meta) must be on x's device (cpu)"},
      {[&] {
         lamp::ops::folded_conv(x, w, 1, 1, torch::ones({4}),
                                torch::empty({4}, torch::kMeta));
       },
       "the prologue's bias (meta) must be on x's device"},
      {[&] { lamp::ops::folded_residual_block(x, {biased}); },
       "layer9.0.conv1 must be a convolution without bias"},
      {[&] { lamp::ops::folded_residual_block(x, {mismatched}); },
       "outputs 4 channels but its BatchNorm normalises 6"},
      {[&] { lamp::ops::folded_residual_block(x, {widening}); },
       "needs a projection shortcut"},
      {[&] { lamp::ops::folded_residual_block(x, {}); },
       "at least one convolution"},
      // Empty modules: lamp's message, not the holder's (nor a null
      // dereference).
      {[&] {
         lamp::ops::folded_residual_block(
             x, {{torch::nn::Conv2d(nullptr), torch::nn::BatchNorm2d(4),
                  "layer9.0.conv4"}});
       },
       "layer9.0.conv4 has no convolution"},
      {[&] {
         lamp::ops::folded_batch_norm(torch::randn({2, 4, 3, 3}),
                                      torch::nn::BatchNorm2d(nullptr));
       },
       "folded_batch_norm: the BatchNorm2d is empty"},
      {[&] {
         lamp::ops::finalize_batch_norm(torch::ones({4}), torch::ones({4}), 8,
                                        torch::nn::BatchNorm2d(nullptr));
       },
       "finalize_batch_norm: the BatchNorm2d is empty"},
  };
  for (const auto& [run, message] : cases) {
    EXPECT_NE(error_of(run).find(message), std::string::npos) << message;
  }
}

// ---------------------------------------------------------------------------
// On the GPU: cuDNN's graphs against the reference.

// The autograd nodes of folded_conv() behind `root`.
int count_folded_nodes(const torch::Tensor& root) {
  return lamp_test::count_nodes_named(root, "FoldedConvFunction");
}

using lamp_test::WithinUlps;

std::string fallback_lines() {
  std::string all;
  for (const auto& line : lamp::ops::folded_conv_fallbacks()) {
    all += "\n  " + line;
  }
  return all;
}

// Each pattern (forward with and without the prologue, data and weight
// gradients) against the ATen reference on the same inputs, in FP16 and
// BF16, for a ResNet's 3x3 and 1x1 convolutions at strides 1 and 2.
TEST(ConvBatchNorm, CudnnGraphsMatchTheReference_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  std::string why;
  ASSERT_TRUE(lamp::ops::conv_batch_norm_fusion_built(&why)) << why;
  const torch::Device cuda(torch::kCUDA);
  const auto cl = torch::MemoryFormat::ChannelsLast;
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (const bool prologue : {false, true}) {
      for (const auto& [kernel, stride] :
           std::vector<std::pair<int64_t, int64_t>>{
               {3, 1}, {3, 2}, {1, 1}, {1, 2}}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) +
                     (prologue ? ", prologue" : "") + ", kernel " +
                     std::to_string(kernel) + ", stride " +
                     std::to_string(stride));
        torch::manual_seed(21);
        const int64_t padding = kernel / 2;
        const auto x = (torch::randn({32, 64, 16, 16}, cuda) + 0.2)
                           .to(dtype)
                           .contiguous(cl);
        const auto w = (torch::randn({128, 64, kernel, kernel}, cuda) /
                        std::sqrt(64.0 * kernel * kernel))
                           .to(dtype)
                           .contiguous(cl);
        const auto s =
            prologue ? torch::rand({64}, cuda) + 0.5 : torch::Tensor();
        const auto b =
            prologue ? torch::randn({64}, cuda) * 0.5 : torch::Tensor();
        const auto before = lamp::ops::folded_conv_fallbacks().size();
        ConvSide sides[2];
        for (int side = 0; side < 2; ++side) {
          const auto backend = side == 0 ? lamp::ops::FoldedBackend::kReference
                                         : lamp::ops::FoldedBackend::kAuto;
          sides[side] = conv_side(x, w, s, b,
                                  [&](const auto& xl, const auto& wl,
                                      const auto& sl, const auto& bl) {
                                    return lamp::ops::folded_conv(
                                        xl, wl, stride, padding, sl, bl,
                                        "cuda.conv", backend);
                                  });
        }
        const lamp::ops::FoldedConv got[2] = {sides[0].got, sides[1].got};
        torch::manual_seed(22);
        // NCHW on purpose, as a loss or a pooled head hands it on: the
        // backward makes it channels_last for the kernel and the graphs.
        const auto py = torch::randn(got[0].output.sizes(), cuda).to(dtype);
        const auto ps = torch::randn({128}, cuda) * 1e-3;
        const auto pq = torch::randn({128}, cuda) * 1e-4;
        for (int side = 0; side < 2; ++side) {
          ((got[side].output.to(torch::kFloat) * py.to(torch::kFloat)).sum() +
           (got[side].sum * ps).sum() + (got[side].sum_of_squares * pq).sum())
              .backward();
        }
        const auto after = lamp::ops::folded_conv_fallbacks();
        if (dtype == torch::kHalf) {
          // EXPECT: the other cases still run and print what they took.
          EXPECT_EQ(after.size(), before)
              << "a pass ran the ATen ops:" << fallback_lines();
        } else if (after.size() > before) {
          // cuDNN 9.19 on an H200 (sm_90) refuses this pattern in BF16: its
          // genstats and BatchNorm-statistics engines take FP16 alone. The
          // refused pass runs the reference, which the checks below compare
          // as they do a graph; the refusal names the layer and the pass.
          for (size_t i = before; i < after.size(); ++i) {
            EXPECT_EQ(after[i].rfind("cuda.conv (", 0), 0u) << after[i];
          }
          std::cout << "[          ] BF16: cuDNN refused "
                    << after.size() - before
                    << " graph(s), the reference ran instead" << std::endl;
        }
        // One rounding of FP32 accumulations of the same products, summed
        // in another order on each side: within 2 ulps at the largest value.
        EXPECT_TRUE(WithinUlps(got[1].output, got[0].output, dtype, 2));
        // FP32 sums over N P Q values each within an ulp: 2 ulps of the
        // largest sum of magnitudes bounds them.
        EXPECT_TRUE(WithinUlps(got[1].sum, got[0].sum, dtype, 2));
        EXPECT_TRUE(
            WithinUlps(got[1].sum_of_squares, got[0].sum_of_squares, dtype, 2));
        const char* names[] = {"x", "weight", "scale", "bias"};
        for (size_t i = 0; i < sides[0].leaves.size(); ++i) {
          // The same rounding of the incoming gradient to `dtype` on both
          // sides, then FP32 sums in another order: 4 ulps.
          EXPECT_TRUE(WithinUlps(sides[1].leaves[i].grad(),
                                 sides[0].leaves[i].grad(), dtype, 4))
              << names[i] << "'s gradient";
        }
      }
    }
  }
  // Each graph with the plan cuDNN took and its scale and bias's dtype, for
  // the log: every FP16 pass was built (checked above), so each of its
  // three kinds has a plan.
  const auto graphs = lamp::detail::cudnn_graph_descriptions();
  for (const char* kind : {"forward cuda:", "dgrad cuda:", "wgrad cuda:"}) {
    bool built = false;
    for (const auto& line : graphs) {
      built =
          built || (line.rfind(kind, 0) == 0 &&
                    line.find(" Half x 32x64x16x16 ") != std::string::npos &&
                    line.find(": plan ") != std::string::npos);
    }
    EXPECT_TRUE(built) << "no FP16 " << kind << " graph built";
  }
  for (const auto& line : graphs) {
    std::cout << "[          ] " << line << std::endl;
  }
}

// Under torch.backends.cudnn.deterministic the graphs take only engines
// without cuDNN's NONDETERMINISTIC note (a shape left without one runs the
// reference, whose ATen convolutions honour the setting too): two runs of
// one layer give the same bits, the output, its sums and every gradient.
TEST(ConvBatchNorm, DeterministicCudnnRepeatsToTheBit_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  struct Restore {
    bool was = at::globalContext().deterministicCuDNN();
    ~Restore() { at::globalContext().setDeterministicCuDNN(was); }
  } restore;
  at::globalContext().setDeterministicCuDNN(true);
  const torch::Device cuda(torch::kCUDA);
  const auto cl = torch::MemoryFormat::ChannelsLast;
  torch::manual_seed(24);
  const auto x = (torch::randn({32, 64, 16, 16}, cuda) + 0.2)
                     .to(torch::kHalf)
                     .contiguous(cl);
  const auto w = (torch::randn({128, 64, 3, 3}, cuda) / 24.0)
                     .to(torch::kHalf)
                     .contiguous(cl);
  const auto s = torch::rand({64}, cuda) + 0.5;
  const auto b = torch::randn({64}, cuda) * 0.5;
  const auto py = torch::randn({32, 128, 16, 16}, cuda);
  const auto ps = torch::randn({128}, cuda) * 1e-3;
  ConvSide sides[2];
  for (auto& side : sides) {
    side = conv_side(
        x, w, s, b,
        [&](const auto& xl, const auto& wl, const auto& sl, const auto& bl) {
          return lamp::ops::folded_conv(xl, wl, 1, 1, sl, bl,
                                        "deterministic.conv");
        });
    ((side.got.output.to(torch::kFloat) * py).sum() +
     (side.got.sum * ps).sum() + (side.got.sum_of_squares * ps).sum())
        .backward();
  }
  EXPECT_TRUE(torch::equal(sides[0].got.output, sides[1].got.output));
  EXPECT_TRUE(torch::equal(sides[0].got.sum, sides[1].got.sum));
  EXPECT_TRUE(
      torch::equal(sides[0].got.sum_of_squares, sides[1].got.sum_of_squares));
  const char* names[] = {"x", "weight", "scale", "bias"};
  for (size_t i = 0; i < sides[0].leaves.size(); ++i) {
    EXPECT_TRUE(
        torch::equal(sides[0].leaves[i].grad(), sides[1].leaves[i].grad()))
        << names[i] << "'s gradient";
  }
  // The graphs built with deterministic engines, printed: at least one pass
  // must have run one, else the test compared the reference with itself.
  int built = 0;
  for (const auto& line : lamp::detail::cudnn_graph_descriptions()) {
    if (line.find(" Half x 32x64x16x16 ") != std::string::npos &&
        line.find(", deterministic: ") != std::string::npos) {
      built += line.find(", deterministic: plan ") != std::string::npos;
      std::cout << "[          ] " << line << std::endl;
    }
  }
  EXPECT_GT(built, 0) << "no pass ran a deterministic cuDNN graph:"
                      << fallback_lines();
}

// A shape cuDNN's fusion engines do not take (5 channels: not a multiple of
// the 8 their 16-bit kernels align to) still trains, as the reference, and
// the refusal names the layer once; where this cuDNN does take it, the
// graph's result must match all the same.
TEST(ConvBatchNorm, RefusedGraphFallsBackToTheReference_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const auto cl = torch::MemoryFormat::ChannelsLast;
  torch::manual_seed(23);
  const auto x =
      torch::randn({4, 5, 9, 9}, cuda).to(torch::kHalf).contiguous(cl);
  const auto w =
      torch::randn({7, 5, 3, 3}, cuda).to(torch::kHalf).contiguous(cl);
  const auto s = torch::rand({5}, cuda) + 0.5;
  const auto b = torch::randn({5}, cuda);
  const auto before = lamp::ops::folded_conv_fallbacks().size();
  const auto got = lamp::ops::folded_conv(x, w, 1, 1, s, b, "odd.conv");
  const auto expected = lamp::ops::folded_conv(
      x, w, 1, 1, s, b, "odd.conv", lamp::ops::FoldedBackend::kReference);
  EXPECT_TRUE(WithinUlps(got.output, expected.output, torch::kHalf, 2));
  const auto after = lamp::ops::folded_conv_fallbacks();
  for (size_t i = before; i < after.size(); ++i) {
    EXPECT_EQ(after[i].rfind("odd.conv (", 0), 0u) << after[i];
  }
  std::cout << "[          ] odd.conv: "
            << (after.size() > before ? "refused, ran the reference"
                                      : "cuDNN took the graph")
            << std::endl;
}

// Training steps of ResNet50 (amp, channels_last) with the conv level
// against the fused BatchNorm level, eagerly and replayed from a CUDA
// graph: the same model, within the rounding of 16-bit activations.
TEST(ConvBatchNorm, ResNetStepsMatchTheFusedLevel_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  struct Run {
    std::vector<torch::Tensor> state;
    std::vector<double> losses;
    std::vector<bool> skipped;
  };
  const auto train = [&](bool fold, bool graph) {
    torch::manual_seed(0);
    lamp::models::ResNet model(
        lamp::models::resnet_options("resnet50").fold_batch_norm(fold));
    model->to(cuda);
    lamp::models::to_channels_last(*model);
    lamp::TrainStep step(
        model.ptr(),
        [](std::vector<torch::Tensor> params) {
          return lamp::optim::make_optimizer(
              std::move(params),
              lamp::optim::OptimizerOptions().name("sgd").lr(0.01).momentum(
                  0.9));
        },
        // A loss scale no step of this run overflows: at the default 65536 a
        // fresh ResNet50's first steps overflow FP16, and a step skipped in
        // one run but taken in the other moves the weights by a whole update,
        // which says nothing about the convolutions.
        lamp::TrainStepOptions(lamp::Precision::kAMP)
            .cuda_graph(graph)
            .scaler(lamp::GradScalerOptions().init_scale(256.0)));
    torch::manual_seed(1);
    const auto x = torch::randn({32, 3, 32, 32}, cuda)
                       .contiguous(torch::MemoryFormat::ChannelsLast);
    const auto y =
        torch::randint(10, {32}, torch::dtype(torch::kLong).device(cuda));
    Run run;
    for (int i = 0; i < 4; ++i) {
      const auto loss =
          step.step(x, y, [&](const torch::Tensor& in, const torch::Tensor& t) {
            const auto out = model->forward(in);
            if (fold && !graph) {
              EXPECT_GT(count_folded_nodes(out), 0);
            }
            return torch::nn::functional::cross_entropy(out.to(torch::kFloat),
                                                        t);
          });
      run.losses.push_back(loss.loss.item<double>());
      run.skipped.push_back(loss.skipped());
    }
    for (const auto& p : model->parameters()) {
      run.state.push_back(p.detach().cpu());
    }
    for (const auto& b : model->buffers()) {
      run.state.push_back(b.detach().cpu());
    }
    return run;
  };
  const auto before = lamp::ops::folded_conv_fallbacks().size();
  const auto fused = train(false, false);
  const auto folded = train(true, false);
  const auto captured = train(true, true);
  EXPECT_EQ(lamp::ops::folded_conv_fallbacks().size(), before)
      << "layers fell back:" << fallback_lines();
  // The losses and skipped steps of each run, for the log: where the runs
  // part, these say at which step and whether the scaler had a hand in it.
  for (const auto* run : {&fused, &folded, &captured}) {
    std::cout << "[          ] "
              << (run == &fused    ? "on"
                  : run == &folded ? "conv"
                                   : "conv+graph")
              << ":";
    for (size_t i = 0; i < run->losses.size(); ++i) {
      std::cout << " " << run->losses[i]
                << (run->skipped[i] ? " (skipped)" : "");
    }
    std::cout << std::endl;
  }
  EXPECT_EQ(folded.skipped, fused.skipped);
  EXPECT_EQ(captured.skipped, folded.skipped);
  for (size_t i = 0; i < fused.losses.size(); ++i) {
    // Both run FP16 activations; their roundings differ (the folded path
    // never rounds the normalised activations), which moves a loss near
    // 2.3 by about 1e-3 over a few steps.
    EXPECT_NEAR(folded.losses[i], fused.losses[i], 2e-2) << "step " << i;
    EXPECT_NEAR(captured.losses[i], folded.losses[i], 1e-3) << "step " << i;
  }
  for (size_t i = 0; i < fused.state.size(); ++i) {
    EXPECT_TRUE(
        lamp_test::AllClose(folded.state[i], fused.state[i], 2e-2, 2e-3))
        << "tensor " << i;
    // The same kernels replayed; only cuDNN's algorithm choice may differ.
    EXPECT_TRUE(
        lamp_test::AllClose(captured.state[i], folded.state[i], 1e-3, 1e-5))
        << "tensor " << i;
  }
}

} // namespace
