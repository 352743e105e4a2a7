// lamp::ops::linear_bgrad against torch::linear, forward and backward: the
// same ATen ops on the CPU (the same bits), the bias gradient from
// cuBLASLt's BGRADB epilogue on a GPU (the _CUDA tests, against a
// float64 reference with a bound derived below).
#include "lamp/ops/linear_bgrad.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "autograd_nodes.h"
#include "graph_replay.h"
#include "lamp/amp/autocast.h"
#include "lamp/models/gpt.h"
#include "lamp/nn/float8.h"
#include "lamp/ops/gelu_mlp.h"
#include "ops/epilogue_fallbacks.h"
#include "platform/compat.h"
#include "platform/kernel_runs.h"
#include "test_util.h"
#include "tiny_gpt.h"

namespace {

using lamp::ops::linear_bgrad;
using lamp::ops::linear_bgrad_path;
using lamp_test::BitEqual;
using lamp_test::expect_error;

constexpr const char* kNode = "LinearBgradFunction";

struct Inputs {
  torch::Tensor x, weight, bias;
  torch::Tensor grad; // what the loss sends to the output
};

// Unit activations, weights of std 1/sqrt(in), small biases; a gradient
// with a mean away from zero, so that the bias gradients are not sums
// that cancel to nothing.
Inputs make_inputs(std::vector<int64_t> shape, int64_t out,
                   torch::Dtype x_dtype, torch::Dtype weight_dtype, bool bias,
                   uint64_t seed = 0, torch::Device device = torch::kCPU) {
  torch::manual_seed(seed);
  const int64_t in = shape.back();
  Inputs i;
  i.x = torch::randn(shape).to(device, x_dtype);
  i.weight = (torch::randn({out, in}) / std::sqrt(in)).to(device, weight_dtype);
  if (bias) {
    i.bias = (0.1 * torch::randn({out})).to(device, weight_dtype);
  }
  auto out_shape = shape;
  out_shape.back() = out;
  i.grad = (torch::randn(out_shape) + 0.5).to(device);
  return i;
}

struct Outputs {
  torch::Tensor y, x, weight, bias;
};

torch::Tensor leaf(const torch::Tensor& t) {
  return t.defined() ? t.detach().clone().requires_grad_() : torch::Tensor();
}

torch::Tensor grad_of(const torch::Tensor& t) {
  return t.defined() ? t.grad() : torch::Tensor();
}

// torch::linear as the stock layer runs it: autocast's casts, or the
// weight and bias cast to x's dtype without autocast.
torch::Tensor stock(const torch::Tensor& x, const torch::Tensor& w,
                    const torch::Tensor& b) {
  if (lamp::detail::autocast_enabled(x.device().type())) {
    return torch::linear(x, w, b);
  }
  return torch::linear(x, w.to(x.scalar_type()),
                       b.defined() ? b.to(x.scalar_type()) : b);
}

using Linear = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&,
                                 const torch::Tensor&);

// `linear` on fresh leaves of `in`, then the backward of sum(y * grad).
Outputs run(const Inputs& in, Linear linear) {
  Outputs o;
  auto x = leaf(in.x), w = leaf(in.weight), b = leaf(in.bias);
  o.y = linear(x, w, b);
  (o.y.to(torch::kFloat) * in.grad).sum().backward();
  o.y = o.y.detach();
  o.x = grad_of(x);
  o.weight = grad_of(w);
  o.bias = grad_of(b);
  return o;
}

void expect_bit_equal(const Outputs& got, const Outputs& want,
                      const std::string& what) {
  SCOPED_TRACE(what);
  for (const auto& [name, p] : std::vector<
           std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>>>{
           {"y", {got.y, want.y}},
           {"grad x", {got.x, want.x}},
           {"grad weight", {got.weight, want.weight}},
           {"grad bias", {got.bias, want.bias}}}) {
    ASSERT_EQ(p.first.defined(), p.second.defined()) << name;
    if (p.first.defined()) {
      EXPECT_EQ(p.first.scalar_type(), p.second.scalar_type()) << name;
      EXPECT_TRUE(BitEqual(p.first, p.second)) << name;
    }
  }
}

// --- the CPU: torch::linear's ATen ops, its bits ---------------------------

TEST(LinearBgrad, MatchesTorchLinearBitForBit) {
  // addmm and its backward formulas, op for op: not one bit apart, in FP32
  // and FP64, rows of two ranks, widths that are not multiples of 8.
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    for (const auto& shape :
         std::vector<std::vector<int64_t>>{{2, 5, 24}, {7, 13}}) {
      const int64_t in = shape.back();
      const auto i = make_inputs(shape, in + 3, dtype, dtype, true, in);
      const auto got = run(i, linear_bgrad);
      expect_bit_equal(
          got, run(i, stock),
          std::string(c10::toString(dtype)) + " in " + std::to_string(in));
      EXPECT_EQ(got.y.sizes(), i.grad.sizes());
    }
  }
}

TEST(LinearBgrad, TheBiasGradientIsTheGradientsColumnSums) {
  // A bug that fed the bias the wrong sum would match a reference that
  // shares it: the bias's gradient is the output gradient summed over
  // every row, by hand.
  const auto i =
      make_inputs({3, 4, 8}, 6, torch::kDouble, torch::kDouble, true, 2);
  const auto got = run(i, linear_bgrad);
  EXPECT_TRUE(lamp_test::AllClose(
      got.bias, i.grad.to(torch::kDouble).reshape({-1, 6}).sum(0), 1e-12,
      1e-12));
  EXPECT_TRUE(lamp_test::AllClose(
      got.weight,
      i.grad.to(torch::kDouble).reshape({-1, 6}).t().mm(i.x.reshape({-1, 8})),
      1e-12, 1e-12));
}

TEST(LinearBgrad, UnderAutocastTheProductRunsInBF16) {
  // amp-bf16: the op's own casts give autocast's bits; the output in BF16,
  // each gradient in its input's dtype. An FP32 input and a BF16 one (what
  // a fused add and norm hands on).
  for (const auto x_dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto i = make_inputs({3, 4, 32}, 48, x_dtype, torch::kFloat, true, 5);
    lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
    const auto got = run(i, linear_bgrad);
    EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(got.weight.scalar_type(), torch::kFloat);
    EXPECT_EQ(got.bias.scalar_type(), torch::kFloat);
    EXPECT_EQ(got.x.scalar_type(), x_dtype);
    expect_bit_equal(got, run(i, stock), c10::toString(x_dtype));
  }
}

TEST(LinearBgrad, WeightsAreCastToTheInputsDtype) {
  // Without autocast, FP32 parameters beside a BF16 input run in BF16, with
  // a bias and without; each gradient in its input's dtype.
  for (const bool bias : {true, false}) {
    const auto i =
        make_inputs({5, 16}, 8, torch::kBFloat16, torch::kFloat, bias, 6);
    const auto got = run(i, linear_bgrad);
    expect_bit_equal(got, run(i, stock),
                     bias ? "bf16 input, fp32 weights" : "no bias");
    EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(got.weight.scalar_type(), torch::kFloat);
  }
}

TEST(LinearBgrad, WithoutABiasItIsTorchLinear) {
  // Nothing to fuse: torch::linear itself, no node of the op's own.
  for (const bool autocast : {false, true}) {
    c10::optional<lamp::Autocast> guard;
    if (autocast) {
      guard.emplace(torch::kCPU, torch::kBFloat16);
    }
    const auto i =
        make_inputs({4, 16}, 8, torch::kFloat, torch::kFloat, false, 7);
    expect_bit_equal(run(i, linear_bgrad), run(i, stock),
                     autocast ? "autocast" : "fp32");
    EXPECT_EQ(lamp_test::count_nodes_named(
                  linear_bgrad(leaf(i.x), i.weight, i.bias), kNode),
              0);
    EXPECT_EQ(linear_bgrad_path(i.x, i.weight, i.bias),
              "ATen ops: no bias, no bias gradient to fuse");
  }
}

TEST(LinearBgrad, GradientsOnlyWhereAsked) {
  // Each of the three inputs alone asking for a gradient gets it, the
  // stock bits, and the others none.
  const auto i = make_inputs({6, 8}, 16, torch::kFloat, torch::kFloat, true, 8);
  const auto want = run(i, stock);
  for (int asked = 0; asked < 3; ++asked) {
    auto x = asked == 0 ? leaf(i.x) : i.x;
    auto w = asked == 1 ? leaf(i.weight) : i.weight;
    auto b = asked == 2 ? leaf(i.bias) : i.bias;
    const auto y = linear_bgrad(x, w, b);
    EXPECT_EQ(lamp_test::count_nodes_named(y, kNode), 1);
    (y * i.grad).sum().backward();
    EXPECT_EQ(x.grad().defined(), asked == 0);
    EXPECT_EQ(w.grad().defined(), asked == 1);
    EXPECT_EQ(b.grad().defined(), asked == 2);
    const auto& got = asked == 0 ? x.grad() : asked == 1 ? w.grad() : b.grad();
    const auto& expected = asked == 0   ? want.x
                           : asked == 1 ? want.weight
                                        : want.bias;
    EXPECT_TRUE(BitEqual(got, expected)) << "input " << asked;
  }
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(linear_bgrad(leaf(i.x), i.weight, i.bias).requires_grad());
}

TEST(LinearBgrad, RefusesWhatDoesNotFit) {
  const auto i = make_inputs({4, 8}, 16, torch::kFloat, torch::kFloat, true, 9);
  const auto call = [](const torch::Tensor& x, const torch::Tensor& w,
                       const torch::Tensor& b) {
    return [=] { linear_bgrad(x, w, b); };
  };
  expect_error(call(i.x.narrow(1, 0, 7), i.weight, i.bias),
               "lamp::ops::linear_bgrad: x must be [..., 8] (weight's in), "
               "got [4, 7]");
  expect_error(call(i.x, i.weight.reshape({-1}), i.bias),
               "weight must be [out, in], got [128]");
  expect_error(call(i.x.narrow(0, 0, 0), i.weight, i.bias),
               "no rows (x [0, 8]): give at least one row");
  expect_error(call(i.x, i.weight, i.bias.narrow(0, 0, 5)),
               "bias must be [16], got [5]");
  expect_error(call(i.x.to(torch::kLong), i.weight, i.bias),
               "x must be floating point, got Long");
  expect_error(call(i.x, i.weight, i.bias.to(torch::kInt)),
               "bias must be floating point, got Int");
  expect_error(call(i.x, torch::Tensor(), i.bias),
               "x and weight must be given");
  // A tensor on another device (the meta device stands for one) is named
  // before the epilogue is handed its pointer.
  expect_error(call(i.x, i.weight, i.bias.to(torch::kMeta)),
               "bias (meta) must be on x's device (cpu)");
  expect_error(call(i.x, i.weight.to(torch::kMeta), i.bias),
               "weight (meta) must be on x's device (cpu)");
  expect_error([&] { linear_bgrad_path(i.x, i.weight.t(), i.bias); },
               "lamp::ops::linear_bgrad_path: x must be [..., 16]");
}

TEST(LinearBgrad, PathNamesTheATenOpsOnTheCPU) {
  const auto i =
      make_inputs({4, 16}, 8, torch::kFloat, torch::kFloat, true, 10);
  lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
  EXPECT_EQ(linear_bgrad_path(i.x, i.weight, i.bias),
            "ATen ops: the tensors are on cpu, cuBLASLt is CUDA's");
}

TEST(LinearBgrad, GeluMlpsOptionChangesNothingOnTheCPU) {
  // GeluMlpOptions::fused_bias_grad takes effect where the epilogues run:
  // on the CPU the MLP's bits stay the stock composition's.
  torch::manual_seed(11);
  const auto x = torch::randn({6, 16});
  const auto w1 = leaf(torch::randn({64, 16}) / 4);
  const auto b1 = leaf(0.1 * torch::randn({64}));
  const auto w2 = leaf(torch::randn({16, 64}) / 8);
  const auto b2 = leaf(0.1 * torch::randn({16}));
  std::vector<torch::Tensor> grads[2];
  torch::Tensor ys[2];
  for (const bool fused : {false, true}) {
    const auto o =
        lamp::ops::GeluMlpOptions().approximate("tanh").fused_bias_grad(fused);
    ys[fused] = lamp::ops::gelu_mlp(x, w1, b1, w2, b2, o);
    grads[fused] =
        torch::autograd::grad({(ys[fused] * x).sum()}, {w1, b1, w2, b2});
  }
  EXPECT_TRUE(BitEqual(ys[1], ys[0]));
  for (size_t k = 0; k < grads[0].size(); ++k) {
    EXPECT_TRUE(BitEqual(grads[1][k], grads[0][k])) << "parameter " << k;
  }
}

// --- lamp's GPT with GPTOptions::fused_bias_grad ----------------------------

using lamp::models::GPT;
using lamp::models::GPTOptions;
using lamp_test::tiny_gpt;

// Edges from the op's nodes straight into parameters' accumulators: none
// where a CastWeightsOnce cast the parameters (its node comes between).
int edges_into_accumulators(const torch::Tensor& root) {
  int edges = 0;
  lamp_test::for_each_node(root, [&](const torch::autograd::Node& node) {
    if (node.name().find(kNode) == std::string::npos) {
      return;
    }
    for (const auto& edge : node.next_edges()) {
      edges +=
          edge.function != nullptr &&
          edge.function->name().find("AccumulateGrad") != std::string::npos;
    }
  });
  return edges;
}

struct GptStep : lamp_test::GptStep {
  int into_accumulators = 0;
};

GptStep gpt_step(GPT& gpt, const torch::Tensor& tokens) {
  int into_accumulators = 0;
  GptStep s{
      lamp_test::gpt_step(gpt, tokens, kNode, [&](const torch::Tensor& logits) {
        into_accumulators = edges_into_accumulators(logits);
      })};
  s.into_accumulators = into_accumulators;
  return s;
}

// A GPT of `options` and its twin with fused_bias_grad, the same weights.
std::pair<GPT, GPT> twins(const GPTOptions& options) {
  return lamp_test::gpt_twins(options,
                              GPTOptions(options).fused_bias_grad(true));
}

TEST(LinearBgrad, GptWithFusedBiasGradTrainsAsTheUnfusedOne) {
  // fp32 and amp-bf16, with and without biases, beside the fused MLP and
  // the weight casts in one pass, and under activation checkpointing: the
  // same logits and gradients, bit for bit (the same ATen ops on the CPU).
  // Each block's attention runs two of the op's nodes, its unfused MLP two
  // more; the fused MLP takes its own option instead.
  const auto tokens = torch::randint(0, 30, {2, 8}, torch::kLong);
  for (const bool bias : {true, false}) {
    for (const bool fused_mlp : {false, true}) {
      for (const bool weight_cast : {false, true}) {
        for (const bool checkpointing : {false, true}) {
          for (const bool autocast : {false, true}) {
            auto [plain, fused] =
                twins(tiny_gpt()
                          .gelu(lamp::models::GPTGelu::kTanh)
                          .bias(bias)
                          .fused_mlp(fused_mlp)
                          .fused_weight_cast(weight_cast)
                          .activation_checkpointing(checkpointing));
            c10::optional<lamp::Autocast> guard;
            if (autocast) {
              guard.emplace(torch::kCPU, torch::kBFloat16);
            }
            const auto want = gpt_step(plain, tokens);
            const auto got = gpt_step(fused, tokens);
            SCOPED_TRACE(std::string(bias ? "bias" : "no bias") +
                         (fused_mlp ? " fused-mlp" : "") +
                         (weight_cast ? " weight-cast" : "") +
                         (checkpointing ? " checkpointing" : "") +
                         (autocast ? " autocast" : ""));
            EXPECT_TRUE(BitEqual(got.logits, want.logits));
            ASSERT_EQ(got.grads.size(), want.grads.size());
            for (size_t i = 0; i < got.grads.size(); ++i) {
              EXPECT_TRUE(BitEqual(got.grads[i], want.grads[i]))
                  << "parameter " << i;
            }
            const int per_block = bias ? (fused_mlp ? 2 : 4) : 0;
            EXPECT_EQ(got.nodes, checkpointing ? 0 : 2 * per_block);
            EXPECT_EQ(want.nodes, 0);
            // Each node's weight and bias: the guard's casts where it ran.
            const bool guarded = weight_cast && autocast && !checkpointing;
            EXPECT_EQ(got.into_accumulators, guarded ? 0 : 2 * got.nodes);
          }
        }
      }
    }
  }
}

TEST(LinearBgrad, GptLeavesFP8LayersTheirOwn) {
#if !LAMP_TORCH_FLOAT8
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no FP8 dtypes";
#endif
  auto gpt = GPT(tiny_gpt().width(32).heads(2).fused_bias_grad(true));
  lamp::nn::convert_to_float8(*gpt);
  const auto tokens = torch::randint(0, 30, {2, 8}, torch::kLong);
  lamp::Autocast guard(torch::kCPU, torch::kBFloat16);
  EXPECT_EQ(lamp_test::count_nodes_named(gpt->forward(tokens), kNode), 0);
}

// --- CUDA: cuBLASLt's BGRADB epilogue --------------------------------------

// float64 references from the very 16-bit values the GPU read, and the
// bound each result must meet. The products of 16-bit values are exact in
// FP32; an FP32 sum of k of them is off by at most k 2^-24 times the sum
// of their magnitudes (e); the one rounding to the 16-bit dtype then adds
// at most `unit` (2^-8 for BF16's 8 significant bits, 2^-11 for FP16's 11)
// of |value + e|, and half FP16's smallest subnormal near zero. Bound:
// unit |value| + 2 e + 2^-24. ATen's own results must meet the same bound:
// the test checks that too, so that a bound too tight fails on its own
// reference.
struct Bounds {
  torch::Tensor weight, bias;         // float64 references
  torch::Tensor weight_err, bias_err; // the bounds
};

Bounds bounds(const torch::Tensor& x, const torch::Tensor& g16) {
  const auto x64 = x.reshape({-1, x.size(-1)}).to(torch::kDouble);
  const auto g64 = g16.reshape({-1, g16.size(-1)}).to(torch::kDouble);
  const double rows = static_cast<double>(x64.size(0));
  const double unit = g16.scalar_type() == torch::kHalf ? std::ldexp(1.0, -11)
                                                        : std::ldexp(1.0, -8);
  Bounds b;
  b.weight = g64.t().mm(x64);
  b.bias = g64.sum(0);
  const double sum_error = 2 * rows * std::ldexp(1.0, -24);
  const double tiny = std::ldexp(1.0, -24);
  b.weight_err =
      unit * b.weight.abs() + sum_error * g64.abs().t().mm(x64.abs()) + tiny;
  b.bias_err = unit * b.bias.abs() + sum_error * g64.abs().sum(0) + tiny;
  return b;
}

::testing::AssertionResult Within(const torch::Tensor& got,
                                  const torch::Tensor& want,
                                  const torch::Tensor& err) {
  const auto excess = ((got.to(torch::kDouble) - want).abs() - err).max();
  if (excess.item<double>() <= 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "beyond the bound by up to " << excess.item<double>();
}

// While it lives, ATen's 16-bit products keep split-K's partial sums in
// FP32 (by default cuBLAS may round them to 16 bits, which the FP32-sum
// bound above does not allow for; lamp's products never do); LibTorch's
// default again after.
// BF16's switch where the Context has one (LibTorch 2.x; 1.13, which runs
// no CUDA test here, has FP16's only), found by the call compiling.
template <typename Context>
auto allow_bf16_reduced_precision(Context& context, bool allow, int)
    -> decltype(context.setAllowBF16ReductionCuBLAS(allow)) {
  return context.setAllowBF16ReductionCuBLAS(allow);
}
template <typename Context>
void allow_bf16_reduced_precision(Context&, bool, long) {}

struct FP32PartialSums {
  FP32PartialSums() { allow_reduced_precision(false); }
  ~FP32PartialSums() { allow_reduced_precision(true); }
  FP32PartialSums(const FP32PartialSums&) = delete;
  FP32PartialSums& operator=(const FP32PartialSums&) = delete;
  static void allow_reduced_precision(bool allow) {
    allow_bf16_reduced_precision(at::globalContext(), allow, 0);
    at::globalContext().setAllowFP16ReductionCuBLAS(allow);
  }
};

TEST(LinearBgrad, EpilogueMeetsTheBoundOfTheStockOps_CUDA) {
  // The forward and the input's gradient are the stock ops' (the same
  // bits); the weight's and the bias's gradients come from one cuBLASLt
  // product, within the bound above, as ATen's two kernels are.
  LAMP_SKIP_WITHOUT_CUDA();
  const lamp_test::Warnings warnings;
  const auto fallbacks = lamp::detail::epilogue_fallback_count().load();
  const torch::Device cuda(torch::kCUDA);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (const auto& [shape, out] :
         std::vector<std::pair<std::vector<int64_t>, int64_t>>{
             {{1, 16}, 8}, {{37, 64}, 64}, {{4, 256, 384}, 1152}}) {
      const auto i = make_inputs(shape, out, dtype, dtype, true, out, cuda);
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " rows " +
                   std::to_string(i.x.numel() / shape.back()));
      EXPECT_EQ(linear_bgrad_path(i.x, i.weight, i.bias), "cuBLASLt epilogue");
      EXPECT_EQ(lamp_test::count_nodes_named(
                    linear_bgrad(leaf(i.x), i.weight, i.bias), kNode),
                1);
      // Both with ATen's products under the same setting, so that the
      // forward and the input's gradient can be compared bit for bit.
      const FP32PartialSums fp32_partial_sums;
      const auto products =
          lamp::detail::kernel_runs(lamp::detail::KernelPath::kLtEpilogue)
              .load();
      const auto got = run(i, linear_bgrad);
      // The backward's weight and bias gradients in one cuBLASLt product
      // (the ATen ops count none).
      EXPECT_EQ(lamp::detail::kernel_runs(lamp::detail::KernelPath::kLtEpilogue)
                        .load() -
                    products,
                1);
      const auto want = run(i, stock);
      EXPECT_TRUE(BitEqual(got.y, want.y));
      EXPECT_TRUE(BitEqual(got.x, want.x));
      // The gradient the op saw: sum(y * grad) sends grad, cast to y's
      // dtype.
      const auto b = bounds(i.x, i.grad.to(dtype));
      EXPECT_TRUE(Within(got.weight, b.weight, b.weight_err));
      EXPECT_TRUE(Within(got.bias, b.bias, b.bias_err));
      EXPECT_TRUE(Within(want.weight, b.weight, b.weight_err));
      EXPECT_TRUE(Within(want.bias, b.bias, b.bias_err));
    }
  }
  // The epilogue ran: cuBLASLt refusing it would have warned (and the
  // ATen ops would meet the same bounds).
  EXPECT_EQ(warnings.containing("instead of cuBLASLt"),
            std::vector<std::string>{});
  // Every call, not only the first to warn in this process.
  EXPECT_EQ(lamp::detail::epilogue_fallback_count().load(), fallbacks)
      << "a product ran the ATen ops";
}

TEST(LinearBgrad, EpilogueUnderAutocast_CUDA) {
  // amp-bf16 with FP32 parameters: the gradients come back in FP32, within
  // the bound of the BF16 values autocast computed with.
  LAMP_SKIP_WITHOUT_CUDA();
  const lamp_test::Warnings warnings;
  const auto fallbacks = lamp::detail::epilogue_fallback_count().load();
  const auto i = make_inputs({8, 128, 384}, 1152, torch::kFloat, torch::kFloat,
                             true, 41, torch::Device(torch::kCUDA));
  lamp::Autocast guard(torch::kCUDA, torch::kBFloat16);
  EXPECT_EQ(linear_bgrad_path(i.x, i.weight, i.bias), "cuBLASLt epilogue");
  const auto got = run(i, linear_bgrad);
  EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.weight.scalar_type(), torch::kFloat);
  EXPECT_EQ(got.bias.scalar_type(), torch::kFloat);
  const auto b = bounds(i.x.to(torch::kBFloat16), i.grad.to(torch::kBFloat16));
  EXPECT_TRUE(Within(got.weight, b.weight, b.weight_err));
  EXPECT_TRUE(Within(got.bias, b.bias, b.bias_err));
  // The epilogue ran: cuBLASLt refusing it would have warned (and the
  // ATen ops would meet the same bounds).
  EXPECT_EQ(warnings.containing("instead of cuBLASLt"),
            std::vector<std::string>{});
  // Every call, not only the first to warn in this process.
  EXPECT_EQ(lamp::detail::epilogue_fallback_count().load(), fallbacks)
      << "a product ran the ATen ops";
}

TEST(LinearBgrad, WhatTheEpilogueCannotTakeRunsTheATenOps_CUDA) {
  // FP32 and a width that is not a multiple of 8 run torch::linear's ops
  // on the GPU (one warning, its bits), never a crash.
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const auto fp32 =
      make_inputs({16, 64}, 64, torch::kFloat, torch::kFloat, true, 42, cuda);
  EXPECT_EQ(linear_bgrad_path(fp32.x, fp32.weight, fp32.bias),
            "ATen ops: the epilogue takes FP16 and BF16 (autocast's dtypes), "
            "not Float");
  expect_bit_equal(run(fp32, linear_bgrad), run(fp32, stock), "fp32");
  const auto odd = make_inputs({16, 60}, 64, torch::kBFloat16, torch::kBFloat16,
                               true, 43, cuda);
  EXPECT_EQ(linear_bgrad_path(odd.x, odd.weight, odd.bias),
            "ATen ops: the epilogue wants the widths to be multiples of 8, "
            "got in 60, out 64");
  expect_bit_equal(run(odd, linear_bgrad), run(odd, stock), "width 60");
}

TEST(LinearBgrad, EpilogueTakesAViewAlignedOn16Bytes_CUDA) {
  // x a view one row into its storage (128 bytes: 16-byte aligned, not the
  // 256 cuBLASLt's heuristic assumes unless told): the epilogue runs, within
  // the bound, without falling back.
  LAMP_SKIP_WITHOUT_CUDA();
  const lamp_test::Warnings warnings;
  const auto fallbacks = lamp::detail::epilogue_fallback_count().load();
  const torch::Device cuda(torch::kCUDA);
  const auto i = make_inputs({65, 64}, 128, torch::kBFloat16, torch::kBFloat16,
                             true, 47, cuda);
  const auto base = leaf(i.x);
  const auto x = base.narrow(0, 1, 64);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(x.data_ptr()) % 256, 128u);
  auto w = leaf(i.weight), b = leaf(i.bias);
  const auto g = i.grad.narrow(0, 1, 64);
  (linear_bgrad(x, w, b).to(torch::kFloat) * g).sum().backward();
  const auto bnd = bounds(x.detach(), g.to(torch::kBFloat16));
  EXPECT_TRUE(Within(w.grad(), bnd.weight, bnd.weight_err));
  EXPECT_TRUE(Within(b.grad(), bnd.bias, bnd.bias_err));
  EXPECT_EQ(warnings.containing("instead of cuBLASLt"),
            std::vector<std::string>{});
  // Every call, not only the first to warn in this process.
  EXPECT_EQ(lamp::detail::epilogue_fallback_count().load(), fallbacks)
      << "a product ran the ATen ops";
}

TEST(LinearBgrad, EpilogueRunsInACapturedGraph_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const lamp_test::Warnings warnings;
  const auto fallbacks = lamp::detail::epilogue_fallback_count().load();
  const torch::Device cuda(torch::kCUDA);
  const auto i = make_inputs({64, 128}, 256, torch::kBFloat16, torch::kBFloat16,
                             true, 45, cuda);
  auto x = leaf(i.x), w = leaf(i.weight), b = leaf(i.bias);
  torch::Tensor grad_w, grad_b;
  const auto step = [&] {
    const auto loss = (linear_bgrad(x, w, b).to(torch::kFloat) * i.grad).sum();
    const auto grads = torch::autograd::grad({loss}, {w, b});
    grad_w = grads[0];
    grad_b = grads[1];
  };
  lamp_test::capture_refill_replay(cuda, step,
                                   [&] { x.copy_(torch::randn_like(x)); });
  const auto bnd = bounds(x.detach(), i.grad.to(torch::kBFloat16));
  EXPECT_TRUE(Within(grad_w, bnd.weight, bnd.weight_err));
  EXPECT_TRUE(Within(grad_b, bnd.bias, bnd.bias_err));
  // The epilogue ran: cuBLASLt refusing it would have warned (and the
  // ATen ops would meet the same bounds).
  EXPECT_EQ(warnings.containing("instead of cuBLASLt"),
            std::vector<std::string>{});
  // Every call, not only the first to warn in this process.
  EXPECT_EQ(lamp::detail::epilogue_fallback_count().load(), fallbacks)
      << "a product ran the ATen ops";
}

TEST(LinearBgrad, GeluMlpTakesItsSecondBiasGradientFromTheEpilogue_CUDA) {
  // GeluMlpOptions::fused_bias_grad: the second layer's weight and bias
  // gradients from one product, within the bound of the GELU output the op
  // kept, against the option off.
  LAMP_SKIP_WITHOUT_CUDA();
  const lamp_test::Warnings warnings;
  const auto fallbacks = lamp::detail::epilogue_fallback_count().load();
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(46);
  const auto opts = torch::TensorOptions().device(cuda).dtype(torch::kBFloat16);
  const auto x = torch::randn({256, 128}, opts);
  const auto w1 = leaf(torch::randn({512, 128}, opts) / 8);
  const auto b1 = leaf(0.1 * torch::randn({512}, opts));
  const auto w2 = leaf(torch::randn({128, 512}, opts) / 16);
  const auto b2 = leaf(0.1 * torch::randn({128}, opts));
  const auto g = torch::randn({256, 128}, opts) + 0.5;
  const auto base = lamp::ops::GeluMlpOptions().approximate("tanh");
  // cuBLASLt's products with an epilogue, which the ATen ops do not count:
  // the option on runs one more (the second layer's weight and bias
  // gradients), else it did not take effect.
  const auto products = [] {
    return lamp::detail::kernel_runs(lamp::detail::KernelPath::kLtEpilogue)
        .load();
  };
  const auto before_off = products();
  const auto off = torch::autograd::grad(
      {(lamp::ops::gelu_mlp(x, w1, b1, w2, b2, base) * g).sum()}, {w2, b2});
  const auto products_off = products() - before_off;
  const auto before_on = products();
  const auto on = torch::autograd::grad(
      {(lamp::ops::gelu_mlp(
            x, w1, b1, w2, b2,
            lamp::ops::GeluMlpOptions(base).fused_bias_grad(true)) *
        g)
           .sum()},
      {w2, b2});
  const auto products_on = products() - before_on;
  EXPECT_GT(products_off, 0);
  EXPECT_EQ(products_on, products_off + 1)
      << "fused_bias_grad(true) ran no product of its own";
  // The bias gradient needs no GELU output: its bound is g's own.
  const auto bnd = bounds(x.narrow(1, 0, 1), g);
  EXPECT_TRUE(Within(on[1], bnd.bias, bnd.bias_err));
  EXPECT_TRUE(Within(off[1], bnd.bias, bnd.bias_err));
  // The weight gradients: the same product of the same BF16 operands,
  // summed in FP32 in two libraries' orders: a unit in the last place
  // apart (2^-7 of the value at most) where the sums round apart.
  EXPECT_TRUE(lamp_test::AllClose(on[0].to(torch::kFloat),
                                  off[0].to(torch::kFloat), 1.0 / 64, 1e-2));
  // The epilogue ran: cuBLASLt refusing it would have warned (and the
  // ATen ops would meet the same bounds).
  EXPECT_EQ(warnings.containing("instead of cuBLASLt"),
            std::vector<std::string>{});
  // Every call, not only the first to warn in this process.
  EXPECT_EQ(lamp::detail::epilogue_fallback_count().load(), fallbacks)
      << "a product ran the ATen ops";
}

} // namespace
