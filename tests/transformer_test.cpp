// Transformer layers in every precision mode: LayerNorm under CPU autocast
// (which LibTorch 1.13 cannot run with FP32 parameters by itself),
// lamp::nn::RMSNorm, lamp::nn::scaled_dot_product_attention, and a small
// decoder block with tied embeddings trained by TrainStep in each mode.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lamp/amp/autocast.h"
#include "lamp/amp/half.h"
#include "lamp/amp/precision.h"
#include "lamp/amp/precision_support.h"
#include "lamp/amp/report.h"
#include "lamp/amp/train_step.h"
#include "lamp/nn/attention.h"
#include "lamp/nn/linear.h"
#include "lamp/nn/rms_norm.h"
#include "lamp/optim/decay_groups.h"
#include "lamp/training/schedule.h"
#include "nn/math_attention.h"
#include "test_util.h"

namespace {

using lamp::Precision;

// ------------------------------------------------------------------ RMSNorm

// The formula in FP64: x / sqrt(mean(x^2) + eps) * weight over the last dim.
torch::Tensor rms_reference(const torch::Tensor& x, const torch::Tensor& w,
                            double eps) {
  const auto d = x.to(torch::kDouble);
  return d / (d.pow(2).mean(-1, true) + eps).sqrt() * w.to(torch::kDouble);
}

TEST(RMSNorm, MatchesTheFormulaWithPythonsParameterAndEps) {
  torch::manual_seed(2);
  lamp::nn::RMSNorm norm(std::vector<int64_t>{6});
  {
    torch::NoGradGuard no_grad;
    norm->weight.uniform_(0.5, 1.5);
  }
  // Python's state dict: one tensor, "weight".
  const auto params = norm->named_parameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params.keys()[0], "weight");
  const auto x = torch::randn({3, 4, 6}) * 3;
  // eps unset: the machine epsilon of the input's dtype (2^-23 in FP32).
  EXPECT_TRUE(lamp_test::AllClose(norm(x).to(torch::kDouble),
                                  rms_reference(x, norm->weight, 1.1920929e-07),
                                  1e-6, 1e-7));
  // Activations whose mean square is below eps: the default eps shows.
  const auto small = torch::randn({2, 6}) * 1e-4;
  EXPECT_TRUE(lamp_test::AllClose(
      norm(small).to(torch::kDouble),
      rms_reference(small, norm->weight, 1.1920929e-07), 1e-5, 1e-9));
  lamp::nn::RMSNorm wide(lamp::nn::RMSNormOptions({4, 6}).eps(0.5));
  EXPECT_TRUE(lamp_test::AllClose(
      wide(x).to(torch::kDouble),
      (x.to(torch::kDouble) /
       (x.to(torch::kDouble).pow(2).mean({-2, -1}, true) + 0.5).sqrt()),
      1e-6, 1e-7));
  // Without the affine scale: no parameter at all (Python's weight=None,
  // absent from its state dict), and the plain normalisation.
  lamp::nn::RMSNorm bare(
      lamp::nn::RMSNormOptions({6}).eps(0.5).elementwise_affine(false));
  EXPECT_TRUE(bare->named_parameters().is_empty());
  EXPECT_FALSE(bare->weight.defined());
  EXPECT_TRUE(lamp_test::AllClose(
      bare(x).to(torch::kDouble),
      rms_reference(x, torch::ones({6}, torch::kDouble), 0.5), 1e-6, 1e-7));
  // A BF16 input is normalised in FP32 and rounded once to BF16: within
  // half a BF16 ulp (2^-8 relative) of the formula on the BF16 values.
  const auto b = x.to(torch::kBFloat16);
  const auto y = norm(b);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(lamp_test::AllClose(y.to(torch::kDouble),
                                  rms_reference(b, norm->weight, 1.1920929e-07),
                                  std::ldexp(1.0, -8), 1e-6));
  // Its default eps is FP32's too, as Python's (the dtype it computes in):
  // at a GPT-2 embedding's scale (RMS 0.02) BF16's own 2^-7 would move the
  // output by 80%, far past the tolerance.
  const auto tiny = (torch::randn({3, 6}) * 0.02).to(torch::kBFloat16);
  EXPECT_TRUE(
      lamp_test::AllClose(norm(tiny).to(torch::kDouble),
                          rms_reference(tiny, norm->weight, 1.1920929e-07),
                          std::ldexp(1.0, -8), 1e-6));
  // Gradients reach the input and the weight.
  const auto g = x.clone().requires_grad_();
  norm(g).pow(2).sum().backward();
  EXPECT_TRUE(g.grad().defined());
  EXPECT_TRUE(norm->weight.grad().defined());
  EXPECT_THROW(norm(torch::randn({3, 5})), c10::Error);
  const auto message = lamp_test::error_of([&] { norm(torch::randn({3, 5})); });
  EXPECT_NE(message.find("normalized_shape [6] must be the trailing sizes of "
                         "the input, whose sizes are [3, 5]"),
            std::string::npos)
      << message;
  // An eps that is negative or not finite made rows NaN, without a word;
  // 0 is Python's too.
  for (const double eps :
       {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    const auto refused = lamp_test::error_of(
        [&] { lamp::nn::rms_norm(x, {6}, norm->weight, eps); });
    EXPECT_NE(refused.find("lamp::nn::rms_norm: eps must be finite and >= 0"),
              std::string::npos)
        << refused;
  }
  EXPECT_TRUE(
      lamp::nn::rms_norm(x, {6}, {}, 0.0).isfinite().all().item<bool>());
}

TEST(RMSNorm, IsKeptInFp32AsTheOtherNorms) {
  torch::nn::Sequential model(torch::nn::Linear(4, 4),
                              lamp::nn::RMSNorm(std::vector<int64_t>{4}),
                              torch::nn::Linear(4, 2));
  lamp::network_to_half(
      model, lamp::HalfOptions(torch::kBFloat16).keep_norm_fp32(true));
  const auto params = model->named_parameters();
  EXPECT_EQ(params["0.weight"].scalar_type(), torch::kBFloat16);
  EXPECT_EQ(params["1.weight"].scalar_type(), torch::kFloat);
  EXPECT_EQ(params["2.weight"].scalar_type(), torch::kBFloat16);
  // The precision report says why each FP32 tensor is FP32.
  model[2]->to(torch::kFloat);
  std::map<std::string, std::string> reasons;
  for (const auto& row : lamp::precision_report(*model).tensors) {
    reasons[row.name] = row.kept_fp32_reason;
  }
  EXPECT_EQ(reasons["0.weight"], "");
  EXPECT_EQ(reasons["1.weight"], "a norm");
  EXPECT_EQ(reasons["2.weight"], "chosen");
  model[2]->to(torch::kBFloat16);
  // It runs with its FP32 weight on any LibTorch: no mixed-dtype kernel.
  const auto out = model->forward(torch::randn({2, 4}, torch::kBFloat16));
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

// ---------------------------------------------------------------- attention

torch::Tensor attention_reference(const torch::Tensor& q,
                                  const torch::Tensor& k,
                                  const torch::Tensor& v,
                                  const torch::Tensor& keep) {
  const auto d = q.to(torch::kDouble);
  auto scores =
      d.matmul(k.to(torch::kDouble).transpose(-2, -1)) / std::sqrt(q.size(-1));
  scores = scores.masked_fill(keep.logical_not(),
                              -std::numeric_limits<double>::infinity());
  return scores.softmax(-1).matmul(v.to(torch::kDouble));
}

// Both ways lamp computes attention, so that each is checked on every
// LibTorch: the public function (LibTorch's fused kernel on 2.x, lamp's
// formula on 1.13) and lamp's formula itself.
using AttentionFn = std::function<torch::Tensor(
    const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
    const torch::Tensor&, double, bool)>;

std::vector<std::pair<std::string, AttentionFn>> attention_paths() {
  return {{"lamp::nn::scaled_dot_product_attention",
           lamp::nn::scaled_dot_product_attention},
          {"lamp::detail::math_attention", lamp::detail::math_attention}};
}

TEST(Attention, MatchesTheFormulaCausalMaskedAndAdditive) {
  torch::manual_seed(4);
  const auto q = torch::randn({2, 3, 5, 8});
  const auto k = torch::randn({2, 3, 7, 8});
  const auto v = torch::randn({2, 3, 7, 4});
  const auto all = torch::ones({5, 7}, torch::kBool);
  const auto causal = all.tril();
  const auto keep = torch::rand({5, 7}) > 0.3;
  keep.select(1, 0).fill_(true); // every query attends somewhere
  const auto additive = torch::zeros({5, 7}).masked_fill(
      keep.logical_not(), -std::numeric_limits<float>::infinity());
  for (const auto& [name, attention] : attention_paths()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(lamp_test::AllClose(
        attention(q, k, v, {}, 0.0, false).to(torch::kDouble),
        attention_reference(q, k, v, all), 1e-5, 1e-6));
    EXPECT_TRUE(lamp_test::AllClose(
        attention(q, k, v, {}, 0.0, true).to(torch::kDouble),
        attention_reference(q, k, v, causal), 1e-5, 1e-6));
    EXPECT_TRUE(lamp_test::AllClose(
        attention(q, k, v, keep, 0.0, false).to(torch::kDouble),
        attention_reference(q, k, v, keep), 1e-5, 1e-6));
    EXPECT_TRUE(lamp_test::AllClose(
        attention(q, k, v, additive, 0.0, false).to(torch::kDouble),
        attention_reference(q, k, v, keep), 1e-5, 1e-6));
  }
  // A query whose every key is masked (a padded row) gets zero weights,
  // as Python's math path and fused kernels give it, and no NaN reaches
  // the output or any gradient.
  const auto none = keep.clone();
  none.select(0, 2).fill_(false);
  const auto none_additive = torch::zeros({5, 7}).masked_fill(
      none.logical_not(), -std::numeric_limits<float>::infinity());
  for (const auto& [name, attention] : attention_paths()) {
    for (const auto& mask : {none, none_additive}) {
      SCOPED_TRACE(name + (mask.scalar_type() == torch::kBool
                               ? ", a boolean mask"
                               : ", an additive mask"));
      const auto qg = q.clone().requires_grad_();
      const auto kg = k.clone().requires_grad_();
      const auto vg = v.clone().requires_grad_();
      const auto out = attention(qg, kg, vg, mask, 0.0, false);
      EXPECT_TRUE(
          lamp_test::BitEqual(out.select(2, 2), torch::zeros({2, 3, 4})));
      EXPECT_TRUE(lamp_test::AllClose(
          out.narrow(2, 0, 2).to(torch::kDouble),
          attention_reference(q, k, v, keep).narrow(2, 0, 2), 1e-5, 1e-6));
      out.pow(2).sum().backward();
      for (const auto* g : {&qg, &kg, &vg}) {
        EXPECT_TRUE(torch::isfinite(g->grad()).all().item<bool>());
      }
    }
  }
  // Shapes that do not fit, and a causal call with a mask, are named.
  EXPECT_NE(lamp_test::error_of([&] {
              lamp::nn::scaled_dot_product_attention(q, k.narrow(-1, 0, 4), v);
            }).find("do not fit"),
            std::string::npos);
  EXPECT_NE(lamp_test::error_of([&] {
              lamp::nn::scaled_dot_product_attention(q, k, v, keep, 0.0, true);
            }).find("is_causal and attn_mask exclude each other"),
            std::string::npos);
  // Leading sizes that do not broadcast (grouped keys not repeated), a
  // mask that does not broadcast to [L, S], and a mask of integers: named
  // by lamp, not by matmul or ATen's kernels. One key head broadcasts.
  EXPECT_NE(lamp_test::error_of([&] {
              lamp::nn::scaled_dot_product_attention(q, k.narrow(1, 0, 2),
                                                     v.narrow(1, 0, 2));
            }).find("differ in their leading sizes"),
            std::string::npos);
  EXPECT_EQ(lamp_test::error_of([&] {
              lamp::nn::scaled_dot_product_attention(q, k.narrow(1, 0, 1),
                                                     v.narrow(1, 0, 1));
            }),
            "");
  for (const auto& mask :
       {torch::ones({5, 6}, torch::kBool), torch::ones({4, 7}, torch::kBool),
        torch::ones({3, 3, 5, 7}, torch::kBool)}) {
    EXPECT_NE(lamp_test::error_of([&] {
                lamp::nn::scaled_dot_product_attention(q, k, v, mask);
              }).find("does not broadcast to the scores [..., L, S]"),
              std::string::npos)
        << mask.sizes();
  }
  EXPECT_NE(lamp_test::error_of([&] {
              lamp::nn::scaled_dot_product_attention(q, k, v,
                                                     keep.to(torch::kLong));
            }).find("attn_mask must be bool (true: attend), FP32"),
            std::string::npos);
  // Heads of size 0: lamp's math path gave NaN (0 * an infinite scale).
  EXPECT_NE(lamp_test::error_of([&] {
              lamp::nn::scaled_dot_product_attention(q.narrow(-1, 0, 0),
                                                     k.narrow(-1, 0, 0), v);
            }).find("has heads of size 0 (E)"),
            std::string::npos);
}

// Attention dropout drops weights at random and rescales the rest: two
// calls differ, and the mean of many is the output without dropout.
TEST(Attention, DropoutIsRandomAndUnbiased) {
  torch::manual_seed(31);
  const auto q = torch::randn({1, 2, 4, 8});
  const auto k = torch::randn({1, 2, 6, 8});
  const auto v = torch::randn({1, 2, 6, 4});
  for (const auto& [name, attention] : attention_paths()) {
    SCOPED_TRACE(name);
    const auto exact = attention(q, k, v, {}, 0.0, false).to(torch::kDouble);
    const auto once = attention(q, k, v, {}, 0.5, false);
    EXPECT_FALSE(torch::allclose(once, attention(q, k, v, {}, 0.5, false)));
    auto sum = torch::zeros_like(exact);
    const int draws = 4000;
    for (int i = 0; i < draws; ++i) {
      sum += attention(q, k, v, {}, 0.5, false).to(torch::kDouble);
    }
    // Each draw's element has a standard deviation below max|v| (about 3
    // here); over 4000 draws the mean's is below 0.05. Dropout left out, or
    // the kept weights not rescaled by 1 / (1 - p), is off by a large part of
    // the output itself.
    EXPECT_LT((sum / draws - exact).abs().max().item<double>(), 0.15)
        << "largest output " << exact.abs().max().item<double>();
  }
}

// The guard allows only the backends it is given, nests, and restores the
// switches it found, on exceptions too; a backend the LibTorch lacks is
// refused before any switch changes.
// The op report names the attention kernel that ran (the backend), with
// its input's dtype, forward and backward.
TEST(Attention, TheOpReportNamesTheKernelAndItsDtype) {
  torch::manual_seed(6);
  const auto q = torch::randn({2, 2, 8, 16}, torch::kBFloat16).requires_grad_();
  const auto k = torch::randn({2, 2, 8, 16}, torch::kBFloat16);
  const auto v = torch::randn({2, 2, 8, 16}, torch::kBFloat16);
  const auto ops = lamp::op_precision_report([&] {
    lamp::nn::scaled_dot_product_attention(q, k, v, {}, 0.0, true)
        .sum()
        .backward();
  });
  std::vector<std::string> attention;
  for (const auto& op : ops.calls) {
    if (op.first.find("attention") != std::string::npos) {
      attention.push_back(op.first);
      EXPECT_EQ(op.second.count("BFloat16"), 1u) << ops.to_string();
      EXPECT_EQ(op.second.size(), 1u) << ops.to_string();
    }
  }
  ASSERT_FALSE(attention.empty()) << ops.to_string();
  if (lamp::nn::fused_attention_available()) {
    // LibTorch 2.x's CPU kernel, and its backward.
    EXPECT_NE(
        ops.calls.count("aten::_scaled_dot_product_flash_attention_for_cpu"),
        0u)
        << ops.to_string();
  } else {
    EXPECT_EQ(attention, std::vector<std::string>{"lamp::math_attention"});
    EXPECT_EQ(ops.count("lamp::math_attention", torch::kBFloat16), 1);
  }
  // lamp's formula (what runs on LibTorch 1.13) under CPU autocast: its own
  // scope is counted once, with the dtype it was given, and its two
  // products run in autocast's BF16.
  const auto q32 = torch::randn({2, 2, 8, 16});
  const auto autocast_ops = lamp::op_precision_report([&] {
    lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
    lamp::detail::math_attention(q32, q32, q32, {}, 0.0, true);
  });
  EXPECT_EQ(autocast_ops.count("lamp::math_attention", torch::kFloat), 1)
      << autocast_ops.to_string();
  EXPECT_EQ(autocast_ops.total(torch::kBFloat16), 2)
      << autocast_ops.to_string();
  EXPECT_EQ(autocast_ops.total(torch::kFloat), 1) << autocast_ops.to_string();
}

TEST(Attention, BackendGuardRestoresTheSwitches) {
  using lamp::nn::SdpaBackend;
  const auto before = lamp::nn::enabled_sdpa_backends();
  EXPECT_NE(std::find(before.begin(), before.end(), SdpaBackend::kMath),
            before.end());
  {
    lamp::nn::SdpaBackendGuard only_math({SdpaBackend::kMath});
    EXPECT_EQ(lamp::nn::enabled_sdpa_backends(),
              std::vector<SdpaBackend>{SdpaBackend::kMath});
    // Attention runs under it.
    const auto q = torch::randn({1, 2, 3, 4});
    EXPECT_TRUE(lamp_test::AllClose(
        lamp::nn::scaled_dot_product_attention(q, q, q).to(torch::kDouble),
        attention_reference(q, q, q, torch::ones({3, 3}, torch::kBool)), 1e-5,
        1e-6));
    try {
      lamp::nn::SdpaBackendGuard nested({SdpaBackend::kMath});
      TORCH_CHECK(false, "inside the nested guard");
    } catch (const c10::Error&) {
    }
    EXPECT_EQ(lamp::nn::enabled_sdpa_backends(),
              std::vector<SdpaBackend>{SdpaBackend::kMath});
  }
  EXPECT_EQ(lamp::nn::enabled_sdpa_backends(), before);
  EXPECT_NE(lamp_test::error_of([] {
              lamp::nn::SdpaBackendGuard none({});
            }).find("give at least one backend"),
            std::string::npos);
  if (!lamp::nn::fused_attention_available()) {
    EXPECT_NE(lamp_test::error_of([] {
                lamp::nn::SdpaBackendGuard flash({SdpaBackend::kFlash});
              })
                  .find("has no 'flash' attention backend; LibTorch 1.13 has "
                        "only the math formula"),
              std::string::npos);
    EXPECT_EQ(lamp::nn::enabled_sdpa_backends(), before);
  } else {
    lamp::nn::SdpaBackendGuard fused(
        {SdpaBackend::kFlash, SdpaBackend::kMemoryEfficient});
    const auto now = lamp::nn::enabled_sdpa_backends();
    EXPECT_EQ(std::find(now.begin(), now.end(), SdpaBackend::kMath), now.end());
    EXPECT_NE(std::find(now.begin(), now.end(), SdpaBackend::kFlash),
              now.end());
  }
  EXPECT_EQ(lamp::nn::to_string(SdpaBackend::kMemoryEfficient),
            "memory-efficient");
}

// Every backend's name reads back as that backend; an unknown name is
// refused with the names that work.
TEST(Attention, BackendNamesReadBack) {
  using lamp::nn::SdpaBackend;
  for (const auto backend : {SdpaBackend::kFlash, SdpaBackend::kMemoryEfficient,
                             SdpaBackend::kCuDNN, SdpaBackend::kMath}) {
    EXPECT_EQ(lamp::nn::parse_sdpa_backend(lamp::nn::to_string(backend)),
              backend);
  }
  const auto message =
      lamp_test::error_of([] { lamp::nn::parse_sdpa_backend("fast"); });
  EXPECT_NE(message.find("unknown attention backend 'fast'; use flash, "
                         "memory-efficient, cudnn or math"),
            std::string::npos)
      << message;
}

// ------------------------------------------------------------------- linear

// lamp::nn::linear gives torch::nn::Linear's result in FP32 for inputs of
// every rank, and the same gradients. The only difference allowed is the
// rounding of the bias's one addition (ATen folds it into the product), so
// 1e-6 relative to values of order one.
TEST(Linear, MatchesTheModuleInFp32OnEveryRank) {
  torch::manual_seed(21);
  torch::nn::Linear layer(16, 24);
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {16}, {5, 16}, {3, 5, 16}, {2, 3, 5, 16}}) {
    const auto x = torch::randn(shape, torch::requires_grad());
    const auto ours = lamp::nn::linear(x, layer);
    const auto theirs = layer->forward(x);
    ASSERT_EQ(ours.sizes(), theirs.sizes());
    EXPECT_TRUE(torch::allclose(ours, theirs, 1e-6, 1e-6));
    const auto g = torch::randn_like(ours);
    const auto our_grads =
        torch::autograd::grad({ours}, {x, layer->weight, layer->bias}, {g});
    const auto their_grads =
        torch::autograd::grad({theirs}, {x, layer->weight, layer->bias}, {g});
    for (size_t i = 0; i < our_grads.size(); ++i) {
      EXPECT_TRUE(torch::allclose(our_grads[i], their_grads[i], 1e-6, 1e-6))
          << "gradient " << i << " of an input " << x.sizes();
    }
  }
  torch::nn::Linear no_bias(torch::nn::LinearOptions(16, 8).bias(false));
  const auto x = torch::randn({4, 3, 16});
  EXPECT_TRUE(torch::equal(lamp::nn::linear(x, no_bias), no_bias->forward(x)));
}

// Under CPU autocast the bias is cast with the input and the weight: the
// result is, bit for bit, ATen's linear of the three in BF16 (the op
// autocast forwards to), a BF16 tensor; the gradients reach the FP32
// parameters in FP32. torch::nn::Linear's 3-D path instead adds the FP32
// bias to a BF16 product in FP32, which rounds differently.
TEST(Linear, UnderCpuAutocastTheBiasIsCastWithTheProduct) {
  torch::manual_seed(22);
  torch::nn::Linear layer(32, 48);
  const auto x = torch::randn({4, 6, 32});
  torch::Tensor ours;
  {
    lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
    ours = lamp::nn::linear(x, layer);
  }
  const auto expected =
      torch::linear(x.to(torch::kBFloat16), layer->weight.to(torch::kBFloat16),
                    layer->bias.to(torch::kBFloat16));
  EXPECT_EQ(ours.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(ours, expected));
  ours.to(torch::kFloat).sum().backward();
  EXPECT_EQ(layer->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(layer->bias.grad().scalar_type(), torch::kFloat);
  // d(sum)/d(bias) is the number of rows, 24, exact in BF16.
  EXPECT_TRUE(torch::equal(layer->bias.grad(), torch::full({48}, 24.0)));
}

TEST(Linear, RefusesShapesThatDoNotFit) {
  const auto w = torch::randn({8, 4});
  lamp_test::expect_error(
      [&] {
        lamp::nn::linear(torch::randn({2, 5}), w);
      },
      "lamp::nn::linear: an input [..., 4] fits the weight [8, 4], got [2, 5]");
  lamp_test::expect_error(
      [&] {
        lamp::nn::linear(torch::randn({2, 4}), torch::randn({8}));
      },
      "the weight must be [out, in], got [8]");
  lamp_test::expect_error(
      [&] {
        lamp::nn::linear(torch::randn({2, 4}), w, torch::randn({4}));
      },
      "the bias must be [8], got [4]");
  lamp_test::expect_error(
      [&] {
        lamp::nn::linear(torch::randn({2, 4}), torch::nn::Linear(nullptr));
      },
      "the torch::nn::Linear is empty");
}

// ----------------------------------------------- norms under CPU autocast

// LayerNorm and GroupNorm with FP32 parameters take the BF16 activations a
// Linear makes under CPU autocast, on every LibTorch (1.13 through lamp's
// FP32 kernels), forward and backward.
TEST(AutocastNorms, LayerNormAndGroupNormTakeBf16ActivationsOnTheCpu) {
  torch::manual_seed(6);
  torch::nn::Linear linear(8, 8);
  torch::nn::LayerNorm layer_norm(torch::nn::LayerNormOptions({8}));
  torch::nn::GroupNorm group_norm(torch::nn::GroupNormOptions(2, 8));
  const auto x = torch::randn({4, 8});
  torch::Tensor expected_ln, expected_gn, hidden;
  {
    lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
    hidden = linear(x);
    ASSERT_EQ(hidden.scalar_type(), torch::kBFloat16);
    const auto ln = layer_norm(hidden);
    const auto gn = group_norm(hidden);
    // The norm of the BF16 activations, computed in FP32 (within a BF16
    // rounding of the output where a LibTorch returns BF16).
    const auto wide = hidden.to(torch::kFloat);
    expected_ln = torch::layer_norm(wide, {8}, layer_norm->weight,
                                    layer_norm->bias, 1e-5);
    expected_gn =
        torch::group_norm(wide, 2, group_norm->weight, group_norm->bias, 1e-5);
    EXPECT_TRUE(lamp_test::AllClose(ln.to(torch::kFloat), expected_ln,
                                    std::ldexp(1.0, -8), 1e-6));
    EXPECT_TRUE(lamp_test::AllClose(gn.to(torch::kFloat), expected_gn,
                                    std::ldexp(1.0, -8), 1e-6));
    (ln.to(torch::kFloat).sum() + gn.to(torch::kFloat).sum()).backward();
  }
  EXPECT_TRUE(linear->weight.grad().defined());
  EXPECT_TRUE(layer_norm->weight.grad().defined());
  EXPECT_TRUE(group_norm->weight.grad().defined());
  EXPECT_EQ(layer_norm->weight.grad().scalar_type(), torch::kFloat);
  // Outside autocast nothing changes: a BF16 input with FP32 parameters is
  // the caller's choice, refused where the LibTorch cannot run it.
  if (!lamp::mixed_dtype_norm_available(torch::kCPU, torch::kBFloat16)) {
    EXPECT_THROW(layer_norm(hidden.detach()), c10::Error);
  }
}

// ------------------------------------------------ a decoder block, trained

// Embedding -> pre-norm causal self-attention with QK-norm -> pre-norm GELU
// MLP -> norm -> output head tied to the embedding: the layers of a GPT,
// small. QK-norm (the queries and keys normalised right after their
// projection, as OLMo and ViT-22B do) puts a norm on a Linear's output,
// 16-bit under autocast; the pre-norms see the FP32 residual stream.
struct TinyDecoderImpl : torch::nn::Module {
  static constexpr int64_t kVocab = 16, kWidth = 16, kHeads = 2;
  explicit TinyDecoderImpl(bool rms)
      : embed(register_module("embed", torch::nn::Embedding(kVocab, kWidth))),
        qkv(register_module("qkv", torch::nn::Linear(kWidth, 3 * kWidth))),
        proj(register_module("proj", torch::nn::Linear(kWidth, kWidth))),
        fc(register_module("fc", torch::nn::Linear(kWidth, 4 * kWidth))),
        fc_out(
            register_module("fc_out", torch::nn::Linear(4 * kWidth, kWidth))) {
    const auto norm = [&](const std::string& name,
                          int64_t size) -> std::shared_ptr<torch::nn::Module> {
      if (rms) {
        return register_module(name,
                               lamp::nn::RMSNorm(std::vector<int64_t>{size}));
      }
      return register_module(
          name, torch::nn::LayerNorm(torch::nn::LayerNormOptions({size})));
    };
    norms = {norm("norm1", kWidth), norm("norm2", kWidth),
             norm("norm_f", kWidth), norm("q_norm", kWidth / kHeads),
             norm("k_norm", kWidth / kHeads)};
  }
  torch::Tensor normed(size_t i, const torch::Tensor& x) {
    if (auto* ln = norms[i]->as<torch::nn::LayerNorm>()) {
      return ln->forward(x);
    }
    return norms[i]->as<lamp::nn::RMSNorm>()->forward(x);
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    const int64_t b = tokens.size(0), t = tokens.size(1);
    auto x = embed(tokens);
    auto parts = qkv(normed(0, x)).chunk(3, -1);
    const auto heads = [&](const torch::Tensor& p) {
      return p.reshape({b, t, kHeads, kWidth / kHeads}).transpose(1, 2);
    };
    auto att = lamp::nn::scaled_dot_product_attention(
        normed(3, heads(parts[0])), normed(4, heads(parts[1])), heads(parts[2]),
        {}, 0.0, true);
    x = x + proj(att.transpose(1, 2).reshape({b, t, kWidth}));
    x = x + fc_out(torch::gelu(fc(normed(1, x))));
    // The output head is the embedding, tied as nanoGPT ties them: one
    // tensor, gradients from both uses.
    return torch::nn::functional::linear(normed(2, x), embed->weight);
  }
  torch::nn::Embedding embed;
  torch::nn::Linear qkv, proj, fc, fc_out;
  std::vector<std::shared_ptr<torch::nn::Module>> norms;
};
TORCH_MODULE(TinyDecoder);

class DecoderInEveryMode
    : public ::testing::TestWithParam<std::tuple<Precision, bool>> {};

// Every mode either trains the block (the loss of a fixed batch falls, the
// weights stay finite) or refuses before the first step naming the mode and
// what to use instead; never a LibTorch error from inside a step.
TEST_P(DecoderInEveryMode, TrainsOrRefusesBeforeTheFirstStep) {
  const auto precision = std::get<0>(GetParam());
  const bool rms = std::get<1>(GetParam());
  torch::manual_seed(8);
  TinyDecoder model(rms);
  // Next-token prediction on a repeating sequence: learnable.
  const auto sequence = torch::arange(12).remainder(5);
  const auto tokens = sequence.slice(0, 0, 11).unsqueeze(0).repeat({4, 1});
  const auto targets = sequence.slice(0, 1, 12).unsqueeze(0).repeat({4, 1});
  const auto make = [](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::AdamW>(
        std::move(params), torch::optim::AdamWOptions(1e-2));
  };
  std::unique_ptr<lamp::TrainStep> step;
  try {
    step = std::make_unique<lamp::TrainStep>(model.ptr(), make,
                                             lamp::TrainStepOptions(precision));
  } catch (const c10::Error& e) {
    // The refusals of a mode this LibTorch or CPU cannot run: named.
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + lamp::to_string(precision) + "'"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("amp-bf16"), std::string::npos) << what;
    EXPECT_TRUE(lamp::uses_fp16(precision)) << what;
    return;
  }
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    const auto result = step->step([&] {
      const auto logits = model->forward(tokens).to(torch::kFloat);
      return torch::nn::functional::cross_entropy(
          logits.reshape({-1, TinyDecoderImpl::kVocab}), targets.reshape(-1));
    });
    const double loss = result.loss.item<double>();
    ASSERT_TRUE(std::isfinite(loss)) << "step " << i;
    (i == 0 ? first : last) = loss;
  }
  EXPECT_LT(last, 0.5 * first);
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

INSTANTIATE_TEST_SUITE_P(
    , DecoderInEveryMode,
    ::testing::Combine(::testing::Values(Precision::kFP32, Precision::kTF32,
                                         Precision::kAMP, Precision::kAMPBF16,
                                         Precision::kHalf, Precision::kBF16,
                                         Precision::kAuto),
                       ::testing::Bool()),
    [](const auto& info) {
      std::string name = lamp::to_string(std::get<0>(info.param));
      for (auto& c : name) {
        c = c == '-' ? '_' : c;
      }
      return name + (std::get<1>(info.param) ? "_rmsnorm" : "_layernorm");
    });

// --------------------------------------------- the AdamW recipe of GPTs

// nanoGPT's rule: biases and norms take no decay, the tensors of 2+
// dimensions (embeddings included) do; exempt_embeddings exempts those too.
TEST(DecayGroups, ExemptBiasesAndNormsAndHoldTheMasters) {
  TinyDecoder model(false);
  const auto names = lamp::optim::no_decay_names(*model);
  const std::set<std::string> expected = {
      "qkv.bias",      "proj.bias",   "fc.bias",       "fc_out.bias",
      "norm1.weight",  "norm1.bias",  "norm2.weight",  "norm2.bias",
      "norm_f.weight", "norm_f.bias", "q_norm.weight", "q_norm.bias",
      "k_norm.weight", "k_norm.bias"};
  EXPECT_EQ(names, expected);
  auto with_embeddings = expected;
  with_embeddings.insert("embed.weight");
  EXPECT_EQ(
      lamp::optim::no_decay_names(
          *model, lamp::optim::DecayRuleOptions().exempt_embeddings(true)),
      with_embeddings);
  for (const bool rms : {true}) {
    TinyDecoder with_rms(rms);
    EXPECT_EQ(lamp::optim::no_decay_names(*with_rms).count("norm1.weight"), 1u);
  }
  // A weight tied to an embedding is one tensor, named once, under its first
  // name (here the Linear's, as lamp::unique_named_parameters keeps it): it
  // decays by the 2-D rule, and with exempt_embeddings it takes no decay
  // because the embedding owns it. The Linear's own weight decays.
  torch::nn::Embedding embedding(5, 4);
  torch::nn::Linear linear(torch::nn::LinearOptions(4, 5).bias(false));
  linear->register_parameter("tied", embedding->weight);
  torch::nn::Sequential tied(linear, embedding);
  EXPECT_EQ(lamp::optim::no_decay_names(*tied), std::set<std::string>{});
  EXPECT_EQ(lamp::optim::no_decay_names(
                *tied, lamp::optim::DecayRuleOptions().exempt_embeddings(true)),
            std::set<std::string>{"0.tied"});

  // In "bf16" the groups hold the FP32 masters, by the model's names.
  const auto defaults = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  lamp::TrainStep step(
      model.ptr(),
      [&](const lamp::NamedParameters& params) {
        return std::make_unique<torch::optim::AdamW>(
            lamp::optim::decay_groups(params, names, defaults), defaults);
      },
      lamp::TrainStepOptions(Precision::kBF16));
  auto& groups = step.optimizer().param_groups();
  ASSERT_EQ(groups.size(), 2u);
  // embed, qkv, proj, fc, fc_out weights
  EXPECT_EQ(groups[0].params().size(), 5u);
  EXPECT_EQ(groups[1].params().size(), expected.size());
  EXPECT_EQ(static_cast<torch::optim::AdamWOptions&>(groups[0].options())
                .weight_decay(),
            0.1);
  EXPECT_EQ(static_cast<torch::optim::AdamWOptions&>(groups[1].options())
                .weight_decay(),
            0.0);
  EXPECT_EQ(static_cast<torch::optim::AdamWOptions&>(groups[1].options()).lr(),
            1e-3);
  const auto& masters = step.master_weights()->master_params();
  for (const auto& group : groups) {
    for (const auto& p : group.params()) {
      EXPECT_EQ(p.scalar_type(), torch::kFloat);
      bool is_master = false;
      for (const auto& m : masters) {
        is_master = is_master || p.is_same(m);
      }
      EXPECT_TRUE(is_master);
    }
  }
  EXPECT_NE(lamp_test::error_of([&] {
              lamp::optim::decay_groups(model->named_parameters(), {"nope"},
                                        defaults);
            }).find("'nope' is not among the 19 parameters given"),
            std::string::npos);
}

TEST(WarmupCosine, WarmsUpLinearlyThenDecaysToTheFloor) {
  using lamp::training::warmup_cosine_lr;
  // 10 warm-up steps of 110, peak 1, floor 0.1.
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1.0, 0, 10, 110, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1.0, 4, 10, 110, 0.1), 0.5);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1.0, 9, 10, 110, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1.0, 10, 10, 110, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1.0, 60, 10, 110, 0.1), 0.55); // halfway
  EXPECT_NEAR(warmup_cosine_lr(1.0, 109, 10, 110, 0.1),
              0.1 + 0.45 * (1 + std::cos(M_PI * 99 / 100)), 1e-15);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1.0, 110, 10, 110, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1.0, 500, 10, 110, 0.1), 0.1);
  // No warm-up: the cosine from the first step.
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(2.0, 0, 0, 4), 2.0);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(2.0, 2, 0, 4), 1.0);
  EXPECT_NE(lamp_test::error_of([] {
              warmup_cosine_lr(1.0, 0, 10, 10);
            }).find("0 <= warmup_steps < total_steps"),
            std::string::npos);
  EXPECT_NE(lamp_test::error_of([] {
              warmup_cosine_lr(1.0, 0, 1, 10, 2.0);
            }).find("min_lr must be in [0, peak_lr = 1], got 2"),
            std::string::npos);
}

} // namespace
