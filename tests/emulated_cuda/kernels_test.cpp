// lamp's CUDA kernels, run on the CPU by the CUDA emulator
// (tests/emulated_cuda), against the same references their _CUDA tests
// compare them with on a GPU. Each test builds the kernel's arguments as
// its launcher in src/ (add_norm_cuda.cpp, channel_affine_cuda.cpp,
// float8_cast_cuda.cpp, float8_scale_cuda.cpp) builds them from tensors,
// with the device's multiprocessor count among the cases (132 on an H200,
// and a few, so that blocks stride over several rows or tiles). Outputs are
// written between guard bytes that must come back untouched.
//
// What this cannot show: the GPU's own rounding where nvcc contracts a
// multiply and an add (the tolerances below are the _CUDA tests'), races
// between blocks and lost updates, speed, and the launchers' CUDA calls;
// the _CUDA tests stay owed to a GPU (docs/testing.md, "CUDA kernels on the
// CPU").
#include "emulated_cuda/kernels.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernel_checks.h"
#include "lamp/nn/float8.h"
#include "lamp/ops/add_norm.h"
#include "nn/float8_internal.h"
#include "ops/channel_affine.h"
#include "platform/compat.h"
#include "test_util.h"

namespace {

namespace K = lamp_emulated::detail::kernels;
using lamp_test::AllClose;
using lamp_test::BitEqual;
using lamp_test::expect_norm_outputs_close;
using lamp_test::NormOutputs;
using lamp_test::SumsAgree;

// The multiprocessor counts the launchers size their grids by: an H200's,
// and a small device's (blocks then stride over more rows and tiles).
constexpr int64_t kMultiprocessors[] = {132, 2};

K::Dtype code(torch::Dtype dtype) {
  return dtype == torch::kHalf       ? K::Dtype::kHalf
         : dtype == torch::kBFloat16 ? K::Dtype::kBFloat16
                                     : K::Dtype::kFloat;
}

// An output between 64 guard bytes on each side (64: the body keeps the
// allocation's 16-byte alignment, which the vectorized kernels rely on).
class Guarded {
 public:
  Guarded(std::vector<int64_t> shape, torch::Dtype dtype,
          torch::MemoryFormat format = torch::MemoryFormat::Contiguous) {
    const auto like = torch::empty(shape, torch::dtype(dtype), format);
    const int64_t bytes = like.numel() * like.element_size();
    whole_ = torch::full({bytes + 2 * kGuard}, kPattern, torch::kByte);
    auto flat = whole_.narrow(0, kGuard, bytes).view(dtype);
    if (format == torch::MemoryFormat::ChannelsLast) {
      body_ = flat.view({shape[0], shape[2], shape[3], shape[1]})
                  .permute({0, 3, 1, 2});
    } else {
      body_ = flat.view(shape);
    }
  }
  const torch::Tensor& tensor() const { return body_; }
  void* data() const { return body_.data_ptr(); }
  /// The guard bytes are as written.
  ::testing::AssertionResult Intact() const {
    const int64_t n = whole_.numel();
    const auto head = whole_.narrow(0, 0, kGuard);
    const auto tail = whole_.narrow(0, n - kGuard, kGuard);
    if (head.eq(kPattern).all().item<bool>() &&
        tail.eq(kPattern).all().item<bool>()) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "the kernel wrote outside its output";
  }

 private:
  static constexpr int64_t kGuard = 64;
  static constexpr int kPattern = 0xa5;
  torch::Tensor whole_, body_;
};

// The launch succeeded (else its message).
::testing::AssertionResult Launched(cudaError_t error) {
  if (error == cudaSuccess) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "error " << static_cast<int>(error) << ": "
         << lamp_emu::last_launch_message();
}

// ---------------------------------------------------------------------------
// The conv level's per-channel elementwise kernel and its gated sums.

using lamp::detail::ChannelAffine;

torch::Tensor nhwc(const torch::Tensor& t, torch::Dtype dtype) {
  return t.to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
}

// The kernel on `op`, as channel_affine_kernel() calls it, with a grid of at
// most `max_blocks` (the launcher's: 8 a multiprocessor).
torch::Tensor emulated_channel_affine(const ChannelAffine& op,
                                      const torch::Tensor& like, int max_blocks,
                                      bool* vectorized = nullptr) {
  Guarded out(like.sizes().vec(), like.scalar_type(),
              torch::MemoryFormat::ChannelsLast);
  const auto data = [](const torch::Tensor& t) -> const void* {
    return t.defined() ? t.data_ptr() : nullptr;
  };
  const auto floats = [](const torch::Tensor& t) -> const float* {
    return t.defined() ? t.data_ptr<float>() : nullptr;
  };
  K::ChannelAffineArgs a;
  a.u = data(op.u);
  a.gate = data(op.gate);
  a.u_scale = floats(op.u_scale);
  a.u_shift = floats(op.u_shift);
  a.v = data(op.v);
  a.v_scale = floats(op.v_scale);
  a.v_shift = floats(op.v_shift);
  a.relu = op.relu;
  a.out = out.data();
  a.channels = like.size(1);
  a.rows = like.numel() / a.channels;
  a.dtype = code(like.scalar_type());
  a.vectorized = K::channel_affine_vectorizable(a);
  a.max_blocks = max_blocks;
  if (vectorized != nullptr) {
    *vectorized = a.vectorized;
  }
  EXPECT_TRUE(Launched(K::channel_affine(a, nullptr)));
  EXPECT_TRUE(out.Intact());
  return out.tensor();
}

TEST(EmulatedChannelAffine, EveryFormMatchesTheReferenceToTheBit) {
  // Every subset of the eight steps, in each dtype, at 64 channels (16-byte
  // loads in every dtype), 12 (in FP32 only) and 3 (one value at a time),
  // over 2 x 7 x 5 pixels (an odd count). Special values in u, v and the
  // gate: a NaN and an infinity pass through the steps as ATen's ops pass
  // them; a NaN gate zeroes its value.
  int vectorized_runs = 0, runs = 0;
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const int64_t channels : {64, 12, 3}) {
      torch::manual_seed(channels);
      const std::vector<int64_t> shape = {2, channels, 7, 5};
      auto u = torch::randn(shape) * 3 + 0.5;
      auto gate = torch::randn(shape).relu() *
                  (torch::rand(shape) > 0.2).to(torch::kFloat);
      auto v = torch::randn(shape);
      u.view(-1)[5] = NAN;
      u.view(-1)[17] = INFINITY;
      v.view(-1)[23] = -INFINITY;
      gate.view(-1)[29] = NAN;
      const auto per_channel = [&](double spread, double mid) {
        return (mid + spread * torch::randn({channels})).contiguous();
      };
      const auto u_scale = per_channel(0.3, 1.0);
      const auto u_shift = per_channel(0.2, 0.0);
      const auto v_scale = per_channel(0.3, 1.0);
      const auto v_shift = per_channel(0.2, 0.0);
      const auto like = nhwc(u, dtype);
      for (int subset = 0; subset < 256; ++subset) {
        ChannelAffine op;
        const auto has = [&](int bit) { return (subset >> bit & 1) != 0; };
        op.u = has(0) ? nhwc(u, dtype) : torch::Tensor();
        op.gate = has(1) ? nhwc(gate, dtype) : torch::Tensor();
        op.u_scale = has(2) ? u_scale : torch::Tensor();
        op.u_shift = has(3) ? u_shift : torch::Tensor();
        op.v = has(4) ? nhwc(v, dtype) : torch::Tensor();
        op.v_scale = has(5) ? v_scale : torch::Tensor();
        op.v_shift = has(6) ? v_shift : torch::Tensor();
        op.relu = has(7);
        SCOPED_TRACE(std::string(c10::toString(dtype)) + ", " +
                     std::to_string(channels) + " channels, steps " +
                     std::to_string(subset));
        const auto want = lamp::detail::channel_affine_reference(op, like);
        // An H200's grid, and one block striding over every value.
        for (const int max_blocks : {K::channel_affine_max_blocks(132), 1}) {
          bool vectorized = false;
          const auto got =
              emulated_channel_affine(op, like, max_blocks, &vectorized);
          EXPECT_TRUE(BitEqual(got, want));
          vectorized_runs += vectorized ? 1 : 0;
          ++runs;
        }
      }
    }
  }
  // Both of the kernel's forms ran: 64 channels in every dtype and 12 in
  // FP32 take 16-byte loads (4 of the 9 shapes), the rest one value at a
  // time.
  EXPECT_EQ(vectorized_runs, runs * 4 / 9);
}

TEST(EmulatedChannelAffine, MisalignedTensorsRunOneValueAtATime) {
  // u two bytes past a 16-byte boundary: the launcher asks for the scalar
  // form, which must give the same bits.
  const std::vector<int64_t> shape = {2, 64, 4, 4};
  torch::manual_seed(4);
  const auto u = nhwc(torch::randn(shape), torch::kHalf);
  auto buffer = torch::empty({u.numel() + 1}, u.options());
  auto shifted = buffer.narrow(0, 1, u.numel())
                     .view({shape[0], shape[2], shape[3], shape[1]})
                     .permute({0, 3, 1, 2});
  shifted.copy_(u);
  ChannelAffine op;
  op.u = shifted;
  op.u_scale = torch::rand({64}) + 0.5;
  op.relu = true;
  bool vectorized = true;
  const auto got = emulated_channel_affine(
      op, u, K::channel_affine_max_blocks(132), &vectorized);
  EXPECT_FALSE(vectorized);
  EXPECT_TRUE(BitEqual(got, lamp::detail::channel_affine_reference(op, u)));
}

TEST(EmulatedChannelAffine, GatedSumsMatchTheReference) {
  // 3, 64 and 320 channels (a partial warp, and more channels than
  // threads), rows shared among the blocks unevenly; with and without the
  // gate and the two products.
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const int64_t channels : {3, 64, 320}) {
      torch::manual_seed(6 + channels);
      const std::vector<int64_t> shape = {4, channels, 9, 7};
      const auto u = nhwc(torch::randn(shape), dtype);
      const auto gate = nhwc(torch::randn(shape).relu() *
                                 (torch::rand(shape) > 0.2).to(torch::kFloat),
                             dtype);
      const auto a = nhwc(torch::randn(shape) * 3 + 0.5, dtype);
      const auto b = nhwc(torch::randn(shape).relu(), dtype);
      const int64_t rows = u.numel() / channels;
      for (const bool gated : {true, false}) {
        // None, a alone, a and b.
        for (const int products : {0, 1, 2}) {
          for (const int64_t sms : kMultiprocessors) {
            SCOPED_TRACE(std::string(c10::toString(dtype)) + ", " +
                         std::to_string(channels) + " channels, " +
                         (gated ? "gated" : "ungated") + ", " +
                         std::to_string(products) + " products, " +
                         std::to_string(sms) + " multiprocessors");
            const auto first = products >= 1 ? a : torch::Tensor();
            const auto second = products == 2 ? b : torch::Tensor();
            K::GatedSumsArgs args;
            args.u = u.data_ptr();
            args.gate = gated ? gate.data_ptr() : nullptr;
            args.a = first.defined() ? first.data_ptr() : nullptr;
            args.b = second.defined() ? second.data_ptr() : nullptr;
            args.channels = channels;
            args.rows = rows;
            args.dtype = code(dtype);
            args.blocks = K::gated_sums_blocks(rows, static_cast<int>(sms));
            Guarded partial({args.blocks, 3, channels}, torch::kFloat);
            Guarded sums({3, channels}, torch::kFloat);
            args.partial = static_cast<float*>(partial.data());
            args.sums = static_cast<float*>(sums.data());
            ASSERT_TRUE(Launched(K::gated_sums(args, nullptr)));
            EXPECT_TRUE(partial.Intact());
            EXPECT_TRUE(sums.Intact());
            const auto g = gated ? gate : torch::Tensor();
            const auto want =
                lamp::detail::gated_sums_reference(u, g, first, second);
            const auto f = [](const torch::Tensor& t) {
              return t.to(torch::kFloat).abs();
            };
            const auto gabs =
                gated ? at::threshold_backward(f(u), f(gate), 0) : f(u);
            const auto got = sums.tensor();
            EXPECT_TRUE(SumsAgree(got[0], want.g, gabs.sum({0, 2, 3})));
            // A product left out sums to 0.
            if (first.defined()) {
              EXPECT_TRUE(
                  SumsAgree(got[1], want.ga, (gabs * f(a)).sum({0, 2, 3})));
            } else {
              EXPECT_TRUE(got[1].eq(0).all().item<bool>());
            }
            if (second.defined()) {
              EXPECT_TRUE(
                  SumsAgree(got[2], want.gb, (gabs * f(b)).sum({0, 2, 3})));
            } else {
              EXPECT_TRUE(got[2].eq(0).all().item<bool>());
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The residual add + LayerNorm/RMSNorm kernels.

using lamp::ops::AddNormOptions;
using lamp::ops::AddNormResult;

struct NormInputs {
  torch::Tensor x, branch, weight, bias, grad_sum, grad_normed;
};

// The reference's outputs and gradients, the loss sum(s * grad_sum) +
// sum(y * grad_normed).
NormOutputs reference(const NormInputs& in, bool rms, torch::Dtype normed) {
  const auto leaf = [](const torch::Tensor& t) {
    return t.defined() ? t.detach().clone().requires_grad_() : torch::Tensor();
  };
  auto x = leaf(in.x), branch = leaf(in.branch), weight = leaf(in.weight),
       bias = leaf(in.bias);
  const auto o = AddNormOptions().output_dtype(normed);
  const auto r =
      rms ? lamp::ops::add_rms_norm_reference(x, branch, weight, o)
          : lamp::ops::add_layer_norm_reference(x, branch, weight, bias, o);
  auto loss = torch::zeros({});
  if (in.grad_sum.defined()) {
    loss = loss + (r.sum.to(torch::kFloat) * in.grad_sum).sum();
  }
  if (in.grad_normed.defined()) {
    loss = loss + (r.normed.to(torch::kFloat) * in.grad_normed).sum();
  }
  loss.backward();
  // A tensor the loss does not reach gets zeros, as the kernel gives it.
  const auto grad = [](const torch::Tensor& t) {
    if (!t.defined()) {
      return torch::Tensor();
    }
    return t.grad().defined() ? t.grad() : torch::zeros_like(t);
  };
  return {r.sum.detach(), r.normed.detach(),
          grad(x),        grad(branch),
          grad(weight),   rms ? torch::Tensor() : grad(bias)};
}

// A LayerNorm of rows of one value, exactly: each value is its row's mean,
// so the normalized output is the bias (or 0), the norm passes no gradient
// back (the sum's gradient is its own alone) and the weight gets none. The
// GPU's reference gives these; the CPU's FP32 layer_norm leaves its own
// rounding of x * rstd - mean * rstd, with rstd = 1 / sqrt(eps) (up to 8e-5
// here, far above the bounds).
NormOutputs exact_width_one(const NormInputs& in, torch::Dtype normed,
                            const NormOutputs& reference) {
  const auto sum_dtype =
      at::promote_types(in.x.scalar_type(), in.branch.scalar_type());
  const int64_t rows = in.x.size(0);
  const auto grad_sum = in.grad_sum.to(sum_dtype);
  NormOutputs out;
  out.sum = reference.sum;
  out.normed = in.bias.defined() ? in.bias.expand({rows, 1}).to(normed)
                                 : torch::zeros({rows, 1}, normed);
  out.x = grad_sum.to(in.x.scalar_type());
  out.branch = grad_sum.to(in.branch.scalar_type());
  if (in.weight.defined()) {
    out.weight = torch::zeros({1});
    out.bias = in.grad_normed.to(normed).to(torch::kFloat).sum(0);
  }
  return out;
}

// The kernels, as add_norm_kernel_forward() and add_norm_kernel_backward()
// call them, with `backward_blocks` blocks in the backward; the gradients
// in the dtypes AddNormFunction hands autograd (x's, the branch's, FP32's
// weight and bias).
NormOutputs emulated(const NormInputs& in, bool rms, torch::Dtype normed,
                     int64_t backward_blocks) {
  const auto sum_dtype =
      at::promote_types(in.x.scalar_type(), in.branch.scalar_type());
  const auto xs = in.x.to(sum_dtype).contiguous();
  const auto branch = in.branch.contiguous();
  const int64_t rows = xs.size(0), width = xs.size(1);
  Guarded sum({rows, width}, sum_dtype);
  Guarded y({rows, width}, normed);
  Guarded mean({rows}, torch::kFloat);
  Guarded rstd({rows}, torch::kFloat);
  K::AddNormForwardArgs f;
  f.x = xs.data_ptr();
  f.branch = branch.data_ptr();
  f.weight = in.weight.defined() ? in.weight.data_ptr<float>() : nullptr;
  f.bias = !rms && in.bias.defined() ? in.bias.data_ptr<float>() : nullptr;
  f.sum = sum.data();
  f.normed = y.data();
  f.mean = static_cast<float*>(mean.data());
  f.rstd = static_cast<float*>(rstd.data());
  f.rows = rows;
  f.width = width;
  f.eps = 1e-5f;
  f.rms = rms;
  f.sum_dtype = code(sum_dtype);
  f.branch_dtype = code(branch.scalar_type());
  f.normed_dtype = code(normed);
  EXPECT_TRUE(Launched(K::add_norm_forward(f, nullptr)));
  for (const auto* g : {&sum, &y, &mean, &rstd}) {
    EXPECT_TRUE(g->Intact());
  }

  // An output's gradient that autograd leaves undefined is null, as the
  // launcher passes it.
  const auto gy = in.grad_normed.defined()
                      ? in.grad_normed.to(normed).contiguous()
                      : torch::Tensor();
  const auto gs = in.grad_sum.defined() ? in.grad_sum.to(sum_dtype).contiguous()
                                        : torch::Tensor();
  const bool want_bias = !rms && in.bias.defined();
  Guarded grad_x({rows, width}, sum_dtype);
  Guarded grad_branch({rows, width}, branch.scalar_type());
  Guarded grad_weight({width}, torch::kFloat);
  Guarded grad_bias({width}, torch::kFloat);
  auto partial_weight = torch::zeros({backward_blocks, width});
  auto partial_bias = torch::zeros({backward_blocks, width});
  K::AddNormBackwardArgs b;
  b.grad_normed = gy.defined() ? gy.data_ptr() : nullptr;
  b.grad_sum = gs.defined() ? gs.data_ptr() : nullptr;
  b.sum = sum.data();
  b.weight = f.weight;
  b.mean = f.mean;
  b.rstd = f.rstd;
  b.grad_x = grad_x.data();
  b.grad_branch = grad_branch.data();
  b.partial_weight =
      in.weight.defined() ? partial_weight.data_ptr<float>() : nullptr;
  b.partial_bias = want_bias ? partial_bias.data_ptr<float>() : nullptr;
  b.grad_weight =
      in.weight.defined() ? static_cast<float*>(grad_weight.data()) : nullptr;
  b.grad_bias = want_bias ? static_cast<float*>(grad_bias.data()) : nullptr;
  b.rows = rows;
  b.width = width;
  b.blocks = static_cast<int>(backward_blocks);
  b.rms = rms;
  b.sum_dtype = f.sum_dtype;
  b.branch_dtype = f.branch_dtype;
  b.normed_dtype = gy.defined() ? code(normed) : K::Dtype::kFloat;
  EXPECT_TRUE(Launched(K::add_norm_backward(b, nullptr)));
  for (const auto* g : {&grad_x, &grad_branch, &grad_weight, &grad_bias}) {
    EXPECT_TRUE(g->Intact());
  }
  return {sum.tensor().clone(),
          y.tensor().clone(),
          grad_x.tensor().to(in.x.scalar_type()),
          grad_branch.tensor().clone(),
          in.weight.defined() ? grad_weight.tensor().clone() : torch::Tensor(),
          want_bias ? grad_bias.tensor().clone() : torch::Tensor()};
}

TEST(EmulatedAddNorm, KernelsMatchTheReference) {
  // add_norm_test.cpp's KernelMatchesTheStockOps_CUDA: its dtypes, widths
  // (one, odd, a GPT's, past the 512 threads a row takes) and bounds (one
  // rounding of the narrowest dtype, relative to the largest entry), at 1
  // and 37 rows, the backward in 1 block, 3 (rows strided over) and the
  // launcher's count (one a row here); with and without the weight and the
  // bias. A LayerNorm of width 1 against its exact result
  // (exact_width_one). Beyond the _CUDA test's dtypes: an FP16 sum with an
  // FP32 output, autocast's LayerNorm in FP16 amp.
  struct Case {
    torch::Dtype x, branch, normed;
    double rtol;
  };
  const std::vector<Case> cases = {
      {torch::kFloat, torch::kFloat, torch::kFloat, 1e-5},
      {torch::kFloat, torch::kBFloat16, torch::kBFloat16, 1.0 / 128},
      {torch::kBFloat16, torch::kBFloat16, torch::kBFloat16, 1.0 / 128},
      {torch::kHalf, torch::kHalf, torch::kHalf, 1.0 / 1024},
      {torch::kFloat, torch::kHalf, torch::kHalf, 1.0 / 1024},
      {torch::kHalf, torch::kHalf, torch::kFloat, 1.0 / 1024}};
  for (const auto& c : cases) {
    for (const int64_t width : {1, 7, 384, 1000, 4097}) {
      for (const int64_t rows : {1, 37}) {
        for (const bool affine : {true, false}) {
          torch::manual_seed(width + rows);
          NormInputs in;
          in.x = (torch::randn({rows, width}) * 2 + 0.5).to(c.x);
          in.branch = torch::randn({rows, width}).to(c.branch);
          if (affine) {
            in.weight = 1 + 0.1 * torch::randn({width});
            in.bias = 0.1 * torch::randn({width});
          }
          in.grad_sum = torch::randn({rows, width});
          in.grad_normed = torch::randn({rows, width});
          for (const bool rms : {false, true}) {
            auto want = reference(in, rms, c.normed);
            if (width == 1 && !rms) {
              want = exact_width_one(in, c.normed, want);
            }
            // 1 and 3 blocks, and the launcher's count on an H200.
            for (const int64_t blocks :
                 {int64_t{1}, int64_t{3},
                  K::add_norm_backward_blocks(rows, 132)}) {
              if (blocks > rows) {
                continue;
              }
              SCOPED_TRACE(std::string(c10::toString(c.x)) + "+" +
                           c10::toString(c.branch) + " -> " +
                           c10::toString(c.normed) + ", width " +
                           std::to_string(width) + ", rows " +
                           std::to_string(rows) + (rms ? ", RMSNorm" : "") +
                           (affine ? "" : ", no weight or bias") + ", " +
                           std::to_string(blocks) + " backward blocks");
              expect_norm_outputs_close(emulated(in, rms, c.normed, blocks),
                                        want, c.rtol, "");
            }
          }
        }
      }
    }
  }
}

TEST(EmulatedAddNorm, BackwardWithOneOutputsGradient) {
  // The sum or the normalized output outside the loss: autograd hands the
  // backward one undefined gradient, which the launcher passes as null.
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const int64_t width : {7, 384}) {
      for (const bool rms : {false, true}) {
        for (const bool use_sum : {false, true}) {
          SCOPED_TRACE(std::string(c10::toString(dtype)) + ", width " +
                       std::to_string(width) + (rms ? ", RMSNorm" : "") +
                       (use_sum ? ", the sum's gradient alone"
                                : ", the output's gradient alone"));
          torch::manual_seed(width);
          const int64_t rows = 37;
          NormInputs in;
          in.x = (torch::randn({rows, width}) * 2 + 0.5).to(dtype);
          in.branch = torch::randn({rows, width}).to(dtype);
          in.weight = 1 + 0.1 * torch::randn({width});
          in.bias = 0.1 * torch::randn({width});
          if (use_sum) {
            in.grad_sum = torch::randn({rows, width});
          } else {
            in.grad_normed = torch::randn({rows, width});
          }
          const double rtol = dtype == torch::kFloat  ? 1e-5
                              : dtype == torch::kHalf ? 1.0 / 1024
                                                      : 1.0 / 128;
          expect_norm_outputs_close(emulated(in, rms, dtype, 3),
                                    reference(in, rms, dtype), rtol, "");
        }
      }
    }
  }
}

#if LAMP_TORCH_FLOAT8
// ---------------------------------------------------------------------------
// The FP8 casts and the delayed recipe's scale update.

namespace F8 = lamp::nn;
namespace I = lamp::nn::internal;
namespace KF = lamp_emulated::nn::kernels;

using lamp_test::delayed_recipe;
using lamp_test::expect_same_states;
using lamp_test::ScaleUpdateLayers;
using lamp_test::see_both;

// The one-pass cast, as fused_cast_operand() calls it.
I::Cast emulated_cast(const torch::Tensor& t, const I::OperandState& s,
                      bool delayed_scaling, int64_t margin, torch::Dtype dtype,
                      bool transpose, int64_t multiprocessors) {
  const auto input = t.contiguous();
  Guarded data(input.sizes().vec(), dtype);
  std::unique_ptr<Guarded> transposed;
  if (transpose) {
    transposed = std::make_unique<Guarded>(
        std::vector<int64_t>{input.size(1), input.size(0)}, dtype);
  }
  auto inverse_scale = torch::empty({});
  auto cast_scale = torch::empty({});
  const int64_t blocks = KF::float8_cast_blocks(input.numel(), multiprocessors);
  auto partial = torch::empty({blocks}, torch::kInt);
  auto done = torch::zeros({1}, torch::kInt);
  KF::Float8CastArgs a;
  a.input = input.data_ptr();
  a.numel = input.numel();
  a.source = input.scalar_type() == torch::kHalf ? KF::Float8Source::kHalf
             : input.scalar_type() == torch::kBFloat16
                 ? KF::Float8Source::kBFloat16
                 : KF::Float8Source::kFloat;
  a.output = data.data();
  a.format = dtype == c10::ScalarType::Float8_e5m2 ? KF::Float8Format::kE5M2
                                                   : KF::Float8Format::kE4M3;
  const double max = F8::detail::float8_max(dtype);
  a.max = static_cast<float>(max);
  a.saturated_above = static_cast<float>(max * I::kSaturationSlack);
  a.max_over_margin = KF::float8_max_over_margin(max, margin);
  a.delayed = delayed_scaling;
  a.scale = s.scale.data_ptr<float>();
  a.cast_scale = cast_scale.data_ptr<float>();
  a.pending_amax = s.pending_amax.data_ptr<float>();
  a.saturated = s.saturated.data_ptr<float>();
  a.non_finite = s.non_finite.data_ptr<float>();
  a.last_scale = s.last_scale.data_ptr<float>();
  a.casts = s.casts.data_ptr<float>();
  a.inverse_scale = inverse_scale.data_ptr<float>();
  a.partial_amax = reinterpret_cast<unsigned*>(partial.data_ptr<int>());
  a.blocks_done = reinterpret_cast<unsigned*>(done.data_ptr<int>());
  a.blocks = static_cast<int>(blocks);
  if (transpose) {
    a.transposed = transposed->data();
    a.rows = input.size(0);
    a.cols = input.size(1);
  }
  EXPECT_TRUE(Launched(KF::float8_cast(a, nullptr)));
  EXPECT_TRUE(data.Intact());
  if (transpose) {
    EXPECT_TRUE(transposed->Intact());
  }
  return {data.tensor(), inverse_scale,
          transpose ? transposed->tensor() : torch::Tensor()};
}

TEST(EmulatedFloat8, CastMatchesTheATenCast) {
  // float8_test.cpp's FusedCastMatchesTheATenCast_CUDA on the CPU's ATen
  // ops: both recipes, three sources, both formats, with and without the
  // transpose, an infinity or a NaN in the tensor; shapes of a partial
  // tile, a single row and several tiles a block.
  const auto as_float = [](const torch::Tensor& fp8) {
    return fp8.to(torch::kFloat);
  };
  for (const bool delayed_scaling : {false, true}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      for (const auto& shape : std::vector<std::vector<int64_t>>{
               {16, 16}, {37, 48}, {1, 7}, {130, 300}}) {
        for (const char* special : {"", "inf", "nan"}) {
          for (const int64_t sms : kMultiprocessors) {
            SCOPED_TRACE(
                std::string(delayed_scaling ? "delayed " : "current ") +
                c10::toString(dtype) + " " + std::to_string(shape[0]) + "x" +
                std::to_string(shape[1]) + " " + special + ", " +
                std::to_string(sms) + " multiprocessors");
            torch::manual_seed(shape[0] + shape[1]);
            auto t = (torch::randn(shape) * 3).to(dtype);
            if (std::string(special) == "inf") {
              t.view(-1)[t.numel() / 2] = INFINITY;
            } else if (std::string(special) == "nan") {
              t.view(-1)[t.numel() / 3] = NAN;
            }
            const auto recipe =
                delayed_scaling ? delayed_recipe(4) : F8::Float8Recipe();
            auto a = F8::Float8State(recipe, "aten");
            auto f = F8::Float8State(recipe, "emulated");
            // A delayed scale that makes a few values saturate.
            a->scale.fill_(100.0f);
            f->scale.fill_(100.0f);
            for (const auto fmt : {c10::ScalarType::Float8_e4m3fn,
                                   c10::ScalarType::Float8_e5m2}) {
              for (const bool transpose : {false, true}) {
                SCOPED_TRACE(std::string(c10::toString(fmt)) +
                             (transpose ? ", with its transpose" : ""));
                const auto want =
                    I::cast_operand(t, I::operand_state(*a, 0), delayed_scaling,
                                    1, fmt, false, transpose);
                const auto got =
                    emulated_cast(t, I::operand_state(*f, 0), delayed_scaling,
                                  1, fmt, transpose, sms);
                EXPECT_TRUE(
                    AllClose(as_float(got.data), as_float(want.data), 0, 0));
                if (transpose) {
                  EXPECT_TRUE(AllClose(as_float(got.transposed),
                                       as_float(want.transposed), 0, 0));
                }
                EXPECT_TRUE(BitEqual(got.inverse_scale, want.inverse_scale));
                EXPECT_TRUE(BitEqual(f->counters, a->counters));
                EXPECT_TRUE(BitEqual(f->pending_amax, a->pending_amax));
              }
            }
          }
        }
      }
    }
  }
}

// The update on the kernel, as fused_update_scales() calls it.
void emulated_update(const std::vector<F8::Float8State>& states) {
  KF::Float8ScaleArgs args;
  const auto launch = [&] {
    EXPECT_TRUE(Launched(KF::float8_update_scales(args, nullptr)));
    args.count = 0;
  };
  for (const auto& state : states) {
    const auto& recipe = state->recipe();
    args.layers[args.count++] = KF::scale_layer(
        state->amax_history.data_ptr<float>(),
        state->pending_amax.data_ptr<float>(), state->scale.data_ptr<float>(),
        static_cast<int>(state->amax_history.size(1)),
        recipe.amax_compute() == F8::Float8AmaxCompute::kMax, recipe.margin());
    if (args.count == KF::kScaleLayersPerLaunch) {
      launch();
    }
  }
  if (args.count > 0) {
    launch();
  }
}

TEST(EmulatedFloat8, ScaleUpdateMatchesTheATenOps) {
  // float8_test.cpp's FusedScaleUpdateMatchesTheATenOps_CUDA: 70 layers
  // (two launches), the last with the longest history the kernel takes,
  // five steps, the states bit for bit against update_float8_scales()'s
  // ATen ops (tests/kernel_checks.h's ScaleUpdateLayers).
  const int64_t longest = KF::float8_scale_update_max_history();
  ASSERT_EQ(longest, 12224);
  const torch::Device cpu(torch::kCPU);
  ScaleUpdateLayers plain(70, false, cpu, 11, longest);
  ScaleUpdateLayers emulated_layers(70, false, cpu, 11, longest);
  for (int64_t step = 0; step < 5; ++step) {
    see_both(plain, emulated_layers, 200 + step, step);
    F8::update_float8_scales(plain);
    emulated_update(emulated_layers.states);
    expect_same_states(plain, emulated_layers, c10::str("step ", step));
  }
}

TEST(EmulatedFloat8, ScaleUpdatePastItsLongestHistoryWouldNotLaunch) {
  // The bound float8_scale_update_max_history() keeps under: the history's
  // FP32 columns in dynamic shared memory beside block_reduce's 36 static
  // bytes, at most 48 KiB a block. In the emulator's count (no padding
  // between the two) 12,279 columns fit and 12,280 do not; a GPU that
  // aligns the dynamic window may take a few columns fewer, which the 256
  // bytes the kernel keeps for its static memory cover (12,224 columns).
  ScaleUpdateLayers fits(1, false, torch::kCPU, 3, 12279);
  fits.see(0);
  emulated_update(fits.states);
  ScaleUpdateLayers too_long(1, false, torch::kCPU, 3, 12280);
  too_long.see(0);
  KF::Float8ScaleArgs args;
  auto& layer = args.layers[args.count++];
  const auto& state = *too_long.states.front();
  layer.history = state.amax_history.data_ptr<float>();
  layer.pending = state.pending_amax.data_ptr<float>();
  layer.scale = state.scale.data_ptr<float>();
  layer.history_len = 12280;
  EXPECT_EQ(KF::float8_update_scales(args, nullptr),
            cudaErrorInvalidConfiguration);
  EXPECT_NE(lamp_emu::last_launch_message().find(
                "49156 bytes of shared memory (49120 dynamic)"),
            std::string::npos)
      << lamp_emu::last_launch_message();
}
#else
TEST(EmulatedFloat8, NeedsALibTorchWithFP8) {
  GTEST_SKIP() << "this LibTorch has no FP8 dtypes: the FP8 kernels' "
                  "emulated tests run with LibTorch 2.5 and later";
}
#endif // LAMP_TORCH_FLOAT8

} // namespace
