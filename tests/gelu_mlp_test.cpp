// lamp::ops::gelu_mlp against the stock composition it replaces (linear,
// gelu, linear), forward and backward: the same ATen ops on the CPU (the
// same bits), cuBLASLt's epilogues on a GPU (the _CUDA tests).
#include "lamp/ops/gelu_mlp.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autograd_nodes.h"
#include "graph_replay.h"
#include "lamp/amp/autocast.h"
#include "lamp/models/gpt.h"
#include "lamp/nn/float8.h"
#include "lamp/platform/backends.h"
#include "ops/epilogue_fallbacks.h"
#include "platform/compat.h"
#include "platform/kernel_runs.h"
#include "test_util.h"
#include "tiny_gpt.h"

namespace {

using lamp::ops::gelu_mlp;
using lamp::ops::gelu_mlp_reference;
using lamp::ops::GeluMlpOptions;
using lamp_test::AllClose;
using lamp_test::BitEqual;
using lamp_test::expect_error;

struct Inputs {
  torch::Tensor x, fc_weight, fc_bias, proj_weight, proj_bias;
  torch::Tensor grad; // what the loss sends to the output
};

// GPT-like scales: unit activations, weights of std 0.02 times a few (so
// that the pre-activations spread over GELU's curved part), small biases.
Inputs make_inputs(std::vector<int64_t> shape, int64_t hidden, int64_t out,
                   torch::Dtype x_dtype, torch::Dtype weight_dtype, bool bias,
                   uint64_t seed = 0, torch::Device device = torch::kCPU) {
  torch::manual_seed(seed);
  const int64_t in = shape.back();
  Inputs i;
  i.x = torch::randn(shape).to(device, x_dtype);
  i.fc_weight = (torch::randn({hidden, in}) / std::sqrt(in) * 1.5)
                    .to(device, weight_dtype);
  i.proj_weight = (torch::randn({out, hidden}) / std::sqrt(hidden))
                      .to(device, weight_dtype);
  if (bias) {
    i.fc_bias = (0.3 * torch::randn({hidden})).to(device, weight_dtype);
    i.proj_bias = (0.1 * torch::randn({out})).to(device, weight_dtype);
  }
  auto out_shape = shape;
  out_shape.back() = out;
  i.grad = torch::randn(out_shape).to(device);
  return i;
}

struct Outputs {
  torch::Tensor y, x, fc_weight, fc_bias, proj_weight, proj_bias;
};

torch::Tensor leaf(const torch::Tensor& t) {
  return t.defined() ? t.detach().clone().requires_grad_() : torch::Tensor();
}

torch::Tensor grad_of(const torch::Tensor& t) {
  return t.defined() ? t.grad() : torch::Tensor();
}

using MlpFunction = std::function<torch::Tensor(
    const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
    const torch::Tensor&, const torch::Tensor&)>;

// `mlp` on fresh leaves of `in`, then the backward of sum(y * grad).
Outputs run(const Inputs& in, const MlpFunction& mlp) {
  Outputs o;
  auto x = leaf(in.x), w1 = leaf(in.fc_weight), b1 = leaf(in.fc_bias);
  auto w2 = leaf(in.proj_weight), b2 = leaf(in.proj_bias);
  o.y = mlp(x, w1, b1, w2, b2);
  (o.y.to(torch::kFloat) * in.grad).sum().backward();
  o.y = o.y.detach();
  o.x = grad_of(x);
  o.fc_weight = grad_of(w1);
  o.fc_bias = grad_of(b1);
  o.proj_weight = grad_of(w2);
  o.proj_bias = grad_of(b2);
  return o;
}

MlpFunction fused(const GeluMlpOptions& options) {
  return [options](auto&&... a) { return gelu_mlp(a..., options); };
}

MlpFunction stock(const GeluMlpOptions& options) {
  return [options](auto&&... a) { return gelu_mlp_reference(a..., options); };
}

std::vector<std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>>>
pairs(const Outputs& got, const Outputs& want) {
  return {{"y", {got.y, want.y}},
          {"grad x", {got.x, want.x}},
          {"grad fc_weight", {got.fc_weight, want.fc_weight}},
          {"grad fc_bias", {got.fc_bias, want.fc_bias}},
          {"grad proj_weight", {got.proj_weight, want.proj_weight}},
          {"grad proj_bias", {got.proj_bias, want.proj_bias}}};
}

void expect_bit_equal(const Outputs& got, const Outputs& want,
                      const std::string& what) {
  SCOPED_TRACE(what);
  for (const auto& [name, p] : pairs(got, want)) {
    ASSERT_EQ(p.first.defined(), p.second.defined()) << name;
    if (p.first.defined()) {
      EXPECT_TRUE(BitEqual(p.first, p.second)) << name;
    }
  }
}

double peak(const torch::Tensor& t) {
  return t.abs().max().item<double>();
}

void expect_close(const Outputs& got, const Outputs& want, double rtol,
                  const std::string& what) {
  SCOPED_TRACE(what);
  for (const auto& [name, p] : pairs(got, want)) {
    ASSERT_EQ(p.first.defined(), p.second.defined()) << name;
    if (p.first.defined()) {
      EXPECT_EQ(p.first.scalar_type(), p.second.scalar_type()) << name;
      EXPECT_TRUE(AllClose(p.first.to(torch::kFloat),
                           p.second.to(torch::kFloat), 0,
                           rtol * peak(p.second.to(torch::kFloat))))
          << name;
    }
  }
}

// --- the CPU: the ATen ops, the stock composition's bits ------------------

TEST(GeluMlp, MatchesTheStockCompositionBitForBitInFP32) {
  // The same ATen ops in the same order as linear, gelu, linear and their
  // autograd formulas: not one bit apart, for both GELUs, with and without
  // biases, rows of two ranks and widths that are not multiples of 8.
  for (const char* approximate : {"none", "tanh"}) {
    for (const bool bias : {true, false}) {
      for (const auto& shape :
           std::vector<std::vector<int64_t>>{{2, 5, 24}, {7, 13}}) {
        const int64_t in = shape.back();
        const auto i = make_inputs(shape, 4 * in, in + 3, torch::kFloat,
                                   torch::kFloat, bias, in);
        const auto o = GeluMlpOptions().approximate(approximate);
        expect_bit_equal(run(i, fused(o)), run(i, stock(o)),
                         std::string(approximate) + (bias ? " bias" : "") +
                             " in " + std::to_string(in));
      }
    }
  }
}

TEST(GeluMlp, AnEmptyLayerMatchesTheStockComposition) {
  // A hidden or output width of 0: the biases, of no element, still get
  // their empty gradients, as linear's do, and everything else its zeros.
  const auto o = GeluMlpOptions().approximate("tanh");
  for (const auto& [hidden, out] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 24}, {48, 0}}) {
    for (const bool bias : {true, false}) {
      const auto i =
          make_inputs({5, 24}, hidden, out, torch::kFloat, torch::kFloat, bias,
                      static_cast<uint64_t>(hidden + out));
      const auto got = run(i, fused(o));
      expect_bit_equal(got, run(i, stock(o)),
                       "hidden " + std::to_string(hidden) + ", out " +
                           std::to_string(out) + (bias ? ", bias" : ""));
      if (bias) {
        ASSERT_TRUE(got.fc_bias.defined());
        EXPECT_EQ(got.fc_bias.sizes(), torch::IntArrayRef({hidden}));
      }
    }
  }
}

TEST(GeluMlp, TheGeluIsTheOneAsked) {
  // A bug that swapped the two GELUs would match its own reference: the
  // exact and the tanh MLPs differ, and each matches F::gelu's.
  const auto i =
      make_inputs({6, 16}, 64, 16, torch::kFloat, torch::kFloat, true, 3);
  namespace F = torch::nn::functional;
  const auto by_hand = [&](const char* approximate) {
    const auto h = F::gelu(F::linear(i.x, i.fc_weight, i.fc_bias),
                           F::GELUFuncOptions().approximate(approximate));
    return F::linear(h, i.proj_weight, i.proj_bias);
  };
  const auto exact =
      gelu_mlp(i.x, i.fc_weight, i.fc_bias, i.proj_weight, i.proj_bias);
  const auto tanh = gelu_mlp(i.x, i.fc_weight, i.fc_bias, i.proj_weight,
                             i.proj_bias, GeluMlpOptions().approximate("tanh"));
  EXPECT_TRUE(AllClose(exact, by_hand("none"), 1e-6, 1e-6));
  EXPECT_TRUE(AllClose(tanh, by_hand("tanh"), 1e-6, 1e-6));
  EXPECT_GT((exact - tanh).abs().max().item<double>(), 1e-5);
}

TEST(GeluMlp, UnderAutocastTheProductsRunInBF16) {
  // amp-bf16: autocast's casts, made by the op itself, give autocast's
  // bits; the output in BF16, the gradients in each input's dtype. An FP32
  // input and a BF16 one (what a fused add and norm hands on).
  for (const auto x_dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto i =
        make_inputs({3, 4, 32}, 128, 32, x_dtype, torch::kFloat, true, 5);
    lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
    const auto o = GeluMlpOptions().approximate("tanh");
    const auto got = run(i, fused(o));
    const auto want = run(i, stock(o));
    EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(got.fc_weight.scalar_type(), torch::kFloat);
    EXPECT_EQ(got.x.scalar_type(), x_dtype);
    expect_bit_equal(got, want, c10::toString(x_dtype));
  }
}

TEST(GeluMlp, WeightsAreCastToTheInputsDtype) {
  // Without autocast, FP32 weights beside a BF16 input run in BF16 (the
  // reference casts them alike); each gradient in its input's dtype.
  const auto i =
      make_inputs({5, 16}, 64, 8, torch::kBFloat16, torch::kFloat, true, 6);
  const auto got = run(i, fused({}));
  expect_bit_equal(got, run(i, stock({})), "bf16 input, fp32 weights");
  EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.x.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.proj_weight.scalar_type(), torch::kFloat);
}

TEST(GeluMlp, DoubleStaysDouble) {
  const auto i =
      make_inputs({4, 8}, 32, 8, torch::kDouble, torch::kDouble, true, 7);
  const auto got = run(i, fused({}));
  EXPECT_EQ(got.y.scalar_type(), torch::kDouble);
  expect_bit_equal(got, run(i, stock({})), "double");
}

TEST(GeluMlp, GradientsOnlyWhereAsked) {
  // Frozen weights get no gradient; the input's still flows.
  const auto i =
      make_inputs({4, 8}, 32, 8, torch::kFloat, torch::kFloat, true, 8);
  auto x = leaf(i.x);
  const auto y =
      gelu_mlp(x, i.fc_weight, i.fc_bias, i.proj_weight, i.proj_bias);
  (y * i.grad).sum().backward();
  const auto want = run(i, stock({}));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(BitEqual(x.grad(), want.x));
  // And without grad mode, no graph.
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(gelu_mlp(x, i.fc_weight, i.fc_bias, i.proj_weight, i.proj_bias)
                   .requires_grad());
}

TEST(GeluMlp, RefusesWhatDoesNotFit) {
  const auto i =
      make_inputs({4, 8}, 32, 8, torch::kFloat, torch::kFloat, true, 9);
  const auto call = [&](const torch::Tensor& x, const torch::Tensor& w1,
                        const torch::Tensor& b1, const torch::Tensor& w2,
                        const torch::Tensor& b2, const GeluMlpOptions& o = {}) {
    return [=] { gelu_mlp(x, w1, b1, w2, b2, o); };
  };
  expect_error(call(i.x, i.fc_weight, i.fc_bias, i.proj_weight, i.proj_bias,
                    GeluMlpOptions().approximate("erf")),
               "approximate must be \"none\" (erf) or \"tanh\", got \"erf\"");
  expect_error(call(i.x.narrow(1, 0, 7), i.fc_weight, i.fc_bias, i.proj_weight,
                    i.proj_bias),
               "x must be [..., 8] (fc_weight's in), got [4, 7]");
  expect_error(
      call(i.x, i.fc_weight, i.fc_bias, i.proj_weight.t(), i.proj_bias),
      "with one hidden size, got [32, 8] and [32, 8]");
  expect_error(call(i.x.narrow(0, 0, 0), i.fc_weight, i.fc_bias, i.proj_weight,
                    i.proj_bias),
               "no rows (x [0, 8]): give at least one row");
  expect_error(call(i.x, i.fc_weight, i.fc_bias.narrow(0, 0, 5), i.proj_weight,
                    i.proj_bias),
               "fc_bias must be [32], got [5]");
  expect_error(call(i.x, i.fc_weight, i.fc_bias, i.proj_weight,
                    i.proj_bias.narrow(0, 0, 5)),
               "proj_bias must be [8], got [5]");
  expect_error(call(i.x.to(torch::kLong), i.fc_weight, i.fc_bias, i.proj_weight,
                    i.proj_bias),
               "x must be floating point, got Long");
  expect_error(call(i.x, i.fc_weight, i.fc_bias, torch::Tensor(), i.proj_bias),
               "x, fc_weight and proj_weight must be given");
  expect_error(
      [&] {
        gelu_mlp_reference(i.x, i.fc_weight, i.fc_bias.to(torch::kInt),
                           i.proj_weight, i.proj_bias);
      },
      "lamp::ops::gelu_mlp_reference: fc_bias must be floating point");
  // A tensor on another device (the meta device stands for one) is named
  // before the epilogues are handed its pointer.
  expect_error(call(i.x, i.fc_weight.to(torch::kMeta), i.fc_bias, i.proj_weight,
                    i.proj_bias),
               "fc_weight (meta) must be on x's device (cpu)");
  expect_error(call(i.x, i.fc_weight, i.fc_bias, i.proj_weight,
                    i.proj_bias.to(torch::kMeta)),
               "proj_bias (meta) must be on x's device (cpu)");
}

TEST(GeluMlp, PathNamesTheATenOpsOnTheCPU) {
  const auto x = torch::randn({4, 16});
  const auto w1 = torch::randn({64, 16});
  const auto w2 = torch::randn({16, 64});
  EXPECT_EQ(
      lamp::ops::gelu_mlp_path(x, w1, w2, GeluMlpOptions().approximate("tanh")),
      "ATen ops: the tensors are on cpu, cuBLASLt is CUDA's");
  expect_error([&] { lamp::ops::gelu_mlp_path(x, w2, w2); },
               "lamp::ops::gelu_mlp_path: fc_weight must be [hidden, in]");
}

// --- lamp's GPT with GPTOptions::fused_mlp --------------------------------

using lamp::models::GPT;
using lamp::models::GPTOptions;

using lamp_test::tiny_gpt;

lamp_test::GptStep gpt_step(GPT& gpt, const torch::Tensor& tokens) {
  return lamp_test::gpt_step(gpt, tokens, "GeluMlpFunction");
}

// A GPT of `options` and its twin with fused_mlp, the same weights.
std::pair<GPT, GPT> twins(const GPTOptions& options) {
  return lamp_test::gpt_twins(options, GPTOptions(options).fused_mlp(true));
}

TEST(GeluMlp, GptWithFusedMlpTrainsAsTheUnfusedOne) {
  // fp32 and amp-bf16, both GELUs, with and without biases and with
  // activation checkpointing: the same logits and gradients, bit for bit
  // (the same ATen ops on the CPU), one fused MLP per block.
  const auto tokens = torch::randint(0, 30, {2, 8}, torch::kLong);
  for (const auto gelu :
       {lamp::models::GPTGelu::kExact, lamp::models::GPTGelu::kTanh}) {
    for (const bool bias : {true, false}) {
      for (const bool checkpointing : {false, true}) {
        for (const bool autocast : {false, true}) {
          auto [plain, fused] =
              twins(tiny_gpt().gelu(gelu).bias(bias).activation_checkpointing(
                  checkpointing));
          c10::optional<lamp::Autocast> guard;
          if (autocast) {
            guard.emplace(torch::kCPU, torch::kBFloat16);
          }
          const auto want = gpt_step(plain, tokens);
          const auto got = gpt_step(fused, tokens);
          SCOPED_TRACE(
              std::string(gelu == lamp::models::GPTGelu::kTanh ? "tanh"
                                                               : "exact") +
              (bias ? " bias" : "") + (checkpointing ? " checkpointing" : "") +
              (autocast ? " autocast" : ""));
          EXPECT_TRUE(BitEqual(got.logits, want.logits));
          ASSERT_EQ(got.grads.size(), want.grads.size());
          for (size_t i = 0; i < got.grads.size(); ++i) {
            EXPECT_TRUE(BitEqual(got.grads[i], want.grads[i]))
                << "parameter " << i;
          }
          // Under checkpointing the blocks' ops sit inside its node.
          EXPECT_EQ(got.nodes, checkpointing ? 0 : 2);
          EXPECT_EQ(want.nodes, 0);
        }
      }
    }
  }
}

TEST(GeluMlp, GptRunsFP8MlpsUnfused) {
  // convert_to_float8 swaps the MLP's products for FP8 ones: the fused MLP
  // steps aside for them.
#if !LAMP_TORCH_FLOAT8
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no FP8 dtypes";
#endif
  auto gpt = GPT(tiny_gpt().width(32).heads(2).fused_mlp(true));
  lamp::nn::convert_to_float8(*gpt);
  const auto tokens = torch::randint(0, 30, {2, 8}, torch::kLong);
  lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
  const auto logits = gpt->forward(tokens);
  EXPECT_EQ(lamp_test::count_nodes_named(logits, "GeluMlpFunction"), 0);
}

// --- CUDA: cuBLASLt's epilogues against the stock composition -------------

TEST(GeluMlp, EpiloguesMatchTheStockComposition_CUDA) {
  // The fused path rounds the pre-activation once (the stock one rounds it,
  // then the GELU's output) and applies the GELU's derivative to the FP32
  // accumulator (the stock one to the 16-bit gradient): a few units in the
  // last place of the largest entry, 2^-6 of it for BF16 (8 bits), 2^-9
  // for FP16.
  LAMP_SKIP_WITHOUT_CUDA();
  const lamp_test::Warnings warnings;
  const auto fallbacks = lamp::detail::epilogue_fallback_count().load();
  const torch::Device cuda(torch::kCUDA);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (const bool bias : {true, false}) {
      for (const auto& shape : std::vector<std::vector<int64_t>>{
               {1, 16}, {37, 64}, {4, 256, 384}}) {
        const int64_t in = shape.back();
        const auto i =
            make_inputs(shape, 4 * in, in, dtype, dtype, bias, in, cuda);
        const auto o = GeluMlpOptions().approximate("tanh");
        EXPECT_EQ(lamp::ops::gelu_mlp_path(i.x, i.fc_weight, i.proj_weight, o),
                  "cuBLASLt epilogues");
        const auto products =
            lamp::detail::kernel_runs(lamp::detail::KernelPath::kLtEpilogue)
                .load();
        const auto got = run(i, fused(o));
        // Products with cuBLASLt's epilogues ran (the ATen ops count none).
        EXPECT_GT(
            lamp::detail::kernel_runs(lamp::detail::KernelPath::kLtEpilogue)
                .load(),
            products);
        EXPECT_EQ(lamp_test::count_nodes_named(
                      gelu_mlp(leaf(i.x), i.fc_weight, i.fc_bias, i.proj_weight,
                               i.proj_bias, o),
                      "GeluMlpFunction"),
                  1);
        expect_close(got, run(i, stock(o)),
                     dtype == torch::kBFloat16 ? 1.0 / 64 : 1.0 / 512,
                     std::string(c10::toString(dtype)) + (bias ? " bias" : "") +
                         " in " + std::to_string(in));
      }
    }
  }
  // The epilogues ran: cuBLASLt refusing one would have warned (and the
  // ATen ops would meet the same bounds).
  EXPECT_EQ(warnings.containing("instead of cuBLASLt"),
            std::vector<std::string>{});
  // Every call, not only the first to warn in this process.
  EXPECT_EQ(lamp::detail::epilogue_fallback_count().load(), fallbacks)
      << "a product ran the ATen ops";
}

TEST(GeluMlp, EpiloguesUnderAutocast_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const lamp_test::Warnings warnings;
  const auto fallbacks = lamp::detail::epilogue_fallback_count().load();
  const auto i =
      make_inputs({8, 128, 384}, 1536, 384, torch::kFloat, torch::kFloat, true,
                  41, torch::Device(torch::kCUDA));
  lamp::Autocast guard(torch::kCUDA, torch::kBFloat16);
  const auto o = GeluMlpOptions().approximate("tanh");
  EXPECT_EQ(lamp::ops::gelu_mlp_path(i.x, i.fc_weight, i.proj_weight, o),
            "cuBLASLt epilogues");
  const auto got = run(i, fused(o));
  EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.fc_weight.scalar_type(), torch::kFloat);
  expect_close(got, run(i, stock(o)), 1.0 / 64, "autocast bf16");
  // The epilogues ran: cuBLASLt refusing one would have warned (and the
  // ATen ops would meet the same bounds).
  EXPECT_EQ(warnings.containing("instead of cuBLASLt"),
            std::vector<std::string>{});
  // Every call, not only the first to warn in this process.
  EXPECT_EQ(lamp::detail::epilogue_fallback_count().load(), fallbacks)
      << "a product ran the ATen ops";
}

TEST(GeluMlp, WhatTheEpiloguesCannotTakeRunsTheATenOps_CUDA) {
  // The exact GELU, FP32 and a width that is not a multiple of 8 run the
  // ATen ops on the GPU (one warning, the stock results), never a crash.
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const auto bf16 = make_inputs({16, 64}, 256, 64, torch::kBFloat16,
                                torch::kBFloat16, true, 42, cuda);
  EXPECT_EQ(lamp::ops::gelu_mlp_path(bf16.x, bf16.fc_weight, bf16.proj_weight),
            "ATen ops: cuBLASLt's GELU epilogue computes the tanh "
            "approximation, and this MLP's GELU is the exact one "
            "(approximate \"tanh\" fuses it)");
  expect_bit_equal(run(bf16, fused({})), run(bf16, stock({})), "exact GELU");
  const auto tanh = GeluMlpOptions().approximate("tanh");
  const auto fp32 = make_inputs({16, 64}, 256, 64, torch::kFloat, torch::kFloat,
                                true, 43, cuda);
  EXPECT_EQ(
      lamp::ops::gelu_mlp_path(fp32.x, fp32.fc_weight, fp32.proj_weight, tanh),
      "ATen ops: the epilogues take FP16 and BF16 (autocast's dtypes), "
      "not Float");
  expect_bit_equal(run(fp32, fused(tanh)), run(fp32, stock(tanh)), "fp32");
  const auto odd = make_inputs({16, 60}, 240, 60, torch::kBFloat16,
                               torch::kBFloat16, true, 44, cuda);
  EXPECT_EQ(
      lamp::ops::gelu_mlp_path(odd.x, odd.fc_weight, odd.proj_weight, tanh),
      "ATen ops: the epilogues want the widths to be multiples of 8, got in "
      "60, hidden 240, out 60");
  expect_bit_equal(run(odd, fused(tanh)), run(odd, stock(tanh)), "width 60");
  // An empty layer: cuBLASLt documents no product of an empty dimension.
  const auto empty = make_inputs({16, 64}, 0, 64, torch::kBFloat16,
                                 torch::kBFloat16, true, 45, cuda);
  EXPECT_NE(lamp::ops::gelu_mlp_path(empty.x, empty.fc_weight,
                                     empty.proj_weight, tanh)
                .find("no empty layer, got hidden 0"),
            std::string::npos);
  expect_bit_equal(run(empty, fused(tanh)), run(empty, stock(tanh)),
                   "hidden 0");
}

TEST(GeluMlp, EpiloguesRunInACapturedGraph_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const lamp_test::Warnings warnings;
  const auto fallbacks = lamp::detail::epilogue_fallback_count().load();
  const torch::Device cuda(torch::kCUDA);
  const auto i = make_inputs({64, 128}, 512, 128, torch::kBFloat16,
                             torch::kBFloat16, true, 45, cuda);
  const auto o = GeluMlpOptions().approximate("tanh");
  auto x = leaf(i.x);
  auto w1 = leaf(i.fc_weight), b1 = leaf(i.fc_bias);
  auto w2 = leaf(i.proj_weight), b2 = leaf(i.proj_bias);
  torch::Tensor y, grad_x, grad_b1;
  const auto step = [&] {
    const auto out = gelu_mlp(x, w1, b1, w2, b2, o);
    const auto loss = (out.to(torch::kFloat) * i.grad).sum();
    const auto grads = torch::autograd::grad({loss}, {x, b1});
    y = out.detach();
    grad_x = grads[0];
    grad_b1 = grads[1];
  };
  lamp_test::capture_refill_replay(cuda, step,
                                   [&] { x.copy_(torch::randn_like(x)); });
  Inputs now = i;
  now.x = x.detach().clone();
  const auto want = run(now, stock(o));
  EXPECT_TRUE(AllClose(y.to(torch::kFloat), want.y.to(torch::kFloat), 0,
                       peak(want.y.to(torch::kFloat)) / 64));
  EXPECT_TRUE(AllClose(grad_x.to(torch::kFloat), want.x.to(torch::kFloat), 0,
                       peak(want.x.to(torch::kFloat)) / 64));
  EXPECT_TRUE(AllClose(grad_b1.to(torch::kFloat),
                       want.fc_bias.to(torch::kFloat), 0,
                       peak(want.fc_bias.to(torch::kFloat)) / 64));
  // The epilogues ran: cuBLASLt refusing one would have warned (and the
  // ATen ops would meet the same bounds).
  EXPECT_EQ(warnings.containing("instead of cuBLASLt"),
            std::vector<std::string>{});
  // Every call, not only the first to warn in this process.
  EXPECT_EQ(lamp::detail::epilogue_fallback_count().load(), fallbacks)
      << "a product ran the ATen ops";
}

} // namespace
