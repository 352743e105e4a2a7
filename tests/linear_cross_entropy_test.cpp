// lamp::ops::linear_cross_entropy against the stock composition it
// replaces (linear, .to(kFloat), cross_entropy), forward and backward.
#include "lamp/ops/linear_cross_entropy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lamp/amp/autocast.h"
#include "lamp/models/gpt.h"
#include "platform/compat.h"
#include "test_util.h"

namespace {

using lamp::ops::linear_cross_entropy;
using lamp::ops::linear_cross_entropy_reference;
using lamp::ops::LinearCrossEntropyOptions;
using lamp_test::AllClose;
using lamp_test::expect_error;

struct Head {
  torch::Tensor input;   // [B, T, width], requires grad
  torch::Tensor weight;  // [vocab, width], requires grad
  torch::Tensor targets; // [B, T] int64
};

// Logits of a few units (a trained head's scale), so that the softmax is
// neither uniform nor one-hot.
Head make_head(int64_t b, int64_t t, int64_t width, int64_t vocab,
               torch::Dtype dtype = torch::kFloat, uint64_t seed = 0) {
  torch::manual_seed(seed);
  Head h;
  h.input = torch::randn({b, t, width}).to(dtype).requires_grad_();
  h.weight = (torch::randn({vocab, width}) / std::sqrt(double(width)) * 3)
                 .to(dtype)
                 .requires_grad_();
  h.targets = torch::randint(0, vocab, {b, t}, torch::kLong);
  return h;
}

struct Result {
  torch::Tensor loss, grad_input, grad_weight;
};

template <typename Loss>
Result run(const Head& h, Loss loss_of, double grad_scale = 1.0) {
  auto input = h.input.detach().clone().requires_grad_();
  auto weight = h.weight.detach().clone().requires_grad_();
  auto loss = loss_of(input, weight);
  (loss * grad_scale).backward();
  return {loss.detach(), input.grad(), weight.grad()};
}

Result fused(const Head& h, const LinearCrossEntropyOptions& o = {},
             double grad_scale = 1.0) {
  return run(
      h,
      [&](const torch::Tensor& x, const torch::Tensor& w) {
        return linear_cross_entropy(x, w, h.targets, o);
      },
      grad_scale);
}

Result reference(const Head& h, bool sum = false, double grad_scale = 1.0) {
  return run(
      h,
      [&](const torch::Tensor& x, const torch::Tensor& w) {
        return linear_cross_entropy_reference(x, w, h.targets, sum);
      },
      grad_scale);
}

// The largest magnitude of a gradient: the scale its rounding is judged on.
double peak(const torch::Tensor& t) {
  return t.abs().max().item<double>();
}

// FP32 throughout: the sums run in another order (chunks, then rows), a
// few units of FP32 rounding (2^-24 relative) on values of order 1.
void expect_fp32_close(const Result& got, const Result& want) {
  EXPECT_TRUE(AllClose(got.loss, want.loss, 1e-6,
                       1e-6 * want.loss.abs().item<double>()));
  EXPECT_TRUE(AllClose(got.grad_input, want.grad_input, 1e-5,
                       1e-6 * peak(want.grad_input)));
  EXPECT_TRUE(AllClose(got.grad_weight, want.grad_weight, 1e-5,
                       1e-6 * peak(want.grad_weight)));
}

TEST(LinearCrossEntropy, ReferenceIsTheLinearThenCrossEntropy) {
  // The reference itself: the stock ops a GPT's forward and the trainer's
  // loss compose, so that the tests below compare against what runs today.
  const auto h = make_head(2, 5, 16, 40);
  const auto logits = torch::nn::functional::linear(h.input, h.weight);
  const auto expected = torch::nn::functional::cross_entropy(
      logits.flatten(0, 1), h.targets.flatten());
  EXPECT_TRUE(lamp_test::BitEqual(
      linear_cross_entropy_reference(h.input, h.weight, h.targets), expected));
}

TEST(LinearCrossEntropy, MatchesTheReferenceInFP32AtEveryChunking) {
  // 111 rows (not a multiple of anything), vocab 300 above the width 48:
  // the automatic chunk is 64 rows, two chunks, the last one short.
  const auto h = make_head(3, 37, 48, 300);
  const auto want = reference(h);
  EXPECT_EQ(lamp::ops::linear_cross_entropy_chunk_rows(111, 48, 300), 64);
  for (const int64_t chunk : {0, 1, 7, 64, 110, 111, 1000}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    const auto got = fused(h, LinearCrossEntropyOptions().chunk_rows(chunk));
    ASSERT_EQ(got.loss.scalar_type(), torch::kFloat);
    ASSERT_EQ(got.loss.dim(), 0);
    expect_fp32_close(got, want);
  }
}

TEST(LinearCrossEntropy, SumsInsteadOfAveragingWhenAsked) {
  const auto h = make_head(2, 9, 24, 70);
  const auto want = reference(h, /*sum=*/true);
  const auto got =
      fused(h, LinearCrossEntropyOptions().sum(true).chunk_rows(5));
  expect_fp32_close(got, want);
  // The mean is the sum over the 18 rows.
  EXPECT_TRUE(AllClose(fused(h).loss * 18, got.loss, 1e-6, 0));
}

TEST(LinearCrossEntropy, TheLossGradientScalesBothGradients) {
  // A GradScaler's scale reaches the kept gradients in the backward: the
  // same gradients times the scale (a power of two: exactly).
  const auto h = make_head(2, 8, 16, 50);
  const auto plain = fused(h, LinearCrossEntropyOptions().chunk_rows(3));
  const auto scaled =
      fused(h, LinearCrossEntropyOptions().chunk_rows(3), 65536.0);
  EXPECT_TRUE(lamp_test::BitEqual(scaled.grad_input, plain.grad_input * 65536));
  EXPECT_TRUE(
      lamp_test::BitEqual(scaled.grad_weight, plain.grad_weight * 65536));
  // And a scale that is not a power of two, against the reference's.
  const auto want = reference(h, false, 3.0);
  const auto got = fused(h, LinearCrossEntropyOptions().chunk_rows(3), 3.0);
  expect_fp32_close(got, want);
}

TEST(LinearCrossEntropy, BF16AutocastMatchesTheReferenceUnderIt) {
  // Under CPU autocast the products run in BF16 as linear's do; the rest is
  // FP32. One chunk (vocab 64 <= width 96) gives the reference's products:
  // the gradients differ only where the softmax's last FP32 bit differs
  // before the BF16 rounding (2^-8 of an element) and by 1/rows, applied
  // before the rounding there and after it here.
  const auto h = make_head(4, 16, 96, 64);
  const auto under = [](const std::function<Result()>& f) {
    lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
    return f();
  };
  const auto want = under([&] { return reference(h); });
  const auto one = under([&] { return fused(h); });
  // The loss: the same BF16 logits, summed in another order.
  EXPECT_TRUE(AllClose(one.loss, want.loss, 1e-6, 1e-6));
  ASSERT_EQ(one.grad_input.scalar_type(), torch::kFloat);
  ASSERT_EQ(one.grad_weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(AllClose(one.grad_input, want.grad_input, 0,
                       peak(want.grad_input) / 128));
  EXPECT_TRUE(AllClose(one.grad_weight, want.grad_weight, 0,
                       peak(want.grad_weight) / 128));
  // Many chunks: each chunk's share of the weight's gradient rounded to
  // BF16 once (2^-8 relative) before the FP32 sum, so the error is bounded
  // by 2^-8 of the sum of the shares' magnitudes, at most 8 chunks' worth
  // of the peak here.
  const auto many = under(
      [&] { return fused(h, LinearCrossEntropyOptions().chunk_rows(8)); });
  EXPECT_TRUE(AllClose(many.loss, want.loss, 1e-6, 1e-6));
  EXPECT_TRUE(AllClose(many.grad_input, want.grad_input, 0,
                       peak(want.grad_input) / 128));
  EXPECT_TRUE(AllClose(many.grad_weight, want.grad_weight, 0,
                       8 * peak(want.grad_weight) / 256));
}

TEST(LinearCrossEntropy, BF16InputsOutsideAutocastKeepTheirDtype) {
  // A converted network (bf16 mode): BF16 hidden states and weight; the
  // gradients come back in BF16, the loss in FP32.
  const auto h = make_head(2, 8, 32, 100, torch::kBFloat16);
  const auto want = reference(h);
  const auto got = fused(h, LinearCrossEntropyOptions().chunk_rows(4));
  EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
  EXPECT_EQ(got.grad_input.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.grad_weight.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(AllClose(got.loss, want.loss, 1e-6, 1e-6));
  EXPECT_TRUE(
      AllClose(got.grad_input, want.grad_input, 0, peak(want.grad_input) / 64));
  // The weight's gradient: summed in FP32 here, in the BF16 product there.
  EXPECT_TRUE(AllClose(got.grad_weight, want.grad_weight, 0,
                       4 * peak(want.grad_weight) / 128));
}

TEST(LinearCrossEntropy, AnFP32WeightUnderABF16InputIsCastToIt) {
  // network_to_half may keep the embedding FP32 while the hidden states are
  // BF16: the head casts the weight to the input's dtype, and the weight's
  // gradient comes back FP32.
  auto h = make_head(2, 8, 32, 100, torch::kBFloat16);
  h.weight = h.weight.detach().to(torch::kFloat).requires_grad_();
  const auto want = reference(h);
  const auto got = fused(h);
  EXPECT_EQ(got.grad_weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(AllClose(got.loss, want.loss, 1e-6, 1e-6));
  EXPECT_TRUE(AllClose(got.grad_weight, want.grad_weight, 0,
                       peak(want.grad_weight) / 128));
}

TEST(LinearCrossEntropy, FP16KeepsSmallGradientsForTheLossScale) {
  // FP16 products: the 1/rows and the loss scale come after them, so the
  // small softmax entries of a mean over many rows do not flush to zero
  // before the scale lifts them (as a scaled reference keeps them).
  if (!lamp::detail::kCpuAutocastSupportsHalf) {
    GTEST_SKIP() << "this LibTorch has no FP16 matmul on the CPU";
  }
  const auto h = make_head(64, 64, 16, 200, torch::kHalf);
  const double scale = 65536.0;
  const auto want = reference(h, false, scale);
  const auto got = fused(h, LinearCrossEntropyOptions().chunk_rows(512), scale);
  EXPECT_EQ(got.grad_input.scalar_type(), torch::kHalf);
  EXPECT_TRUE(AllClose(got.grad_input, want.grad_input, 0,
                       peak(want.grad_input) / 256));
  EXPECT_TRUE(AllClose(got.grad_weight, want.grad_weight, 0,
                       8 * peak(want.grad_weight) / 512));
  EXPECT_GT(got.grad_input.ne(0).sum().item<int64_t>(),
            got.grad_input.numel() * 9 / 10);
}

TEST(LinearCrossEntropy, WithoutAGradientOnlyTheLossIsComputed) {
  const auto h = make_head(2, 6, 16, 30);
  const auto want = reference(h).loss;
  {
    torch::NoGradGuard no_grad;
    const auto loss = linear_cross_entropy(h.input, h.weight, h.targets);
    EXPECT_FALSE(loss.requires_grad());
    EXPECT_TRUE(AllClose(loss, want, 1e-6, 1e-6));
  }
  const auto loss =
      linear_cross_entropy(h.input.detach(), h.weight.detach(), h.targets);
  EXPECT_EQ(loss.grad_fn(), nullptr);
  EXPECT_TRUE(AllClose(loss, want, 1e-6, 1e-6));
  // Only the weight wanting a gradient: it gets one, the input none.
  auto weight = h.weight.detach().clone().requires_grad_();
  linear_cross_entropy(h.input.detach(), weight, h.targets).backward();
  EXPECT_TRUE(AllClose(weight.grad(), reference(h).grad_weight, 1e-5, 1e-7));
}

TEST(LinearCrossEntropy, TargetsOfAnyIntegerTypeAndShape) {
  // int32 targets; rows given flat ([N, width] and [N]).
  const auto h = make_head(1, 12, 8, 20);
  const auto want = reference(h);
  const auto flat =
      linear_cross_entropy(h.input.detach().view({12, 8}), h.weight.detach(),
                           h.targets.view({12}).to(torch::kInt));
  EXPECT_TRUE(AllClose(flat, want.loss, 1e-6, 1e-6));
}

TEST(LinearCrossEntropy, RefusesWhatDoesNotFit) {
  const auto h = make_head(2, 3, 8, 20);
  const auto x = h.input.detach();
  const auto w = h.weight.detach();
  expect_error([&] { linear_cross_entropy(x, w, h.targets.to(torch::kFloat)); },
               "integer token ids");
  expect_error([&] { linear_cross_entropy(x, w, h.targets.view({6})); },
               "the input's leading shape");
  expect_error([&] { linear_cross_entropy(x, w.narrow(1, 0, 7), h.targets); },
               "the weight's width 7");
  expect_error([&] { linear_cross_entropy(x, w[0], h.targets); },
               "[vocab, width]");
  expect_error(
      [&] {
        linear_cross_entropy(x.narrow(1, 0, 0), w, h.targets.narrow(1, 0, 0));
      },
      "no rows");
  expect_error(
      [&] {
        linear_cross_entropy(x, w, h.targets,
                             LinearCrossEntropyOptions().chunk_rows(-1));
      },
      "chunk_rows must be >= 0");
  expect_error([&] { linear_cross_entropy(x.to(torch::kInt), w, h.targets); },
               "floating point");
  // A tensor on another device (the meta device stands for one) is named.
  expect_error(
      [&] { linear_cross_entropy(x, w.to(torch::kMeta), h.targets); },
      "the input (cpu), the weight (meta) and the targets (cpu) must be on "
      "one device");
  expect_error(
      [&] { linear_cross_entropy_reference(x, w, h.targets.view({6})); },
      "linear_cross_entropy_reference");
}

TEST(LinearCrossEntropy, RowsWhoseTargetIsMinus100AreLeftOut) {
  // F::cross_entropy's ignore_index: padded rows have no loss and no
  // gradient, and the mean is over the other rows. 111 rows, a third of
  // them padding, across both chunks of 64.
  auto h = make_head(3, 37, 48, 300);
  h.targets.index_put_({torch::randint(0, 2, {3, 37}, torch::kLong).eq(1)},
                       -100);
  const auto padded = h.targets.eq(-100).sum().item<int64_t>();
  ASSERT_GT(padded, 20);
  ASSERT_LT(padded, 90);
  for (const bool sum : {false, true}) {
    SCOPED_TRACE(sum ? "sum" : "mean");
    const auto want = reference(h, sum);
    for (const int64_t chunk : {0, 7, 111}) {
      const auto got =
          fused(h, LinearCrossEntropyOptions().chunk_rows(chunk).sum(sum));
      expect_fp32_close(got, want);
      // The padded rows' inputs get no gradient at all.
      const auto rows = got.grad_input.view({111, 48});
      EXPECT_EQ(rows.index({h.targets.view({111}).eq(-100)})
                    .ne(0)
                    .sum()
                    .item<int64_t>(),
                0);
    }
  }
  // Without a gradient wanted (the loss alone): the same mean.
  {
    const auto want = reference(h).loss;
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(AllClose(linear_cross_entropy(h.input, h.weight, h.targets),
                         want, 1e-6, 1e-6));
  }
  // Every row padded: a mean over no rows, NaN as the reference's, and
  // gradients of zero as the reference's (no row takes the mean's 1/0): a
  // micro-batch of padding alone adds nothing to accumulated gradients.
  auto all = h;
  all.targets = torch::full_like(h.targets, -100);
  for (const bool sum : {false, true}) {
    SCOPED_TRACE(sum ? "sum" : "mean");
    const auto got = fused(all, LinearCrossEntropyOptions().sum(sum));
    const auto want = reference(all, sum);
    EXPECT_EQ(std::isnan(got.loss.item<double>()), !sum);
    EXPECT_EQ(std::isnan(want.loss.item<double>()), !sum);
    EXPECT_TRUE(
        torch::equal(want.grad_input, torch::zeros_like(want.grad_input)));
    EXPECT_TRUE(torch::equal(got.grad_input, want.grad_input));
    EXPECT_TRUE(torch::equal(got.grad_weight, want.grad_weight));
  }
}

TEST(LinearCrossEntropy, RefusesATargetOutsideTheVocabularyOnTheCpu) {
  const auto h = make_head(2, 3, 8, 20);
  for (const int64_t bad : {20, -1, -101}) {
    auto targets = h.targets.clone();
    targets[1][2] = bad;
    expect_error(
        [&] {
          linear_cross_entropy(h.input.detach(), h.weight.detach(), targets);
        },
        "a target of " + std::to_string(bad) +
            " is outside the vocabulary [0, 20)");
  }
}

TEST(LinearCrossEntropy, TheMeansFactorIsAppliedInFP32) {
  // 192 rows: 1/192 is no power of two, and BF16 would round it (to 8
  // bits) if it met the BF16 gradient in BF16. The mean's input gradient
  // is the sum's, times 1/192 in FP32, rounded to BF16 once.
  const auto h = make_head(3, 64, 32, 100, torch::kBFloat16);
  const auto mean = fused(h, LinearCrossEntropyOptions().chunk_rows(64));
  const auto sum =
      fused(h, LinearCrossEntropyOptions().chunk_rows(64).sum(true));
  const auto expected = (sum.grad_input.to(torch::kFloat) *
                         torch::full({}, 1.0 / 192, torch::kFloat))
                            .to(torch::kBFloat16);
  EXPECT_TRUE(lamp_test::BitEqual(mean.grad_input, expected));
}

TEST(LinearCrossEntropy, ChunkRowsFollowTheVocabulary) {
  using lamp::ops::linear_cross_entropy_chunk_rows;
  // GPT-2 124M's head at batch 16 x 1024: 16384 x 768 / 50257 = 250.4
  // rows would hold the input's size, but a chunk is at least the width (its
  // logits the weight's size): 768 rows, twelve tiles of 64.
  EXPECT_EQ(linear_cross_entropy_chunk_rows(16384, 768, 50257), 768);
  // A batch whose logits outweigh the weight: 4096 x 64 / 1000 = 262.1
  // rows, five tiles.
  EXPECT_EQ(linear_cross_entropy_chunk_rows(4096, 64, 1000), 320);
  // Bytes at width 384: one chunk, every row.
  EXPECT_EQ(linear_cross_entropy_chunk_rows(16384, 384, 256), 16384);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(100, 384, 384), 100);
  // At least one tile, at most the rows.
  EXPECT_EQ(linear_cross_entropy_chunk_rows(1000, 8, 4096), 64);
  EXPECT_EQ(linear_cross_entropy_chunk_rows(10, 8, 4096), 10);
  expect_error([] { linear_cross_entropy_chunk_rows(0, 8, 8); },
               "must be positive");
}

TEST(LinearCrossEntropy, TheGPTsFusedLossIsItsUnfusedLoss) {
  // GPTImpl::loss with and without fused_head_loss, and the trainer's
  // unfused loss (forward, then the language model's cross-entropy), on
  // the same weights; in eval mode, so that dropout draws nothing.
  torch::manual_seed(3);
  const auto options = lamp::models::GPTOptions()
                           .layers(2)
                           .heads(2)
                           .width(32)
                           .context(16)
                           .vocab_size(90);
  lamp::models::GPT plain(options);
  lamp::models::GPT fused_gpt(
      lamp::models::GPTOptions(options).fused_head_loss(true));
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : plain->named_parameters()) {
      fused_gpt->named_parameters()[p.key()].copy_(p.value());
    }
  }
  plain->eval();
  fused_gpt->eval();
  const auto tokens = torch::randint(0, 90, {3, 16}, torch::kLong);
  const auto targets = torch::randint(0, 90, {3, 16}, torch::kLong);
  const auto unfused = torch::nn::functional::cross_entropy(
      plain->forward(tokens).flatten(0, 1), targets.flatten());
  EXPECT_TRUE(lamp_test::BitEqual(plain->loss(tokens, targets), unfused));
  const auto loss = fused_gpt->loss(tokens, targets);
  EXPECT_TRUE(AllClose(loss, unfused, 1e-6, 1e-6));
  // The fused one is linear_cross_entropy's node, not cross_entropy's.
  ASSERT_NE(loss.grad_fn(), nullptr);
  EXPECT_NE(loss.grad_fn()->name().find("LinearCrossEntropy"),
            std::string::npos)
      << loss.grad_fn()->name();
  EXPECT_EQ(
      plain->loss(tokens, targets).grad_fn()->name().find("LinearCrossEntropy"),
      std::string::npos);
  loss.backward();
  plain->loss(tokens, targets).backward();
  for (const auto& p : plain->named_parameters()) {
    SCOPED_TRACE(p.key());
    const auto& g = p.value().grad();
    EXPECT_TRUE(AllClose(fused_gpt->named_parameters()[p.key()].grad(), g, 1e-4,
                         1e-5 * peak(g)));
  }
  // Its factory hands the loss to the trainer only where it is fused.
  EXPECT_TRUE(lamp::models::make_gpt(options).loss == nullptr);
  auto built = lamp::models::make_gpt(
      lamp::models::GPTOptions(options).fused_head_loss(true));
  ASSERT_TRUE(built.loss != nullptr);
  built.module->eval();
  EXPECT_TRUE(
      AllClose(built.loss(tokens, targets).detach(),
               torch::nn::functional::cross_entropy(
                   built.forward(tokens).flatten(0, 1), targets.flatten()),
               1e-6, 1e-6));
  lamp_test::expect_error([&] { plain->loss(tokens, targets.view({48})); },
                          "the tokens' shape");
}

} // namespace
