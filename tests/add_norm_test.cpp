// lamp::ops::add_layer_norm and add_rms_norm against the stock ops they
// replace (x + branch, then the norm), forward and backward: the ATen ops on
// the CPU, the CUDA kernels on a GPU (the _CUDA tests).
#include "lamp/ops/add_norm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd_nodes.h"
#include "graph_replay.h"
#include "kernel_checks.h"
#include "lamp/amp/autocast.h"
#include "lamp/models/gpt.h"
#include "lamp/nn/rms_norm.h"
#include "lamp/platform/backends.h"
#include "platform/compat.h"
#include "platform/kernel_runs.h"
#include "test_util.h"

namespace {

using lamp::ops::add_layer_norm;
using lamp::ops::add_layer_norm_reference;
using lamp::ops::add_rms_norm;
using lamp::ops::add_rms_norm_reference;
using lamp::ops::AddNormOptions;
using lamp::ops::AddNormResult;
using lamp_test::AllClose;
using lamp_test::expect_error;
using lamp_test::expect_norm_outputs_close;

struct Inputs {
  torch::Tensor x, branch, weight, bias;
  // The gradients the loss sends to the sum and to the normed output.
  torch::Tensor grad_sum, grad_normed;
};

// A residual stream with a mean away from zero and a spread of a few units
// (what a trained GPT's looks like), a branch of unit scale, a weight near
// one and a small bias.
Inputs make_inputs(std::vector<int64_t> shape, torch::Dtype x_dtype,
                   torch::Dtype branch_dtype, torch::Dtype weight_dtype,
                   bool weight, bool bias, uint64_t seed = 0,
                   torch::Device device = torch::kCPU) {
  torch::manual_seed(seed);
  const int64_t width = shape.back();
  Inputs in;
  in.x = (torch::randn(shape) * 2 + 0.5).to(device, x_dtype);
  in.branch = torch::randn(shape).to(device, branch_dtype);
  if (weight) {
    in.weight = (1 + 0.1 * torch::randn({width})).to(device, weight_dtype);
  }
  if (bias) {
    in.bias = (0.1 * torch::randn({width})).to(device, weight_dtype);
  }
  in.grad_sum = torch::randn(shape).to(device);
  in.grad_normed = torch::randn(shape).to(device);
  return in;
}

using Outputs = lamp_test::NormOutputs;

torch::Tensor leaf(const torch::Tensor& t) {
  return t.defined() ? t.detach().clone().requires_grad_() : torch::Tensor();
}

torch::Tensor grad_or_zeros(const torch::Tensor& t) {
  if (!t.defined()) {
    return {};
  }
  return t.grad().defined() ? t.grad() : torch::zeros_like(t);
}

// Runs `op` on fresh leaves of `in` and back-propagates the loss
// sum(s * grad_sum) + sum(y * grad_normed), either term left out on request.
Outputs run(const Inputs& in,
            const std::function<
                AddNormResult(const torch::Tensor&, const torch::Tensor&,
                              const torch::Tensor&, const torch::Tensor&)>& op,
            bool use_sum = true, bool use_normed = true) {
  auto x = leaf(in.x);
  auto branch = leaf(in.branch);
  auto weight = leaf(in.weight);
  auto bias = leaf(in.bias);
  const auto r = op(x, branch, weight, bias);
  auto loss = torch::zeros({}, in.grad_sum.options());
  if (use_sum) {
    loss = loss + (r.sum.to(torch::kFloat) * in.grad_sum).sum();
  }
  if (use_normed) {
    loss = loss + (r.normed.to(torch::kFloat) * in.grad_normed).sum();
  }
  loss.backward();
  return {r.sum.detach(),        r.normed.detach(),     grad_or_zeros(x),
          grad_or_zeros(branch), grad_or_zeros(weight), grad_or_zeros(bias)};
}

AddNormResult layer_norm_fused(const torch::Tensor& x, const torch::Tensor& b,
                               const torch::Tensor& w, const torch::Tensor& c,
                               const AddNormOptions& o = {}) {
  return add_layer_norm(x, b, w, c, o);
}

AddNormResult layer_norm_stock(const torch::Tensor& x, const torch::Tensor& b,
                               const torch::Tensor& w, const torch::Tensor& c,
                               const AddNormOptions& o = {}) {
  return add_layer_norm_reference(x, b, w, c, o);
}

double peak(const torch::Tensor& t) {
  return t.abs().max().item<double>();
}

TEST(AddNorm, LayerNormMatchesTheStockOpsInFP32) {
  // Widths of one, of no vector width's multiple and of a GPT's; FP32 sums
  // of up to 1000 terms in another order than ATen's: 1e-5 of the largest
  // entry is well above their rounding (about 1e-6 here).
  for (const int64_t width : {2, 7, 33, 384, 1000}) {
    const auto in = make_inputs({3, 5, width}, torch::kFloat, torch::kFloat,
                                torch::kFloat, true, true, width);
    const auto got =
        run(in, [](auto&&... a) { return layer_norm_fused(a...); });
    const auto want =
        run(in, [](auto&&... a) { return layer_norm_stock(a...); });
    expect_norm_outputs_close(got, want, 1e-5,
                              "width " + std::to_string(width));
    // The sum is x + branch, bit for bit, and so are its gradients' parts
    // that come from the sum alone (checked below without the norm).
    EXPECT_TRUE(lamp_test::BitEqual(got.sum, want.sum));
  }
}

TEST(AddNorm, AWidthOfOneGivesTheBias) {
  // One element per row: it is its own mean, so the LayerNorm gives the
  // bias exactly, and the norm passes no gradient back (g - mean(g) = 0,
  // xhat = 0): x and the branch get the sum's own gradient, bit for bit.
  // (ATen's layer_norm gives the bias only to rounding amplified by
  // 1/sqrt(eps): the reason the test above starts at a width of two.)
  const auto in = make_inputs({4, 3, 1}, torch::kFloat, torch::kFloat,
                              torch::kFloat, true, true, 1);
  const auto got = run(in, [](auto&&... a) { return layer_norm_fused(a...); });
  EXPECT_TRUE(lamp_test::BitEqual(got.normed, in.bias.expand({4, 3, 1})));
  EXPECT_TRUE(lamp_test::BitEqual(got.x, in.grad_sum));
  EXPECT_TRUE(lamp_test::BitEqual(got.branch, in.grad_sum));
  EXPECT_EQ(got.weight.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(lamp_test::BitEqual(
      got.bias, in.grad_normed.sum(std::vector<int64_t>{0, 1})));
}

TEST(AddNorm, RmsNormMatchesLampsRmsNorm) {
  const auto stock = [](const torch::Tensor& x, const torch::Tensor& b,
                        const torch::Tensor& w, const torch::Tensor&) {
    auto s = x + b;
    return AddNormResult{s, lamp::nn::rms_norm(s, {x.size(-1)}, w, 1e-5)};
  };
  for (const int64_t width : {1, 7, 384, 1000}) {
    const auto in = make_inputs({4, 3, width}, torch::kFloat, torch::kFloat,
                                torch::kFloat, true, false, width);
    const auto got = run(in, [](const torch::Tensor& x, const torch::Tensor& b,
                                const torch::Tensor& w, const torch::Tensor&) {
      return add_rms_norm(x, b, w);
    });
    const auto want = run(in, stock);
    expect_norm_outputs_close(got, want, 1e-5,
                              "width " + std::to_string(width));
    // The reference is lamp::nn::rms_norm's arithmetic, to the bit.
    const auto ref = run(in, [](const torch::Tensor& x, const torch::Tensor& b,
                                const torch::Tensor& w, const torch::Tensor&) {
      return add_rms_norm_reference(x, b, w);
    });
    EXPECT_TRUE(lamp_test::BitEqual(ref.normed, want.normed));
  }
}

TEST(AddNorm, WithoutTheWeightOrTheBias) {
  // A LayerNorm without elementwise affine, and nanoGPT's bias-free one.
  for (const bool weight : {false, true}) {
    const auto in = make_inputs({6, 40}, torch::kFloat, torch::kFloat,
                                torch::kFloat, weight, false, 3);
    const auto got =
        run(in, [](auto&&... a) { return layer_norm_fused(a...); });
    const auto want =
        run(in, [](auto&&... a) { return layer_norm_stock(a...); });
    expect_norm_outputs_close(got, want, 1e-5,
                              weight ? "weight only" : "neither");
  }
  const auto in = make_inputs({6, 40}, torch::kFloat, torch::kFloat,
                              torch::kFloat, false, false, 4);
  const auto got = run(in, [](const torch::Tensor& x, const torch::Tensor& b,
                              const torch::Tensor&, const torch::Tensor&) {
    return add_rms_norm(x, b, torch::Tensor());
  });
  const auto s = in.x + in.branch;
  EXPECT_TRUE(AllClose(got.normed, lamp::nn::rms_norm(s, {40}, {}, 1e-5), 0,
                       1e-6 * peak(got.normed)));
}

TEST(AddNorm, GradientsFromOneOutputAlone) {
  // Only the normed output used (the residual stream ends here, as before a
  // GPT's head), and only the sum (the norm's output unused): each path of
  // the backward alone.
  const auto in = make_inputs({5, 64}, torch::kFloat, torch::kFloat,
                              torch::kFloat, true, true, 5);
  for (const bool use_sum : {false, true}) {
    const auto got = run(
        in, [](auto&&... a) { return layer_norm_fused(a...); }, use_sum,
        !use_sum);
    const auto want = run(
        in, [](auto&&... a) { return layer_norm_stock(a...); }, use_sum,
        !use_sum);
    expect_norm_outputs_close(got, want, 1e-5,
                              use_sum ? "sum only" : "normed only");
  }
  const auto sum_only = run(
      in, [](auto&&... a) { return layer_norm_fused(a...); }, true, false);
  EXPECT_TRUE(lamp_test::BitEqual(sum_only.x, in.grad_sum));
  EXPECT_TRUE(lamp_test::BitEqual(sum_only.branch, in.grad_sum));
  EXPECT_EQ(sum_only.weight.abs().max().item<float>(), 0.0f);
}

TEST(AddNorm, BF16ResidualStream) {
  // bf16 mode: x and the branch BF16, the norm's parameters FP32 (as
  // network_to_half keeps them). The stock ops in FP32 on the BF16 sum
  // (the reference), rounded to BF16 at the end: one BF16 rounding apart at most, 2^-8 of
  // the largest entry; the FP32 weight's gradient sums BF16 gradients over
  // the rows in another order (2^-7).
  const auto in = make_inputs({4, 9, 96}, torch::kBFloat16, torch::kBFloat16,
                              torch::kFloat, true, true, 6);
  const auto got = run(in, [](auto&&... a) { return layer_norm_fused(a...); });
  const auto want = run(in, [](auto&&... a) { return layer_norm_stock(a...); });
  EXPECT_EQ(got.sum.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.normed.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(lamp_test::BitEqual(got.sum, want.sum));
  EXPECT_TRUE(AllClose(got.normed, want.normed, 0, peak(want.normed) / 256));
  EXPECT_TRUE(AllClose(got.x, want.x, 0, peak(want.x) / 128));
  EXPECT_TRUE(AllClose(got.branch, want.branch, 0, peak(want.branch) / 128));
  EXPECT_TRUE(AllClose(got.weight, want.weight, 0, peak(want.weight) / 128));
  EXPECT_TRUE(AllClose(got.bias, want.bias, 0, peak(want.bias) / 128));
}

TEST(AddNorm, AutocastFP32StreamAndBF16Branch) {
  // amp-bf16: an FP32 residual stream, a BF16 branch (a linear's output
  // under autocast). The sum is FP32; the LayerNorm's output FP32 as
  // autocast gives it, or BF16 when asked (the bits the next linear would
  // cast it to).
  const auto in = make_inputs({3, 7, 48}, torch::kFloat, torch::kBFloat16,
                              torch::kFloat, true, true, 7);
  lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
  const auto got = run(in, [](auto&&... a) { return layer_norm_fused(a...); });
  const auto want = run(in, [](auto&&... a) { return layer_norm_stock(a...); });
  EXPECT_EQ(got.sum.scalar_type(), torch::kFloat);
  expect_norm_outputs_close(got, want, 1e-5, "autocast, default output");
  const auto narrow = AddNormOptions().output_dtype(torch::kBFloat16);
  const auto got16 =
      run(in, [&](auto&&... a) { return layer_norm_fused(a..., narrow); });
  const auto want16 =
      run(in, [&](auto&&... a) { return layer_norm_stock(a..., narrow); });
  EXPECT_EQ(got16.normed.scalar_type(), torch::kBFloat16);
  // One BF16 rounding of values equal to FP32 rounding.
  EXPECT_TRUE(
      AllClose(got16.normed, want16.normed, 0, peak(want16.normed) / 256));
  EXPECT_TRUE(AllClose(got16.x, want16.x, 0, 1e-5 * peak(want16.x)));
  EXPECT_EQ(got16.branch.scalar_type(), torch::kBFloat16);
}

TEST(AddNorm, FP16Inputs) {
  if (!lamp::detail::kCpuAutocastSupportsHalf) {
    GTEST_SKIP() << "this LibTorch has no FP16 arithmetic on the CPU";
  }
  // FP16 x and branch, FP32 parameters: as BF16 above, at FP16's 2^-11.
  const auto in = make_inputs({4, 100}, torch::kHalf, torch::kHalf,
                              torch::kFloat, true, true, 8);
  const auto got = run(in, [](auto&&... a) { return layer_norm_fused(a...); });
  const auto want = run(in, [](auto&&... a) { return layer_norm_stock(a...); });
  EXPECT_TRUE(lamp_test::BitEqual(got.sum, want.sum));
  EXPECT_TRUE(AllClose(got.normed, want.normed, 0, peak(want.normed) / 1024));
  EXPECT_TRUE(AllClose(got.x, want.x, 0, peak(want.x) / 1024));
  EXPECT_TRUE(AllClose(got.weight, want.weight, 0, peak(want.weight) / 1024));
}

TEST(AddNorm, DoubleStaysDouble) {
  const auto in = make_inputs({3, 50}, torch::kDouble, torch::kDouble,
                              torch::kDouble, true, true, 9);
  const auto got = run(in, [](auto&&... a) { return layer_norm_fused(a...); });
  const auto want = run(in, [](auto&&... a) { return layer_norm_stock(a...); });
  expect_norm_outputs_close(got, want, 1e-12, "double");
}

TEST(AddNorm, DefaultOutputDtypeIsTheStockNormsUnderAutocast) {
  // The reference shares add_layer_norm's choice of dtype, so this compares
  // with torch::layer_norm itself: on the CPU, FP32 for a 16-bit sum with
  // LibTorch 1.13 (lamp's FP32 kernel), the sum's own dtype with 2.x (its
  // mixed-dtype kernels); FP64 kept (autocast casts no FP64 tensor).
  lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat, torch::kDouble}) {
    const auto x = torch::randn({2, 8}).to(dtype);
    const auto stock = torch::layer_norm(x + x, {8});
    EXPECT_EQ(add_layer_norm(x, x, {}, {}).normed.scalar_type(),
              stock.scalar_type())
        << dtype;
  }
}

TEST(AddNorm, NonContiguousInputs) {
  torch::manual_seed(10);
  const auto x = torch::randn({24, 6}).t(); // [6, 24], strided
  const auto b = torch::randn({6, 24});
  const auto w = torch::randn({24});
  const auto got = add_layer_norm(x, b, w, {});
  const auto want = add_layer_norm_reference(x, b, w, {});
  EXPECT_TRUE(AllClose(got.normed, want.normed, 0, 1e-5));
}

TEST(AddNorm, RefusesWhatDoesNotFit) {
  const auto x = torch::randn({2, 8});
  const auto w = torch::ones({8});
  expect_error(
      [&] {
        add_layer_norm(x, torch::randn({2, 7}), w, {});
      },
      "must have one shape");
  expect_error([&] { add_layer_norm(x, x, torch::ones({7}), {}); },
               "the weight must be [8]");
  expect_error(
      [&] {
        add_layer_norm(x, x, w, torch::ones({2, 8}));
      },
      "the bias must be [8]");
  expect_error(
      [&] {
        add_layer_norm(torch::zeros({0, 8}), torch::zeros({0, 8}), w, {});
      },
      "no rows");
  expect_error(
      [&] {
        add_rms_norm(torch::ones({2, 8}, torch::kLong),
                     torch::ones({2, 8}, torch::kLong), w);
      },
      "must be floating point");
  expect_error([&] { add_rms_norm(x, {}, w); }, "must both be given");
  expect_error([&] { add_layer_norm(x, x, w, {}, AddNormOptions().eps(0)); },
               "eps must be positive");
  // An infinite eps gave every row its bias; an integer output truncated
  // the normalised values and dropped their gradient.
  expect_error([&] { add_rms_norm(x, x, w, AddNormOptions().eps(INFINITY)); },
               "eps must be positive and finite, got inf");
  expect_error(
      [&] {
        add_layer_norm(x, x, w, {}, AddNormOptions().output_dtype(torch::kInt));
      },
      "output_dtype must be a floating-point type, got Int");
  expect_error([&] { add_layer_norm(x, x, torch::ones({8}, torch::kInt), {}); },
               "the weight must be floating point");
  // A tensor on another device (the meta device stands for one) is named
  // before a kernel is handed its pointer (a host weight's pointer in a
  // CUDA kernel faults on the device).
  const auto meta = torch::empty({8}, torch::kMeta);
  expect_error([&] { add_layer_norm(x, x, meta, {}); },
               "the weight (meta) must be on x's device (cpu)");
  expect_error([&] { add_layer_norm(x, x, w, meta); },
               "the bias (meta) must be on x's device (cpu)");
  expect_error([&] { add_rms_norm(x, x, meta); },
               "the weight (meta) must be on x's device (cpu)");
  expect_error(
      [&] {
        add_layer_norm(x, torch::empty({2, 8}, torch::kMeta), w, {});
      },
      "and the branch (meta) must be on one device");
}

// An eps other than the GPT's 1e-5 reaches the arithmetic, checked
// against the stock ops directly (not the reference, which shares the
// option): rows of variance about 1.3e-4, where eps 1e-3 against 1e-5
// scales LayerNorm's normalised values by about 1/3, and RMSNorm's eps 1e-6
// (Llama's) against 1e-5 by about 3.5%; FP32's rounding is near 1e-6 of
// them.
TEST(AddNorm, TheEpsGivenIsTheEpsUsed) {
  torch::manual_seed(37);
  const auto x = torch::randn({5, 24}) * 0.01;
  const auto branch = torch::randn({5, 24}) * 0.005;
  const auto w = torch::randn({24});
  const auto b = torch::randn({24});
  const auto s = x + branch;
  const auto layer =
      add_layer_norm(x, branch, w, b, AddNormOptions().eps(1e-3));
  EXPECT_TRUE(AllClose(layer.normed, torch::layer_norm(s, {24}, w, b, 1e-3),
                       1e-5, 1e-6));
  EXPECT_FALSE(AllClose(layer.normed, torch::layer_norm(s, {24}, w, b, 1e-5),
                        1e-2, 1e-3));
  const auto rms = add_rms_norm(x, branch, w, AddNormOptions().eps(1e-6));
  EXPECT_TRUE(
      AllClose(rms.normed, lamp::nn::rms_norm(s, {24}, w, 1e-6), 1e-5, 1e-6));
  EXPECT_FALSE(
      AllClose(rms.normed, lamp::nn::rms_norm(s, {24}, w, 1e-5), 1e-2, 1e-3));
}

TEST(AddNorm, PathNamesTheATenOpsOnTheCPU) {
  const auto x = torch::randn({2, 8});
  const auto path = lamp::ops::add_norm_path(x, x);
  EXPECT_EQ(path.rfind("ATen ops: the tensors are on cpu", 0), 0u) << path;
  expect_error([] { lamp::ops::add_norm_path(torch::ones({}), {}); },
               "must both be given");
  expect_error(
      [] { lamp::ops::add_norm_path(torch::ones({}), torch::ones({})); },
      "positive width");
}

// --- models::GPT with GPTOptions::fused_add_norm ---------------------------

using lamp::models::GPT;
using lamp::models::GPTOptions;

// Two GPTs of `options`, unfused and fused, with the same weights.
std::pair<GPT, GPT> twins(const GPTOptions& options) {
  torch::manual_seed(21);
  GPT plain(options);
  GPT fused(GPTOptions(options).fused_add_norm(true));
  torch::NoGradGuard no_grad;
  // Norms unlike each other (as built they are all ones and zeros), so that
  // a norm applied in another's place shows.
  for (auto& p : plain->named_parameters()) {
    if (p.key().find("ln_") != std::string::npos) {
      p.value().copy_(p.key().find("weight") != std::string::npos
                          ? 1 + 0.3 * torch::randn_like(p.value())
                          : 0.3 * torch::randn_like(p.value()));
    }
  }
  const auto from = plain->parameters();
  const auto to = fused->parameters();
  EXPECT_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) {
    to[i].copy_(from[i]);
  }
  return {plain, fused};
}

struct GptRun {
  torch::Tensor logits;
  std::vector<torch::Tensor> grads;
  int fused_nodes = 0; // the fused add+norm operations recorded
};

GptRun train_step(GPT& gpt, const torch::Tensor& tokens) {
  gpt->zero_grad();
  const auto logits = gpt->forward(tokens);
  logits.to(torch::kFloat).square().mean().backward();
  GptRun r{logits.detach(),
           {},
           lamp_test::count_nodes_named(logits, "AddNormFunction")};
  for (const auto& p : gpt->parameters()) {
    r.grads.push_back(p.grad().defined() ? p.grad().clone()
                                         : torch::zeros_like(p));
  }
  return r;
}

void expect_same_step(const GptRun& got, const GptRun& want, double rtol,
                      const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(AllClose(got.logits, want.logits, 0, rtol * peak(want.logits)));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_TRUE(AllClose(got.grads[i], want.grads[i], 0,
                         rtol * peak(want.grads[i]) + 1e-12))
        << "parameter " << i;
  }
}

GPTOptions small_gpt() {
  return GPTOptions()
      .layers(3)
      .heads(2)
      .width(24)
      .context(12)
      .vocab_size(40)
      .dropout(0);
}

TEST(AddNorm, GptWithFusedAddNormTrainsAsTheUnfusedOne) {
  // Every norm the GPT offers, with and without biases, and with
  // activation checkpointing (only the add inside each block fused): the
  // logits and every parameter's gradient of one step agree to FP32
  // rounding (1e-5 of each tensor's largest entry).
  torch::manual_seed(22);
  const auto tokens = torch::randint(0, 40, {3, 12}, torch::kLong);
  for (const auto norm :
       {lamp::models::GPTNorm::kLayerNorm, lamp::models::GPTNorm::kRMSNorm}) {
    for (const bool bias : {true, false}) {
      for (const bool checkpointing : {false, true}) {
        auto [plain, fused] =
            twins(small_gpt().norm(norm).bias(bias).activation_checkpointing(
                checkpointing));
        plain->train();
        fused->train();
        const auto got = train_step(fused, tokens);
        const auto want = train_step(plain, tokens);
        expect_same_step(
            got, want, 1e-5,
            std::string(norm == lamp::models::GPTNorm::kRMSNorm ? "rmsnorm"
                                                                : "layernorm") +
                (bias ? " bias" : " no bias") +
                (checkpointing ? " checkpointing" : ""));
        // Two per block (with ln_2, with the next norm); under checkpointing
        // the blocks' own ops sit inside the checkpoint's node.
        EXPECT_EQ(got.fused_nodes, checkpointing ? 0 : 6);
        EXPECT_EQ(want.fused_nodes, 0);
      }
    }
  }
}

TEST(AddNorm, GptBlockFusesTheAddInside) {
  // A block on its own (as activation checkpointing runs it): attention's
  // add goes with ln_2; the MLP's add is left to the caller's next norm.
  torch::manual_seed(25);
  lamp::models::GPTBlock block(small_gpt().fused_add_norm(true));
  const auto x = torch::randn({2, 5, 24}, torch::requires_grad());
  EXPECT_EQ(lamp_test::count_nodes_named(block->forward(x), "AddNormFunction"),
            1);
}

TEST(AddNorm, GptWithFusedAddNormUnderAutocast) {
  // amp-bf16: the norms' outputs in BF16, which the linears after them
  // would have cast them to; one BF16 rounding may fall the other way where
  // the statistics were summed in another order (2^-6 of the largest
  // logit and gradient, through three blocks).
  torch::manual_seed(23);
  const auto tokens = torch::randint(0, 40, {2, 12}, torch::kLong);
  auto [plain, fused] = twins(small_gpt());
  lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
  const auto want = train_step(plain, tokens);
  const auto got = train_step(fused, tokens);
  EXPECT_EQ(fused->features(tokens).scalar_type(), torch::kBFloat16);
  expect_same_step(got, want, 1.0 / 64, "autocast bf16");
}

TEST(AddNorm, GptWithFusedAddNormSamplesWithTheKVCache) {
  // Generation: the prompt, then one token at a time through the KV cache;
  // the fused model's last logits are the unfused one's.
  torch::manual_seed(24);
  const auto tokens = torch::randint(0, 40, {2, 9}, torch::kLong);
  auto [plain, fused] = twins(small_gpt());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> last;
  for (auto* gpt : {&plain, &fused}) {
    (*gpt)->eval();
    lamp::models::GPTKVCache cache(**gpt, 2);
    (*gpt)->set_kv_cache(&cache);
    (*gpt)->forward(tokens.narrow(1, 0, 6));
    (*gpt)->forward(tokens.narrow(1, 6, 1));
    last.push_back((*gpt)->forward(tokens.narrow(1, 7, 2)));
    (*gpt)->set_kv_cache(nullptr);
  }
  EXPECT_TRUE(AllClose(last[1], last[0], 0, 1e-5 * peak(last[0])));
  // And the cache's answer is the whole window's.
  EXPECT_TRUE(AllClose(last[1], fused->forward(tokens).narrow(1, 7, 2), 0,
                       1e-5 * peak(last[0])));
}

// --- CUDA: the kernels against the stock ops ------------------------------

TEST(AddNorm, KernelMatchesTheStockOps_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  struct Case {
    torch::Dtype x, branch;
    c10::optional<at::ScalarType> output;
    double rtol; // of the largest entry: one rounding of the narrowest dtype
  };
  const std::vector<Case> cases = {
      {torch::kFloat, torch::kFloat, c10::nullopt, 1e-5},
      {torch::kFloat, torch::kBFloat16, torch::kBFloat16, 1.0 / 128},
      {torch::kBFloat16, torch::kBFloat16, c10::nullopt, 1.0 / 128},
      {torch::kHalf, torch::kHalf, c10::nullopt, 1.0 / 1024},
      {torch::kFloat, torch::kHalf, torch::kHalf, 1.0 / 1024}};
  for (const auto& c : cases) {
    for (const int64_t width : {1, 7, 384, 1000, 4097}) {
      for (const int64_t rows : {1, 37, 2048}) {
        const auto in = make_inputs({rows, width}, c.x, c.branch, torch::kFloat,
                                    true, true, width + rows, cuda);
        EXPECT_EQ(lamp::ops::add_norm_path(in.x, in.branch),
                  "lamp's CUDA kernel");
        const auto o = AddNormOptions().output_dtype(c.output);
        const auto launches =
            lamp::detail::kernel_runs(lamp::detail::KernelPath::kAddNorm)
                .load();
        const auto got =
            run(in, [&](auto&&... a) { return layer_norm_fused(a..., o); });
        // The forward and the backward kernel ran (the ATen ops, which
        // meet the same bounds, count none).
        EXPECT_EQ(lamp::detail::kernel_runs(lamp::detail::KernelPath::kAddNorm)
                          .load() -
                      launches,
                  2);
        const auto want =
            run(in, [&](auto&&... a) { return layer_norm_stock(a..., o); });
        expect_norm_outputs_close(got, want, c.rtol,
                                  std::string(c10::toString(c.x)) + "+" +
                                      c10::toString(c.branch) + " width " +
                                      std::to_string(width) + " rows " +
                                      std::to_string(rows));
        const auto got_rms =
            run(in, [&](const torch::Tensor& x, const torch::Tensor& b,
                        const torch::Tensor& w, const torch::Tensor&) {
              return add_rms_norm(x, b, w, o);
            });
        const auto want_rms =
            run(in, [&](const torch::Tensor& x, const torch::Tensor& b,
                        const torch::Tensor& w, const torch::Tensor&) {
              return add_rms_norm_reference(x, b, w, o);
            });
        expect_norm_outputs_close(got_rms, want_rms, c.rtol, "RMSNorm");
      }
    }
  }
}

TEST(AddNorm, KernelGivesTheSameBitsTwice_CUDA) {
  // No atomics: the weight's gradient is summed in a fixed order.
  LAMP_SKIP_WITHOUT_CUDA();
  const auto in =
      make_inputs({4096, 768}, torch::kFloat, torch::kBFloat16, torch::kFloat,
                  true, true, 11, torch::Device(torch::kCUDA));
  const auto a = run(in, [](auto&&... v) { return layer_norm_fused(v...); });
  const auto b = run(in, [](auto&&... v) { return layer_norm_fused(v...); });
  EXPECT_TRUE(lamp_test::BitEqual(a.weight, b.weight));
  EXPECT_TRUE(lamp_test::BitEqual(a.x, b.x));
}

TEST(AddNorm, KernelRunsInACapturedGraph_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  auto in = make_inputs({64, 384}, torch::kFloat, torch::kBFloat16,
                        torch::kFloat, true, true, 12, cuda);
  auto x = in.x.clone().requires_grad_();
  auto branch = in.branch.clone().requires_grad_();
  auto weight = in.weight.clone().requires_grad_();
  auto bias = in.bias.clone().requires_grad_();
  torch::Tensor normed, grad_x, grad_weight;
  const auto step = [&] {
    const auto r = add_layer_norm(x, branch, weight, bias);
    const auto loss = (r.sum * in.grad_sum).sum() +
                      (r.normed.to(torch::kFloat) * in.grad_normed).sum();
    const auto grads = torch::autograd::grad({loss}, {x, weight});
    normed = r.normed.detach();
    grad_x = grads[0];
    grad_weight = grads[1];
  };
  // New values in the captured inputs; a replay computes them.
  lamp_test::capture_refill_replay(cuda, step, [&] {
    x.copy_(x * 0.5 - 1);
    branch.copy_(torch::randn_like(branch));
  });
  Inputs now = in;
  now.x = x.detach().clone();
  now.branch = branch.detach().clone();
  const auto want =
      run(now, [](auto&&... a) { return layer_norm_stock(a...); });
  EXPECT_TRUE(AllClose(normed, want.normed, 0, 1e-5 * peak(want.normed)));
  EXPECT_TRUE(AllClose(grad_x, want.x, 0, 1e-5 * peak(want.x)));
  EXPECT_TRUE(AllClose(grad_weight, want.weight, 0, 1e-5 * peak(want.weight)));
}

TEST(AddNorm, DoubleFallsBackToTheATenOps_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto in =
      make_inputs({8, 50}, torch::kDouble, torch::kDouble, torch::kDouble, true,
                  true, 13, torch::Device(torch::kCUDA));
  EXPECT_EQ(lamp::ops::add_norm_path(in.x, in.branch),
            "ATen ops: the kernel takes FP32, FP16 and BF16, not Double");
  const auto got = run(in, [](auto&&... a) { return layer_norm_fused(a...); });
  const auto want = run(in, [](auto&&... a) { return layer_norm_stock(a...); });
  expect_norm_outputs_close(got, want, 1e-12, "double on CUDA");
}

} // namespace
