#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "lamp/models/mnist_cnn.h"
#include "lamp/ops/relu_max_pool.h"
#include "lamp/platform/backends.h"
#include "test_util.h"

namespace {

using lamp_test::BitEqual;

struct Result {
  torch::Tensor output;
  torch::Tensor grad;
};

// The stock composition the fused op replaces. It runs in float for the
// 16-bit types: ReLU, max and the gradient routing are exact in any floating
// type, and LibTorch 1.13 has no CPU max_pool2d for Half.
Result stock(const torch::Tensor& input, int64_t k,
             const torch::Tensor& grad_output) {
  const bool widen = input.scalar_type() == torch::kHalf ||
                     input.scalar_type() == torch::kBFloat16;
  auto x = (widen ? input.to(torch::kFloat) : input.clone()).requires_grad_();
  auto out = torch::max_pool2d(torch::relu(x), {k, k});
  out.backward(widen ? grad_output.to(torch::kFloat) : grad_output);
  return {out.detach().to(input.scalar_type()),
          x.grad().to(input.scalar_type())};
}

Result fused(const torch::Tensor& input, int64_t k,
             const torch::Tensor& grad_output) {
  auto x = input.clone().requires_grad_();
  auto out = lamp::ops::relu_max_pool2d(x, k);
  out.backward(grad_output);
  return {out.detach(), x.grad()};
}

// Values with many exact ties (multiples of 0.5), zeros of both signs,
// negative windows, and optionally NaN and infinities.
torch::Tensor tricky_input(std::vector<int64_t> shape, torch::ScalarType dtype,
                           bool specials, uint64_t seed) {
  torch::manual_seed(seed);
  auto x = torch::round(torch::randn(shape) * 2) / 2;
  if (specials) {
    auto flat = x.view(-1);
    const int64_t n = flat.numel();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; i += 13)
      flat[i] = -0.0f;
    for (int64_t i = 5; i < n; i += 37)
      flat[i] = nan;
    for (int64_t i = 7; i < n; i += 41)
      flat[i] = inf;
    for (int64_t i = 11; i < n; i += 43)
      flat[i] = -inf;
    // Two NaNs in one window: the gradient goes to the last one.
    if (n > 40) {
      flat[32] = nan;
      flat[33] = nan;
    }
  }
  return x.to(dtype);
}

void expect_same_as_stock(std::vector<int64_t> shape, int64_t k,
                          torch::ScalarType dtype, bool specials) {
  SCOPED_TRACE(::testing::Message()
               << "shape " << torch::IntArrayRef(shape) << " k " << k
               << " dtype " << dtype << " specials " << specials);
  const auto x = tricky_input(shape, dtype, specials, 7);
  ASSERT_TRUE(lamp::ops::relu_max_pool2d_is_fused(x, k));
  auto out_shape = shape;
  out_shape[2] /= k;
  out_shape[3] /= k;
  const auto g = torch::randn(out_shape).to(dtype);
  const auto expected = stock(x, k, g);
  const auto got = fused(x, k, g);
  EXPECT_TRUE(BitEqual(got.output, expected.output));
  EXPECT_TRUE(BitEqual(got.grad, expected.grad));
}

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat, torch::kDouble,
                                                torch::kBFloat16, torch::kHalf};

TEST(ReluMaxPool2d, EqualsReluThenMaxPoolForwardAndBackward) {
  for (const auto dtype : kDtypes) {
    for (const bool specials : {false, true}) {
      // The MNIST CNN's shapes; widths whose 2x2 rows are shorter than one
      // SIMD group (3 outputs), not a multiple of it (5, 7), and long ones.
      expect_same_as_stock({64, 16, 28, 28}, 2, dtype, specials);
      expect_same_as_stock({64, 32, 14, 14}, 2, dtype, specials);
      expect_same_as_stock({2, 3, 6, 6}, 2, dtype, specials);
      expect_same_as_stock({2, 3, 10, 10}, 2, dtype, specials);
      expect_same_as_stock({1, 2, 4, 40}, 2, dtype, specials);
    }
  }
}

TEST(ReluMaxPool2d, FloorModeDropsTrailingRowsAndColumns) {
  for (const auto dtype : kDtypes) {
    expect_same_as_stock({2, 3, 9, 11}, 2, dtype, true);
    expect_same_as_stock({1, 1, 3, 3}, 2, dtype, false);
  }
}

TEST(ReluMaxPool2d, OtherKernelSizes) {
  for (const auto dtype : kDtypes) {
    expect_same_as_stock({2, 3, 10, 7}, 3, dtype, true);
    expect_same_as_stock({2, 2, 5, 5}, 1, dtype, true);
    expect_same_as_stock({1, 2, 16, 15}, 15, dtype, true);
  }
}

TEST(ReluMaxPool2d, SameResultWithSeveralThreads) {
  const int threads = at::get_num_threads();
  const auto x = tricky_input({8, 16, 12, 12}, torch::kBFloat16, true, 3);
  const auto g = torch::randn({8, 16, 6, 6}).to(torch::kBFloat16);
  at::set_num_threads(1);
  const auto one = fused(x, 2, g);
  at::set_num_threads(2);
  const auto two = fused(x, 2, g);
  at::set_num_threads(threads);
  EXPECT_TRUE(BitEqual(two.output, one.output));
  EXPECT_TRUE(BitEqual(two.grad, one.grad));
}

TEST(ReluMaxPool2d, KeepsOneBytePerOutputNotTheActivation) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto x = tricky_input({2, 4, 8, 8}, dtype, false, 5).requires_grad_();
    const auto out = lamp::ops::relu_max_pool2d(x, 2);
    const auto saved = lamp::ops::detail::relu_max_pool2d_saved_tensors(out);
    ASSERT_EQ(saved.size(), 1u) << dtype;
    EXPECT_EQ(saved[0].scalar_type(), torch::kByte);
    EXPECT_EQ(saved[0].sizes(), out.sizes());
    EXPECT_EQ(saved[0].numel() * saved[0].element_size(), out.numel());
    // Inference records nothing; the stock fallback is not the fused node.
    torch::NoGradGuard guard;
    EXPECT_TRUE(lamp::ops::detail::relu_max_pool2d_saved_tensors(
                    lamp::ops::relu_max_pool2d(x, 2))
                    .empty());
  }
  const auto nhwc = torch::randn({1, 2, 4, 4})
                        .contiguous(torch::MemoryFormat::ChannelsLast)
                        .requires_grad_();
  EXPECT_TRUE(lamp::ops::detail::relu_max_pool2d_saved_tensors(
                  lamp::ops::relu_max_pool2d(nhwc, 2))
                  .empty());
}

TEST(ReluMaxPool2d, FallsBackToStockOpsWhereNotFused) {
  const auto x = tricky_input({2, 4, 8, 8}, torch::kFloat, true, 9);
  const auto g = torch::randn({2, 4, 4, 4});
  // channels_last, 3-D (unbatched) input, a kernel larger than 15 or than
  // the image: the stock composition, with its results and errors.
  const auto nhwc = x.contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(lamp::ops::relu_max_pool2d_is_fused(nhwc, 2));
  const auto got =
      fused(nhwc, 2, g.contiguous(torch::MemoryFormat::ChannelsLast));
  const auto expected = stock(x, 2, g);
  EXPECT_TRUE(BitEqual(got.output, expected.output));
  EXPECT_TRUE(BitEqual(got.grad.contiguous(), expected.grad));

  const auto unbatched = x[0];
  EXPECT_FALSE(lamp::ops::relu_max_pool2d_is_fused(unbatched, 2));
  EXPECT_TRUE(BitEqual(lamp::ops::relu_max_pool2d(unbatched, 2),
                       torch::max_pool2d(torch::relu(unbatched), {2, 2})));

  const auto big = torch::randn({1, 1, 17, 17});
  EXPECT_FALSE(lamp::ops::relu_max_pool2d_is_fused(big, 16));
  EXPECT_TRUE(BitEqual(lamp::ops::relu_max_pool2d(big, 16),
                       torch::max_pool2d(torch::relu(big), {16, 16})));
  EXPECT_FALSE(lamp::ops::relu_max_pool2d_is_fused(x, 9));
  EXPECT_THROW(lamp::ops::relu_max_pool2d(x, 9), c10::Error);
}

TEST(ReluMaxPool2d, RejectsBadArguments) {
  try {
    lamp::ops::relu_max_pool2d(torch::randn({1, 1, 4, 4}), 0);
    FAIL() << "kernel_size 0 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel_size must be at least 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(lamp::ops::relu_max_pool2d(torch::Tensor(), 2), c10::Error);
}

TEST(ReluMaxPool2d, SecondOrderGradientIsRefused) {
  auto x = torch::randn({1, 2, 4, 4}, torch::requires_grad());
  auto out = lamp::ops::relu_max_pool2d(x, 2);
  try {
    torch::autograd::grad({out.sum()}, {x}, {}, /*retain_graph=*/true,
                          /*create_graph=*/true);
    FAIL() << "create_graph through relu_max_pool2d did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("differentiable once"),
              std::string::npos)
        << e.what();
  }
  // A first-order gradient still works on the same graph.
  EXPECT_TRUE(torch::autograd::grad({out.sum()}, {x})[0].defined());
}

TEST(ReluMaxPool2d, MatchesStockOps_CUDA) {
  if (!lamp::cuda_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  const auto x = tricky_input({4, 8, 10, 10}, torch::kFloat, true, 11);
  const auto g = torch::randn({4, 8, 5, 5});
  const auto got = fused(x.cuda(), 2, g.cuda());
  const auto expected = stock(x, 2, g);
  EXPECT_TRUE(BitEqual(got.output.cpu(), expected.output));
  EXPECT_TRUE(BitEqual(got.grad.cpu(), expected.grad));
}

// The MNIST CNN with the fused op gives the stock ops' loss and gradients.
TEST(MnistCNN, FusedReluPoolEqualsStockOps) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    torch::manual_seed(0);
    lamp::models::MnistCNN net;
    net->to(dtype);
    const auto x = torch::randn({16, 1, 28, 28}).to(dtype);
    const auto labels = torch::randint(0, 10, {16}, torch::kLong);

    const auto fused_loss =
        torch::nll_loss(net->forward(x).to(torch::kFloat), labels);
    fused_loss.backward();
    std::vector<torch::Tensor> fused_grads;
    for (auto& p : net->parameters()) {
      fused_grads.push_back(p.grad().clone());
      p.mutable_grad() = torch::Tensor();
    }

    auto out = torch::max_pool2d(torch::relu(net->conv1->forward(x)), {2, 2});
    out = torch::max_pool2d(torch::relu(net->conv2->forward(out)), {2, 2});
    out = torch::log_softmax(net->fc->forward(out.flatten(1)), 1);
    const auto stock_loss = torch::nll_loss(out.to(torch::kFloat), labels);
    stock_loss.backward();

    EXPECT_TRUE(BitEqual(fused_loss, stock_loss));
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(BitEqual(fused_grads[i], params[i].grad()))
          << "parameter " << i;
    }
  }
}

} // namespace
